"""Terminal output of the cluster verbs (rich tables). Presentation only: no decisions."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from diffscale.cluster.jobs.records import JobRecord, Submission, owner_words
from diffscale.cluster.jobs.scheduler import JobState
from diffscale.cluster.planning.plan import Plan
from diffscale.cluster.profiles.types import ClusterProfile
from diffscale.cluster.scripts.timefmt import hms, human
from diffscale.io.tables import terminal_width


def _console() -> Console:
    # a terminal's width, or $COLUMNS; piped to a file, wide enough for the rank table
    return Console(width=terminal_width(pipe=160), highlight=False)


def _u(value: object, unit: str = "") -> str:
    return "unknown" if value is None else f"{value:g}{unit}" if isinstance(value, float) else f"{value}{unit}"


def time_limit(plan: Plan, asked: bool) -> str:
    """The wall time the job will run under, and where that figure comes from."""
    from diffscale.cluster.planning.plan import SEGMENT_MARGIN_S

    t, part = plan.spec.time_s, plan.partition
    if t is None and part.default_time:
        return (f"none passed to the scheduler: partition '{part.name}''s default applies, {part.default_time} "
                "(recorded in the profile by cluster discover); pass --time to set one")
    if t is None:
        return (f"none passed to the scheduler: partition '{part.name}''s default applies, which the profile does not "
                "document (on a partition without a maximum the job may run unlimited); pass --time to set one")
    if plan.time_source == "--sim-time":
        return f"{hms(t)} (--sim-time)"
    if plan.time_source:
        return f"{hms(t)}: {plan.time_source}"
    if asked:
        return f"{hms(t)} (--time)"
    if plan.estimate_s is None:
        return f"{hms(t)}: the partition's maximum (diffscale cannot estimate a user command's time; pass --time)"
    if part.max_time_s is not None and t == part.max_time_s:
        return f"{hms(t)}: the partition's maximum (estimated training ~{human(plan.estimate_s)} needs no less)"
    return (f"{hms(t)}: estimated training ~{human(plan.estimate_s)} x 1.2 + {SEGMENT_MARGIN_S // 60} min margin, "
            "rounded up to 15 min")


def print_plan(plan: Plan, *, time_asked: bool) -> None:
    console = _console()
    console.rule(f"job script ({plan.label})")
    # the script verbatim: no markup, no highlighting, so it can be copied as is
    sys.stdout.write(plan.script())
    sys.stdout.flush()
    console.rule(f"ranks ({plan.spec.world_size})")
    table = Table(show_lines=False)
    for col in ("rank", "node", "local rank", "device", "started by", "master address : port (source)"):
        table.add_column(col)
    shown = plan.shown_ranks()
    for r in shown:
        if r is None:
            between = plan.spec.world_size - len(shown) + 1
            table.add_row("...", f"({between} ranks between, laid out alike)", "", "", "", "")
            continue
        table.add_row(str(r.rank), r.host, str(r.local_rank), r.device, r.started_by, r.master)
    console.print(table)
    if plan.segments:
        seg = Table(title="segments (each resumes from the newest checkpoint; estimated)")
        for col in ("segment", "wall time", "steps"):
            seg.add_column(col)
        for s in plan.segments:
            seg.add_row(str(s.index), hms(s.time_s), s.steps)
        console.print(seg)
    print_checks(plan, time_asked=time_asked, summary=False)
    for note in plan.notes:
        console.print(f"note: {note}", markup=False)
    console.print(checks_summary(plan), markup=False)


def checks_summary(plan: Plan) -> str:
    """How many checks passed, failed and could not be made, and why not: an "unknown" row
    is no pass, and a plan that passed only the checks it could make says so."""
    counts = {status: sum(c.status == status for c in plan.checks) for status in ("pass", "FAIL", "unknown")}
    warned = sum(c.status == "WARN" for c in plan.checks)
    line = (f"preflight ({plan.label}): {counts['pass'] + warned} of {len(plan.checks)} checks passed"
            + (f" ({warned} with a warning)" if warned else "")
            + (f", {counts['FAIL']} failed" if counts["FAIL"] else ""))
    unknown = [c for c in plan.checks if c.ok is None]
    if not unknown:
        return line
    why = "; ".join(f"{c.name}: {c.detail.rpartition('; ')[2]}" for c in unknown)
    return f"{line}; {len(unknown)} not made, so the job may still fail on them ({why})"


def print_checks(plan: Plan, *, time_asked: bool, summary: bool = True) -> None:
    console = _console()
    table = Table(title=f"preflight: {plan.profile.name} / {plan.partition.name}, "
                        f"{plan.role + ' job, ' if plan.role else ''}shape {plan.shape.label}")
    for col in ("check", "result", "detail", "fix"):
        table.add_column(col)
    style = {"pass": "green", "WARN": "yellow", "FAIL": "bold red", "unknown": "yellow"}
    for c in plan.checks:
        table.add_row(c.name, f"[{style[c.status]}]{c.status}[/]", c.detail, c.fix)
    console.print(table)
    console.print(f"time limit ({plan.label}): {time_limit(plan, time_asked)}", markup=False)
    if summary:
        console.print(checks_summary(plan), markup=False)


def _shape(job: JobRecord) -> str:
    """``1x4``; ``simulation 2x128`` in a coupled layout; the race key (``h200-1x8``) in a race
    across partitions, where shapes alone may repeat."""
    return f"{job.role} {job.shape}" if job.role else job.key


def print_submission(sub: Submission) -> None:
    console = _console()
    table = Table(title=f"submitted to {sub.cluster} ({sub.scheduler})")
    for col in ("job id", "shape", "segment", "after", "name", "log"):
        table.add_column(col)
    for j in sub.jobs:
        table.add_row(j.job_id, _shape(j), f"{j.segment}/{j.segments}", j.after or "", j.name, j.log)
    console.print(table)
    console.print(f"run directory: {sub.run_dir}", markup=False)
    if sub.race:
        console.print(f"race between {', '.join(sub.race)}: the first to start owns the run and cancels the others",
                      markup=False)
    console.print("watch it with `diffscale status RUN_DIR` / `diffscale logs RUN_DIR`", markup=False)


def print_status(sub: Submission, states: Sequence[JobState], run_dir: Path) -> None:
    from diffscale.cluster.jobs import race

    console = _console()
    by_id = {s.job_id: s for s in states}
    table = Table(title=f"{sub.what} on {sub.cluster}, submitted {sub.submitted_at}")
    for col in ("job id", "shape", "segment", "state", "detail"):
        table.add_column(col)
    for j in sub.jobs:
        s = by_id.get(j.job_id)
        table.add_row(j.job_id, _shape(j), f"{j.segment}/{j.segments}", s.state if s else "?", s.detail if s else "")
    console.print(table)
    if sub.race:
        owner = race.owner(run_dir)
        console.print(f"race: {owner_words(sub, owner) + ' owns the run' if owner else 'no shape has started yet'}",
                      markup=False)


def status_dicts(sub: Submission, states: Sequence[JobState]) -> list[dict[str, Any]]:
    """The job table of ``status --json``: each job of the submission and its scheduler state."""
    by_id = {s.job_id: s for s in states}
    return [{"job_id": j.job_id, "shape": j.shape, "partition": j.partition, "segment": j.segment,
             "segments": j.segments, "role": j.role or None, "log": j.log,
             "state": by_id[j.job_id].state if j.job_id in by_id else None,
             "active": by_id[j.job_id].active if j.job_id in by_id else None,
             "detail": by_id[j.job_id].detail if j.job_id in by_id else ""} for j in sub.jobs]


def plan_dict(plan: Plan, *, time_asked: bool) -> dict[str, Any]:
    """What ``plan --json`` prints of one job: what ``plan`` shows, as data."""
    return {"label": plan.label, "cluster": plan.profile.name, "partition": plan.partition.name,
            "shape": plan.shape.label, "world_size": plan.spec.world_size, "time_limit_s": plan.spec.time_s,
            "time_limit": time_limit(plan, time_asked), "estimate_s": plan.estimate_s, "script": plan.script(),
            "ranks": [{"rank": r.rank, "node": r.node, "host": r.host, "local_rank": r.local_rank, "device": r.device,
                       "started_by": r.started_by, "master": r.master} for r in plan.shown_ranks() if r is not None],
            "segments": [{"segment": s.index, "time_s": s.time_s, "steps": s.steps} for s in plan.segments],
            "checks": [{"name": c.name, "status": c.status, "detail": c.detail, "fix": c.fix} for c in plan.checks],
            "notes": list(plan.notes), "ok": plan.ok}


def print_profile_list(profiles: Sequence[ClusterProfile]) -> None:
    table = Table(title="cluster profiles")
    for col in ("name", "scheduler", "partitions", "from"):
        table.add_column(col)
    for p in profiles:
        table.add_row(p.name, p.scheduler.value, ", ".join(x.name for x in p.partitions), p.source)
    _console().print(table)


def print_profile(profile: ClusterProfile) -> None:
    console = _console()
    console.print(f"{profile.title} ({profile.scheduler.value}) -- {profile.source}", markup=False)
    for url in profile.docs:
        console.print(f"  docs: {url}", markup=False)
    table = Table()
    for col in ("partition", "submit as", "GPUs/node", "GPU", "GPU mem", "cores/node", "mem/node", "max time",
                "interconnect"):
        table.add_column(col)
    for p in profile.partitions:
        table.add_row(p.name, p.submit_name or "(scheduler routes)", _u(p.gpus_per_node), p.gpu_type or "-",
                      _u(p.gpu_memory_gb, " GB"), _u(p.cpus_per_node), _u(p.mem_per_node_gb, " GB"),
                      human(p.max_time_s) if p.max_time_s else "unknown/unlimited", p.interconnect or "unknown")
    console.print(table)
    if profile.sge:
        s = profile.sge
        console.print(f"Grid Engine: PE one host {s.pe_single_host or '-'}, several hosts {s.pe_multi_host or '-'}; "
                      f"GPUs as -l {s.gpu_resource}=N per {s.gpu_scope.value}", markup=False)
    if profile.setup:
        console.print("set-up: " + "; ".join(profile.setup), markup=False)
    if profile.env:
        console.print("env: " + " ".join(f"{k}={v}" for k, v in profile.env), markup=False)
