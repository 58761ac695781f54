"""Synchronizing the replicas (docs/design.md §3): the pure round math, and the drivers that run it in the foreground
or in a background thread (ShadowSync)."""
