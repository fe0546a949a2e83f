"""``plan --partition auto``: build every candidate's plan, ask the scheduler when each would
start, print the comparison and the pick, or the best N that ``--race N`` races (the decisions
are :mod:`.partition_choice`'s and :mod:`.partition_race`'s)."""

from __future__ import annotations

import argparse
import datetime as dt
import math
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.table import Table

from diffscale.cluster.planning.partition_choice import (
    Candidate,
    Duration,
    Start,
    candidate,
    device_of,
    parse_squeue_start,
    parse_test_only,
    ranked,
    shapes_for,
    user_run_seconds,
)
from diffscale.cluster.planning.partition_race import label_of, raced
from diffscale.cluster.planning.plan import SEGMENT_MARGIN_S, Plan, PlanOptions, make_plan
from diffscale.cluster.planning.shape import Shape
from diffscale.cluster.planning.workload import DiffscaleRun, UserCommand, Workload
from diffscale.cluster.profiles.types import ClusterProfile, SchedulerKind
from diffscale.cluster.scripts.timefmt import human
from diffscale.errors import UserError

DEFAULT_MAX_NODES = 8


def _time_for(run_s: int | None, limit: int | None) -> int | None:
    if run_s is None:
        return limit
    want = int(math.ceil((run_s * 1.2 + SEGMENT_MARGIN_S) / 900) * 900)
    return min(want, limit) if limit is not None else want


def compare(profile: ClusterProfile, workload: Workload, options: PlanOptions, ask_start: Callable[[Plan], Start],
            now: dt.datetime, *, per_node: int | None = None, max_nodes: int = DEFAULT_MAX_NODES,
            total_steps: int | None = None, cpus_per_rank: int | None = None,
            mem_per_node_gb: float | None = None) -> list[Candidate]:
    """Every (partition, shape) candidate of the profile, with its start, duration and finish
    (each asking for ``cpus_per_rank`` and ``mem_per_node_gb`` where given, as plan would)."""
    if isinstance(workload, UserCommand) and total_steps is None:
        raise UserError("--partition auto for a user command needs the run's length",
                        "pass --total-steps N (steps on one rank) and a probe per GPU type (--probe FILE)")
    found = []
    for part in profile.partitions:
        for nodes, g in shapes_for(part, per_node, max_nodes):
            shape = Shape(nodes, g, partition=part.name, use_gpus=part.has_gpus, cpus_per_rank=cpus_per_rank,
                          mem_per_node_gb=mem_per_node_gb)
            if isinstance(workload, DiffscaleRun):
                plan = make_plan(profile, shape, workload, options)
                run = Duration(plan.estimate_s, "diffscale's estimate (measured.yaml where it has the GPU)")
            else:
                run = user_run_seconds(getattr(workload, "usage", None), total_steps, device_of(part), nodes * g)
                plan = make_plan(profile, shape.with_time(_time_for(run.seconds, part.max_time_s)), workload, options)
            found.append(candidate(plan, run, ask_start, now))
    return found


def slurm_starts(workdir: Path) -> Callable[[Plan], Start]:
    """Ask the live SLURM: ``sbatch --test-only`` of the shape's script, else the latest
    ``squeue --start`` of the jobs pending in its partition."""
    from diffscale.cluster.jobs.scheduler import Slurm

    sched = Slurm()

    def ask(plan: Plan) -> Start:
        path = workdir / f"auto-{plan.partition.name}-{plan.shape.label}.sh"
        path.write_text(plan.script())
        said = sched.test_only(path, workdir)
        at = parse_test_only(said)
        if at is not None:
            return Start(at, "sbatch --test-only")
        pending = [s for _, s in parse_squeue_start(sched.pending_starts(plan.spec.partition)) if s is not None]
        if pending:
            return Start(max(pending), "squeue --start (latest job pending there)")
        last = said.strip().splitlines()[-1] if said.strip() else "nothing"
        return Start(None, f"unknown (sbatch --test-only: {last[:80]})")

    return ask


def no_starts(plan: Plan) -> Start:
    return Start(None, "unknown (Grid Engine gives no start estimate)")


