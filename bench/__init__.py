"""Benchmarks (not tests): run with ``python -m bench.queue_bench``."""
