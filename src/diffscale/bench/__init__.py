"""``diffscale bench``: fast vs plain recipe and scaling, measured side by side (the verb: cli.py).
The research benchmarks (latency, start-up, quality against training time, ...) are not part of
the package: ``benchmarks/`` at the repository root, ``python -m benchmarks.NAME``."""
