"""Replicas as a leading axis on the devices, and the job of several processes (`jax.distributed`) around them."""
