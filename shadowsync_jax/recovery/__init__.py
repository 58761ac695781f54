"""Checkpoints and failures (docs/design.md §7, CPR): orbax checkpointing, emulated failures, checkpoint intervals,
row usage and priority saves, and partial or full recovery."""
