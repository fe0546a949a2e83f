"""``diffscale bench``: fast vs plain recipe and scaling, measured side by side (the verb: cli.py)."""