def run_auto(profile: ClusterProfile, workload: Workload, options: PlanOptions, *, per_node: int | None,
             max_nodes: int, total_steps: int | None, cpus_per_rank: int | None = None,
             mem_per_node_gb: float | None = None) -> list[Candidate]:
    now = dt.datetime.now().replace(microsecond=0)
    with tempfile.TemporaryDirectory(prefix="diffscale-auto-") as tmp:
        ask = slurm_starts(Path(tmp)) if profile.scheduler is SchedulerKind.SLURM else no_starts
        found = compare(profile, workload, options, ask, now, per_node=per_node, max_nodes=max_nodes,
                        total_steps=total_steps, cpus_per_rank=cpus_per_rank, mem_per_node_gb=mem_per_node_gb)
    return found


def _hours(seconds: float | None) -> str:
    return "unknown" if seconds is None else human(int(seconds))


def _mark(c: Candidate, chosen: list[Candidate], race: int | None) -> str:
    rank = next((k for k, x in enumerate(chosen, 1) if x is c), None)
    if rank is None:
        return ""
    return f"<- race {rank}" if race else "<- pick"


def print_table(found: list[Candidate], chosen: list[Candidate], now: dt.datetime, race: int | None = None) -> None:
    """The comparison, the pick (``chosen[0]``) or, with ``race``, the candidates raced marked."""
    table = Table(title="partition auto: when each shape would finish (earliest wins)")
    for col in ("partition", "shape", "GPUs", "starts in", "start from", "run", "segments", "finishes in",
                "GPU-hours", "charge", "note"):
        table.add_column(col)
    for c in found:
        p = c.plan
        starts = _hours(max((c.start.at - now).total_seconds(), 0)) if c.start.at else "unknown"
        finish = _hours((c.finish - now).total_seconds()) if c.finish else "unknown"
        table.add_row(p.partition.name, p.shape.label, str(p.spec.world_size if p.spec.gpus_per_node else 0),
                      starts, c.start.source, _hours(c.run.seconds), str(c.segments or "-"), finish,
                      f"{c.gpu_hours:.1f}" if c.gpu_hours is not None else "-",
                      f"{c.charge:.1f}" if c.charge is not None else "-",
                      c.problem or _mark(c, chosen, race) or c.run.source)
    # wide enough for one line per shape when piped to a file
    Console(width=None if sys.stdout.isatty() else 240, highlight=False).print(table)
    if race and chosen:
        names = ", ".join(f"{label_of(c)} (partition {c.plan.partition.name}, {c.plan.shape.nodes} node(s) x "
                          f"{c.plan.shape.ranks_per_node})" for c in chosen)
        print(f"race: {names}; the first to start owns the run and cancels the others "
              f"(diffscale submit --partition auto --race {race} with these flags submits them)")
    elif chosen:
        best = chosen[0]
        s = best.plan.shape
        per_node = "--gpus-per-node" if best.plan.spec.gpus_per_node else "--procs-per-node"
        print(f"pick: partition {best.plan.partition.name}, {s.nodes} node(s) x {s.ranks_per_node} "
              f"({best.run.source}); submit it with --partition {best.plan.partition.name} --nodes {s.nodes} "
              f"{per_node} {s.ranks_per_node}")


def choose(args: argparse.Namespace, workload: Workload, race: int | None = None) -> list[Candidate]:
    """plan/submit --partition auto: compare the profile's partitions, print the table and the
    pick, or with ``race`` the candidates raced; [pick] or those candidates, best first."""
    from diffscale.cluster.flags import plan_options
    from diffscale.cluster.profiles.loading import load_profile

    profile = load_profile(args.cluster)
    options = plan_options(args, diffscale_run=isinstance(workload, DiffscaleRun))
    found = run_auto(profile, workload, options, per_node=args.gpus_per_node or args.procs_per_node,
                     max_nodes=args.nodes if args.nodes > 1 else DEFAULT_MAX_NODES,
                     total_steps=args.total_steps, cpus_per_rank=args.cpus_per_task, mem_per_node_gb=args.mem)
    fit = ranked(found)  # the pick is its first
    chosen = fit[:race or 1] if len(fit) >= (race or 1) else []  # too few to race: the error below says so
    print_table(found, chosen, dt.datetime.now().replace(microsecond=0), race)
    if not fit:
        first = next((c.problem for c in found if c.problem), "no duration known")
        raise UserError(f"no partition and shape can be picked ({first})",
                        "see the note column above: probe the command on each GPU type (diffscale probe --cluster "
                        "NAME --partition P) and pass --total-steps")
    return raced(fit, race) if race else chosen
