"""Cluster verbs of the diffscale CLI: plan, submit, status, logs, cancel, cluster.

``register(subparsers)`` adds them to the top-level parser; each handler takes the
parsed args, does one thing and returns an exit code. UserError propagates to main().
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from diffscale.cluster.flags import add_job_arguments
from diffscale.errors import UserError
from diffscale.io.paths import folder_target
from diffscale.io.trainer import local_log

if TYPE_CHECKING:  # annotations only; the handlers import what they use
    from diffscale.cluster.jobs.records import JobState, Submission
    from diffscale.cluster.jobs.scheduler import Scheduler
    from diffscale.cluster.planning.plan import Plan
    from diffscale.cluster.planning.shape import Shape
    from diffscale.cluster.planning.workload import Workload
    from diffscale.cluster.profiles.types import ClusterProfile, Partition
    from diffscale.config import RunConfig

# ----------------------------------------------------------------------------- arguments

def register(subparsers: argparse._SubParsersAction) -> None:
    from diffscale.cli_parser import verb

    shape = "--cluster purdue-gilbreth --nodes 2 --gpus-per-node 4 --preset xl --account mylab"
    p = verb(subparsers, "plan", "show the job script, every rank and the preflight checks (dry run)",
             f"diffscale plan {shape}",
             description="Dry run: print the job script, a table of every rank and the preflight "
             "checks. Exits 2 when a check fails (unless --force).")
    add_job_arguments(p, race=True)
    p.add_argument("--json", action="store_true", help="print the plans as one JSON list (script, ranks, checks)")
    p.set_defaults(func=cmd_plan)

    p = verb(subparsers, "submit", "plan, then submit the job(s) and record them in RUN_DIR/jobs.json",
             f"diffscale submit {shape} --out runs/xl\n"
             "diffscale submit --cluster bu-scc --nodes 1 --gpus-per-node 2 -- python train.py --lr 1e-4")
    add_job_arguments(p, race=True)
    p.set_defaults(func=cmd_submit)

    from diffscale.cluster.probe.cli import register as register_probe
    register_probe(subparsers)

    p = verb(subparsers, "status", "where a run stands: its jobs (submitted runs), step, rate, ETA, newest "
             "checkpoint and last sample", "diffscale status runs/xl")
    p.add_argument("run_dir", metavar="RUN_DIR", help="the --out of diffscale train or submit")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of lines")
    p.set_defaults(func=cmd_status)

    p = verb(subparsers, "logs", "print a run's job log (trained here: its train.log)", "diffscale logs runs/xl -n 50")
    p.add_argument("run_dir", metavar="RUN_DIR", help="the --out of diffscale submit or train")
    p.add_argument("--job", help="job id (default: the latest job that has a log)")
    p.add_argument("-n", "--lines", type=int, default=0, help="only the last N lines")
    p.set_defaults(func=cmd_logs)

    p = verb(subparsers, "cancel", "cancel the pending/running jobs of a run", "diffscale cancel runs/xl")
    p.add_argument("run_dir", metavar="RUN_DIR", help="the --out of diffscale submit")
    p.set_defaults(func=cmd_cancel)

    from diffscale.cluster.profiles.cli import cmd_cluster_discover, cmd_cluster_list, cmd_cluster_show

    p = verb(subparsers, "cluster", "cluster profiles: list, show, discover",
             "diffscale cluster list\ndiffscale cluster show purdue-gilbreth")
    sub = p.add_subparsers(dest="cluster_verb", metavar="{list,show,discover}")
    sub.required = True
    q = verb(sub, "list", "bundled and discovered profiles", "diffscale cluster list")
    q.set_defaults(func=cmd_cluster_list)
    q = verb(sub, "show", "a profile's partitions and facts", "diffscale cluster show nyu-torch")
    q.add_argument("name", metavar="NAME", help="a profile name (`diffscale cluster list`) or a profile YAML path")
    q.set_defaults(func=cmd_cluster_show)
    q = verb(sub, "discover", "write a profile from the live scheduler", "diffscale cluster discover --name mycluster")
    q.add_argument("--name", default="local", help="profile name (default: local)")
    q.add_argument("--scheduler", choices=["slurm", "sge"], help="default: whichever answers (scontrol, then qconf)")
    q.add_argument("--out", help="profile YAML to write (default: $DIFFSCALE_CLUSTERS_DIR or "
                   "~/.config/diffscale/clusters/NAME.yaml)")
    q.set_defaults(func=cmd_cluster_discover)


# ----------------------------------------------------------------------------- building plans

def _stamp() -> str:
    return datetime.datetime.now().strftime("%Y%m%d-%H%M%S")


def _workload(args: argparse.Namespace) -> tuple[Workload, Path, RunConfig | None]:
    """(workload, run_dir, resolved config or None) from the target / --preset / --set."""
    from diffscale import config as cfgmod
    from diffscale.cluster.planning.workload import UserCommand, diffscale_run, job_config

    target = list(args.target)
    is_config = len(target) == 1 and target[0].endswith((".yaml", ".yml"))
    if args.preset or is_config:
        if args.preset and target:
            raise UserError("both --preset and a positional argument given",
                            "train a preset (--preset NAME) or a config file, or run a command after `--`")
        from diffscale.cluster.probe.cli import check_no_command_facts

        check_no_command_facts(args)
        cfg = job_config(cfgmod.resolve_config(cfgmod.ConfigSources(
            preset=args.preset, config_file=None if args.preset else target[0], data=args.data,
            overrides=args.overrides or [])))
        run_dir = folder_target(args.out or f"runs/{cfg.preset}-{_stamp()}", "--out").absolute()
        return diffscale_run(cfg, str(run_dir), args.python or sys.executable, kernel_cache=True), run_dir, cfg
    if not target:
        raise UserError("nothing to run", "give a config (CONFIG.yaml), --preset NAME, or a command after `--`")
    for flag, given in (("--set", args.overrides), ("--data", args.data)):
        if given:
            raise UserError(f"{flag} applies to diffscale runs, not to a user command",
                            f"drop {flag}, or pass the options to your command")
    run_dir = folder_target(args.out or f"runs/job-{_stamp()}", "--out").absolute()
    from diffscale.cluster.probe.cli import command_facts

    launcher, usage = command_facts(args, tuple(target), run_dir)
    command = UserCommand(tuple(target), str(run_dir), args.python or sys.executable, launcher=launcher, usage=usage)
    return command, run_dir, None


def _plans(args: argparse.Namespace) -> tuple[ClusterProfile, str, Path, RunConfig | None, list[Plan]]:
    from diffscale.cluster.flags import check_numbers, plan_options
    from diffscale.cluster.planning.plan import make_plan
    from diffscale.cluster.planning.shape import Shape, check_job_size, parse_race, race_count
    from diffscale.cluster.planning.workload import DiffscaleRun
    from diffscale.cluster.profiles.loading import load_profile
    from diffscale.cluster.scripts.jobspec import RaceSpec, job_name
    from diffscale.cluster.scripts.timefmt import parse_time_limit

    check_numbers(args)
    time_s = parse_time_limit(args.time) if args.time is not None else None
    race = getattr(args, "race", None)
    race_count(race, auto=False)  # a count belongs to --partition auto
    shapes = parse_race(race) if race else None
    profile = load_profile(args.cluster)

    def shape(nodes: int, per_node: int) -> Shape:
        return Shape(nodes=nodes, ranks_per_node=per_node, partition=args.partition, time_s=time_s,
                     cpus_per_rank=args.cpus_per_task, mem_per_node_gb=args.mem, use_gpus=args.procs_per_node is None)

    if getattr(args, "couple", None):  # one GPU for the trainer unless told: the simulation has the nodes
        from diffscale.cluster.planning import couple
        from diffscale.data.locations import parse_spool_spec

        run_dir = folder_target(args.out or f"runs/coupled-{_stamp()}", "--out").absolute()
        sim_time = parse_time_limit(args.sim_time, what="--sim-time") if args.sim_time is not None else None
        trainer = shape(args.nodes, next((n for n in (args.gpus_per_node, args.procs_per_node) if n), 1))
        trainer_options = plan_options(args, diffscale_run=True)
        plans, trainer_cfg, what = couple.from_args(profile, args, run_dir, trainer, sim_time, trainer_options)
        folder_target(parse_spool_spec(trainer_cfg.data.source).directory, "--couple")  # the simulation makes it
        return profile, what, run_dir, trainer_cfg, [_lead_checked(args, plan) for plan in plans]
    workload, run_dir, cfg = _workload(args)
    options = plan_options(args, diffscale_run=isinstance(workload, DiffscaleRun))
    part = profile.partition(args.partition)
    per_node = next((n for n in (args.gpus_per_node, args.procs_per_node, part.gpus_per_node) if n), 1)
    for nodes, g in shapes or []:
        check_job_size(nodes, g, gpus=args.procs_per_node is None, nodes_flag="--race", per_node_flag="--race")
    _refuse_oversized(part, [shape(nodes, g) for nodes, g in shapes or [(args.nodes, per_node)]], args.force)
    plans = []
    for nodes, g in shapes or [(args.nodes, per_node)]:
        label = f"{nodes}x{g}"
        race_spec = RaceSpec(label, tuple(job_name(str(run_dir), f"{n}x{k}")
                                          for n, k in shapes if (n, k) != (nodes, g))) if shapes else None
        plan = make_plan(profile, shape(nodes, g), workload, dataclasses.replace(options, race=race_spec))
        plans.append(_lead_checked(args, plan))
    return profile, workload.title, run_dir, cfg, plans


def _auto(args: argparse.Namespace, *, submitting: bool) -> tuple[int | None, Workload, Path, RunConfig | None]:
    """--partition auto's flags checked: (--race count or None, workload, run_dir, config)."""
    from diffscale.cluster.flags import check_numbers
    from diffscale.cluster.planning.shape import race_count

    check_numbers(args)
    count = race_count(args.race, auto=True)
    if getattr(args, "couple", None):
        raise UserError("--partition auto and --couple cannot be combined",
                        "couple on named partitions (--partition for the trainer, --sim-partition)")
    if submitting and count is None:
        raise UserError("--partition auto compares partitions; submit needs to know how many of them to race",
                        "race the best: diffscale submit --partition auto --race 2 ..., or submit the pick of "
                        "diffscale plan --partition auto with its --partition and shape")
    return (count, *_workload(args))


