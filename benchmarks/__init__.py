"""Benchmarks (`make bench-*`): each measures its peer or ceiling in the same run and prints the ratio."""
