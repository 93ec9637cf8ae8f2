"""Helpers of benchmarks/bench_fi_peers.py: the shared campaign and the torch runners."""
