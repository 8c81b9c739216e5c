"""Benchmarks and workloads for ckpt (opt-in; not part of the default test run)."""
