"""Criteo prepared once: blocks of parsed rows in a tensorflow-datasets dataset (array_record), read by the block."""
