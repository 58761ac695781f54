"""DLRM, its sparsely updated embedding tables, the pure train step, and the optimizers a config names (DESIGN §4)."""
