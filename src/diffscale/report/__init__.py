"""``diffscale report RUN_DIR``: one self-contained HTML page about a run (page.py) and its plots
(plots.py)."""
