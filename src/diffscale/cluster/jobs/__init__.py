"""Jobs once planned: the scheduler adapters (the only code that runs sbatch/qsub and friends),
submission, races and RUN_DIR/jobs.json."""
