"""Cluster jobs: profiles, plans with preflight checks, job scripts, submit/race/status.

The flow (see docs/clusters.md):

    profiles.ClusterProfile (bundled YAML or `cluster discover`, read by profile_io)
      + shape.Shape + workload.DiffscaleRun | UserCommand
      -> plan.make_plan()               rank table, preflight checks, segments (pure)
           estimates + measured.yaml    time and memory (host memory: runtime/resources.py)
      -> slurm.render() / sge.render()  job script text from a jobspec.JobSpec (pure, golden-tested)
      -> submit / race                  write the scripts, submit each shape's segments
      -> scheduler.Scheduler            sbatch/qsub/squeue/qdel...: the only module here that runs them
      -> jobs.json in RUN_DIR (jobs)    what was submitted; status/logs/cancel read it back

cli.py holds the verbs (plan, submit, status, logs, cancel, cluster) and report.py their
tables; `cluster discover` (discover.py) parses what scheduler.run reports. Outside this
package, the doctor (diffscale.doctor.sources) also runs scontrol/sacct/qacct to read a
job's records.
"""
