"""Studies: a sweep of runs defined once (YAML or ``--axis`` flags), planned, run on this machine or
submitted as job arrays, followed and collected from files in the sweep directory."""
