"""Global-batch gradient aggregation and async SGD on a parameter server (docs/design.md §8): the math, the server,
and the training loops in one process (emulated time) and across processes (for real)."""
