"""Job scripts: the typed JobSpec and the pure SLURM / Grid Engine renderers, with the shell parts,
launchers and time formats they share."""
