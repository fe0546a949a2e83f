"""Research measurements outside the package: each a ``python -m benchmarks.NAME`` module."""
