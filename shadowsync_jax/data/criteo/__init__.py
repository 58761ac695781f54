"""Criteo click logs as TSV: the parser, malformed lines, input files and days, the TSV source, the generator."""