def _auto_plans(args: argparse.Namespace) -> tuple[ClusterProfile, str, Path, RunConfig | None, list[Plan]]:
    """submit --partition auto --race N: the N candidates that finish first, as one race."""
    from diffscale.cluster.planning.partition_auto import choose
    from diffscale.cluster.planning.partition_race import raced_plans

    count, workload, run_dir, cfg = _auto(args, submitting=True)
    plans = [_lead_checked(args, plan) for plan in raced_plans(choose(args, workload, count))]
    return plans[0].profile, workload.title, run_dir, cfg, plans


def _lead_checked(args: argparse.Namespace, plan: Plan) -> Plan:
    """``plan``, once ``--signal-lead`` fits its time limit and warning signal."""
    from diffscale.cluster.flags import check_signal_lead

    if args.signal_lead is not None:
        check_signal_lead(args.signal_lead, plan.spec.time_s, plan.spec.signal)
    return plan


def _refuse_oversized(part: Partition, shapes: list[Shape], force: bool) -> None:
    """A shape larger than the profile's nodes hold is refused before its rank table is laid out."""
    from diffscale.cluster.planning.preflight import shape_checks

    failed = [(shape, c) for shape in shapes for c in shape_checks(part, shape) if c.ok is False]
    if failed and not force:
        shape, first = failed[0]
        where = f"shape {shape.label}: " if len(shapes) > 1 else ""
        raise UserError(f"preflight check '{first.name}' failed: {where}{first.detail}",
                        f"{first.fix}; or pass --force to go ahead anyway")


