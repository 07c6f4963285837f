"""Benchmarks (scripts with JSON output; never timed unit tests)."""
