"""Cluster jobs: profiles, plans with preflight checks, job scripts, submit/race/watch.

The flow (see docs/clusters.md):

    ClusterProfile + Shape + Workload
      -> plan.make_plan()             rank table, checks, segments (pure)
      -> slurm.render() / sge.render() job script text (pure, golden-tested)
      -> adapters.Scheduler           sbatch/qsub/squeue/qdel...: the only code that shells out
      -> jobs.json in RUN_DIR          what was submitted; status/logs/cancel read it back
"""
