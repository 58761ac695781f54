"""The click stream: the `Batch` every part agrees on, the synthetic teacher stream, Criteo TSV, the input pipeline."""