def _refuse_failed(plans: list[Plan], force: bool) -> None:
    failed = [(p.label if p.role else f"shape {p.shape.label}", c) for p in plans for c in p.failed]
    if failed and not force:
        first_job, first = failed[0]
        more = f" (and {len(failed) - 1} more above)" if len(failed) > 1 else ""
        where = f"{first_job}: " if len(plans) > 1 else ""
        raise UserError(f"preflight check '{first.name}' failed: {where}{first.detail}{more}",
                        f"{first.fix}; or pass --force to go ahead anyway")


# ----------------------------------------------------------------------------- handlers

def cmd_plan(args: argparse.Namespace) -> int:
    from diffscale.cluster import tables as report

    if args.partition == "auto":
        from diffscale.cluster.planning.partition_auto import choose

        if args.json:
            raise UserError("--json prints the plans of named partitions; --partition auto prints its comparison",
                            "drop --json, or plan the partition it picks: --partition NAME --json")
        count, workload, _, _ = _auto(args, submitting=False)
        choose(args, workload, count)
        return 0
    _, _, _, _, plans = _plans(args)
    if args.json:
        _said([report.plan_dict(plan, time_asked=args.time is not None) for plan in plans])
    for plan in plans if not args.json else ():
        report.print_plan(plan, time_asked=args.time is not None)
    _refuse_failed(plans, args.force)
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    from diffscale import config as cfgmod
    from diffscale.cluster import tables as report
    from diffscale.cluster.jobs import race as racemod
    from diffscale.cluster.jobs import submit
    from diffscale.cluster.jobs.scheduler import for_kind

    profile, what, run_dir, cfg, plans = _auto_plans(args) if args.partition == "auto" else _plans(args)
    for plan in plans:
        report.print_checks(plan, time_asked=args.time is not None)
    _refuse_failed(plans, args.force)
    run_dir.mkdir(parents=True, exist_ok=True)
    coupled = bool(getattr(args, "couple", None))
    if coupled:  # there before the trainer looks for it, whichever job starts first
        from diffscale.data.locations import parse_spool_spec

        assert cfg is not None
        parse_spool_spec(cfg.data.source).directory.mkdir(parents=True, exist_ok=True)
    elif len(plans) > 1 and racemod.owner(run_dir) is not None:
        raise UserError(f"{run_dir} was already raced (shape {racemod.owner(run_dir)} owns it)",
                        "continue it with a plain submit of that shape, or race into a new --out")
    if cfg is not None:
        cfgmod.write_yaml(cfg, run_dir / "config.yaml")
    sub = submit.submit(plans, for_kind(profile.scheduler), run_dir, cluster=profile.name, what=what, tied=coupled)
    report.print_submission(sub)
    return 0


