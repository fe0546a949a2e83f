"""Submit planned jobs: write the scripts into the run directory, submit each shape's
chain of segments (each segment after the previous one; one job that requeues itself with
--no-chain), record everything in jobs.json. A coupled layout (``tied``) submits the
simulation first and holds the trainer until the simulation has started, where the scheduler
can; the simulation's job id goes into its spool (``job.json``), where the trainer finds the
job to ask the scheduler about, and an end marker of an earlier simulation is removed."""

from __future__ import annotations

import datetime
from pathlib import Path

from diffscale.cluster.jobs import records as jobs
from diffscale.cluster.jobs.scheduler import Scheduler
from diffscale.cluster.planning.plan import Plan
from diffscale.data.locations import SPOOL_END_NAME, SPOOL_JOB_NAME
from diffscale.errors import UserError
from diffscale.runtime.job_end import JobRef, write_job_file


def write_scripts(plans: list[Plan], run_dir: Path) -> list[Path]:
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    paths = []
    for plan in plans:
        path = run_dir / plan.spec.script_file
        path.write_text(plan.script())
        path.chmod(0o755)
        paths.append(path)
    return paths


def submit(plans: list[Plan], scheduler: Scheduler, run_dir: Path, *, cluster: str, what: str,
           tied: bool = False) -> jobs.Submission:
    """Submit every plan; ``tied``: the later plans' first jobs wait for the first plan's job to start."""
    scripts = write_scripts(plans, run_dir)
    records: list[jobs.JobRecord] = []
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    keys = tuple(p.spec.race.key if p.spec.race else p.shape.label for p in plans)
    race = keys if len(plans) > 1 and not tied else ()

    def record() -> jobs.Submission:
        sub = jobs.Submission(scheduler=scheduler.kind.value, cluster=cluster, submitted_at=now, run_dir=str(run_dir),
                              what=what, jobs=tuple(records), race=race)
        jobs.append(run_dir, sub)
        return sub

    try:
        for plan, script in zip(plans, scripts, strict=True):
            segments = plan.job_count
            after = records[0].job_id if tied and records and scheduler.starts_after_start else None
            started = after is not None
            spool = Path(plan.spec.end_marker_dir) if plan.spec.end_marker_dir else None
            if spool is not None:  # a new simulation: an earlier one's end is not this one's
                (spool / SPOOL_END_NAME).unlink(missing_ok=True)
            for k in range(1, segments + 1):
                job_id = scheduler.submit(script, run_dir, after=after, started=started)
                if spool is not None:
                    write_job_file(spool / SPOOL_JOB_NAME, JobRef(scheduler.kind.value, job_id))
                records.append(jobs.JobRecord(
                    job_id=job_id, name=plan.spec.job_name, shape=plan.shape.label, partition=plan.partition.name,
                    script=script.name, log=scheduler.log_path(plan.spec.job_name, job_id), segment=k,
                    segments=segments, after=after, role=plan.role,
                    race_key=plan.spec.race.key if plan.spec.race else ""))
                after, started = job_id, False
    except UserError as exc:
        if records:
            record()
            raise UserError(exc.cause, f"{exc.fix}; jobs already submitted are in jobs.json "
                                       f"(`diffscale cancel {run_dir}` removes them)") from exc
        raise
    return record()

