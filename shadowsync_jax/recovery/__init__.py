"""Checkpoints and failures (DESIGN §7, CPR): orbax checkpointing, emulated failures, checkpoint intervals, row usage
and priority saves, and partial or full recovery."""
