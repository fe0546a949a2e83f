"""``sweep submit``: one array job per distinct job shape, through ``cluster/jobs/scheduler.py``.
Each element's run directory gets its own job script and a jobs.json naming its array task, so
``status``, ``logs``, ``cancel`` and ``doctor`` work on an element as on a single run. With
``failed_only`` only the failed elements are submitted again (a diffscale run resumes from its
newest checkpoint), each array under a new script name, so the scripts of earlier submissions stay.

All or nothing: every array is first shown to the scheduler without submitting it (``sbatch
--test-only``, ``qsub -w v``); should a submission still be refused, the arrays this call
submitted before it are cancelled, and no element is recorded as submitted."""

from __future__ import annotations

import datetime
from dataclasses import replace
from pathlib import Path

from diffscale.cluster.jobs import records as jobs
from diffscale.cluster.jobs.scheduler import for_kind
from diffscale.errors import UserError
from diffscale.io.atomic import write_text
from diffscale.studies.arrays import render, script_name, task_job_id, task_log
from diffscale.studies.plan import ArrayGroup, SweepPlan
from diffscale.studies.state import ElementState, record
from diffscale.studies.status import sweep_states


def chosen(plan: SweepPlan, failed_only: bool) -> set[int]:
    """Elements to submit: the failed ones (``failed_only``), else every one never submitted nor done
    (a run directory made again after it was deleted holds no jobs.json: it is submitted again)."""
    states = {s.index: s for _, s in sweep_states(plan.sweep_dir)}
    if failed_only:
        picked = {i for i, s in states.items() if s.state == "failed"}
        if not picked:
            raise UserError(f"no element of {plan.sweep_dir} has failed",
                            f"see diffscale sweep status {plan.sweep_dir}")
        return picked
    picked = {e.index for e in plan.elements
              if states[e.index].state in ("pending", "stopped") and not jobs.path(e.run_dir).is_file()}
    if not picked:
        raise UserError(f"every element of {plan.sweep_dir} was already submitted or is done",
                        f"see diffscale sweep status {plan.sweep_dir}; resubmit failed ones with --failed")
    return picked


def _write_group(plan: SweepPlan, group: ArrayGroup, picked: set[int]) -> tuple[ArrayGroup, Path] | None:
    """The group narrowed to ``picked``: element scripts written, then the array script."""
    keep = [k for k, e in enumerate(group.elements) if e.index in picked]
    if not keep:
        return None
    narrowed = ArrayGroup(group.label, tuple(group.plans[k] for k in keep), tuple(group.elements[k] for k in keep),
                          replace(group.array, tasks=tuple(group.array.tasks[k] for k in keep)))
    for element_plan in narrowed.plans:
        run_dir = Path(element_plan.workload.run_dir)
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        script = run_dir / element_plan.spec.script_file
        write_text(script, element_plan.script())
        script.chmod(0o755)
    assert plan.profile is not None
    path = plan.sweep_dir / script_name(plan.profile.scheduler, group.label)
    attempt = 1
    while path.exists():  # an earlier submission's script stays as it was
        attempt += 1
        path = plan.sweep_dir / script_name(plan.profile.scheduler, f"{group.label}.{attempt}")
    write_text(path, render(narrowed.array))
    path.chmod(0o755)
    return narrowed, path


def _record(plan: SweepPlan, group: ArrayGroup, array_id: str, now: str) -> None:
    assert plan.profile is not None
    kind = plan.profile.scheduler
    for position, (element, element_plan) in enumerate(zip(group.elements, group.plans, strict=True)):
        job = jobs.JobRecord(job_id=task_job_id(kind, array_id, position), name=group.array.job_name,
                             shape=element_plan.shape.label, partition=element_plan.partition.name,
                             script=element_plan.spec.script_file,
                             log=task_log(kind, group.array.job_name, array_id, position))
        jobs.append(element.run_dir, jobs.Submission(
            scheduler=kind.value, cluster=plan.profile.name, submitted_at=now, run_dir=element.run_dir,
            what=element_plan.workload.title, jobs=(job,),
            extra={"sweep": str(plan.sweep_dir), "array": array_id, "element": element.index}))


def submit_sweep(plan: SweepPlan, *, failed_only: bool) -> int:
    assert plan.profile is not None
    picked = chosen(plan, failed_only)
    scheduler = for_kind(plan.profile.scheduler)
    (plan.sweep_dir / "logs").mkdir(exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    written = [w for group in plan.groups if (w := _write_group(plan, group, picked)) is not None]
    for narrowed, script in written:
        try:
            scheduler.verify(script, plan.sweep_dir)
        except UserError as exc:
            raise UserError(f"shape {narrowed.label} ({script.name}): {exc.cause}; nothing was submitted",
                            exc.fix) from exc
    submitted: list[tuple[ArrayGroup, str, Path]] = []
    for narrowed, script in written:
        try:
            submitted.append((narrowed, scheduler.submit(script, plan.sweep_dir), script))
        except UserError as exc:
            ids = [array_id for _, array_id, _ in submitted]
            if ids:
                scheduler.cancel(ids)
            undone = f"; array job(s) {', '.join(ids)} of this call were cancelled" if ids else ""
            raise UserError(f"shape {narrowed.label} ({script.name}): {exc.cause}{undone}", exc.fix) from exc
    for narrowed, array_id, script in submitted:
        _record(plan, narrowed, array_id, now)
        record(plan.sweep_dir, *(ElementState(e.index, "pending", f"array job {array_id}") for e in narrowed.elements))
        print(f"submitted array job {array_id}: {len(narrowed.elements)} element(s) of shape {narrowed.label} "
              f"({script.name})")
    print(f"follow it: diffscale sweep status {plan.sweep_dir}")
    return 0
