"""DLRM, its sparsely updated embedding tables, the pure train step, the configured optimizers (docs/design.md §4)."""
