"""Kernel registry: golden kernels and kernels under test (KUTs)."""