def _checked_states(run_dir: str) -> tuple[Submission, Scheduler, list[JobState]]:
    """(submission, scheduler, states): the ids of jobs.json checked against the scheduler's
    names and users, ended jobs diffscale cancelled shown as cancelled."""
    from diffscale.cluster.jobs import race
    from diffscale.cluster.jobs import records as jobs
    from diffscale.cluster.jobs.scheduler import for_kind
    from diffscale.cluster.profiles.types import SchedulerKind

    sub = jobs.latest(run_dir)
    sched = for_kind(SchedulerKind(sub.scheduler))
    states = sched.states([j.job_id for j in sub.jobs])
    jobs.check_ours(sub, states, run_dir)
    owner = race.owner(Path(run_dir)) if sub.race else None
    return sub, sched, jobs.with_cancellations(sub, states, run_dir, owner)


def cmd_status(args: argparse.Namespace) -> int:
    """A submitted run: its jobs, then its progress once training has logged. A local run (no
    jobs.json): its progress from metrics.jsonl, checkpoints and samples."""
    from diffscale.cluster import tables as report
    from diffscale.cluster.jobs import records as jobs
    from diffscale.io import rundir

    run_dir = Path(args.run_dir)
    found: dict = {"jobs": None, "progress": None}
    if jobs.path(run_dir).is_file():
        sub, _, states = _checked_states(args.run_dir)
        if args.json:
            found["jobs"] = report.status_dicts(sub, states)
        else:
            report.print_status(sub, states, run_dir)
        if not (run_dir / "metrics.jsonl").is_file() and not rundir.checkpoints(run_dir):
            return _said(found) if args.json else 0  # no step trained yet: the job table says why
    progress = rundir.progress(run_dir)
    if args.json:
        return _said({**found, "progress": rundir.as_dict(progress)})
    for line in rundir.describe(progress):
        print(line)
    return 0


def _said(found: object) -> int:
    """A verb's result as one JSON line, floats rounded."""
    import json

    from diffscale.io.numbers import rounded

    print(json.dumps(rounded(found)))
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    from diffscale.cluster.jobs import records as jobs

    if args.lines < 0:
        raise UserError(f"-n {args.lines} is out of range: the number of last lines is 0 (all) or more",
                        "pass e.g. -n 50, or leave -n out for the whole log")
    if Path(args.run_dir).is_dir() and not jobs.path(Path(args.run_dir)).is_file():  # trained here
        sys.stdout.write(local_log(Path(args.run_dir), args.job, args.lines))
        return 0
    sub = jobs.latest(args.run_dir)
    candidates = [j for j in sub.jobs if args.job in (None, j.job_id)]
    if not candidates:
        raise UserError(f"job {args.job} is not part of the latest submission of {args.run_dir}",
                        f"use one of: {', '.join(j.job_id for j in sub.jobs)}")
    files = {j.job_id: jobs.log_file(args.run_dir, j.log) for j in candidates}
    with_logs = [j for j in candidates if files[j.job_id].is_file()]
    if not with_logs:
        raise UserError(f"no log yet for job(s) {', '.join(j.job_id for j in candidates)}",
                        "a job writes its log once it starts; check `diffscale status`")
    job = with_logs[-1] if args.job is None else with_logs[0]
    text = files[job.job_id].read_text(errors="replace")
    if args.lines:
        text = "\n".join(text.splitlines()[-args.lines:]) + "\n"
    sys.stdout.write(f"==> {job.log} (job {job.job_id}, shape {job.shape}) <==\n{text}")
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    from diffscale.cluster.jobs import records as jobs

    _, sched, states = _checked_states(args.run_dir)
    active = [s.job_id for s in states if s.active]
    if not active:
        print("nothing to cancel: no job of this run is pending or running")
        return 0
    sched.cancel(active)
    jobs.record_cancelled(args.run_dir, active)
    print(f"cancelled {len(active)} job(s): {', '.join(active)}")
    return 0
