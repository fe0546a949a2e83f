"""``diffscale probe`` and the flags that tell plan/submit what a user's command needs.

``diffscale probe [--seconds N] [--out RUN_DIR] -- CMD ...`` measures the command here;
with ``--cluster PROFILE`` it writes (and with ``--submit`` submits) a short one-GPU job
that runs the same probe on a node of the partition.
"""

from __future__ import annotations

import argparse
import datetime
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from diffscale.cluster.planning.usage import RankUsage, probes_for, rank_usage
from diffscale.cluster.scripts.launcher import Launcher, resolve
from diffscale.errors import UserError
from diffscale.io.paths import folder_target
from diffscale.runtime import resources

if TYPE_CHECKING:
    from diffscale.cluster.planning.plan import Plan
    from diffscale.cluster.probe.result import ProbeResult
    from diffscale.cluster.profiles.types import ClusterProfile

PROBE_JOB_MARGIN_S = 300
"""A probe job's wall time beyond --seconds: start-up of the node, imports, writing probe.json."""


def add_command_arguments(p: argparse.ArgumentParser) -> None:
    """plan/submit flags about a user command: its launcher and what one rank uses."""
    p.add_argument("--launcher", default="auto", metavar="{auto,lightning,plain}",
                   help="how the command starts its ranks (default auto: a script importing lightning "
                        "or pytorch_lightning is a Lightning Trainer)")
    p.add_argument("--probe", metavar="FILE", action="append",
                   help="a probe.json of the command (default: RUN_DIR/probe.json if any); repeat it with probes "
                        "on other GPU types for --partition auto")
    p.add_argument("--mem-per-rank", type=float, metavar="GB", help="host memory of one rank's own process")
    p.add_argument("--workers-per-rank", type=int, metavar="N", help="loader workers per rank (num_workers)")
    p.add_argument("--worker-mem", type=float, metavar="GB", help="host memory of one loader worker")
    p.add_argument("--total-steps", type=int, metavar="N",
                   help="--partition auto: steps the whole run takes on one rank (the probe gives steps/s)")


def command_facts(args: argparse.Namespace, argv: tuple[str, ...], run_dir: Path) -> tuple[Launcher, RankUsage | None]:
    launcher = resolve(args.launcher, argv)
    usage = rank_usage(probes_for(args.probe, run_dir), mem_per_rank_gb=args.mem_per_rank,
                       workers=args.workers_per_rank, worker_mem_gb=args.worker_mem, planned=argv)
    return launcher, usage


def check_no_command_facts(args: argparse.Namespace) -> None:
    """A diffscale run knows its own needs: these flags are for user commands only."""
    given = [f for f in ("probe", "mem_per_rank", "workers_per_rank", "worker_mem")
             if getattr(args, f, None) is not None]
    if given:
        flag = "--" + given[0].replace("_", "-")
        raise UserError(f"{flag} describes a user command, not a diffscale run",
                        "drop it (diffscale estimates its own runs), or submit your command after `--`")


def register(subparsers: argparse._SubParsersAction) -> None:
    from diffscale.cli_parser import verb

    p = verb(
        subparsers, "probe", "run a command for a bounded time and measure one rank (RAM, workers, GPU, steps/s)",
        "diffscale probe --seconds 90 --out runs/mine -- python train.py --num-workers 8\n"
        "diffscale plan --cluster nyu-torch --partition h200 --probe runs/mine/probe.json -- python train.py",
        description="Run COMMAND here for at most --seconds, sample its process tree from /proc (peak PSS/USS or "
                    "RSS of the main process and of each child), threads, GPU memory (NVML) and steps/s from "
                    "progress lines, and store RUN_DIR/probe.json for plan. With --cluster: a one-GPU job that "
                    "runs the probe on a node.")
    p.add_argument("command", nargs="*", metavar="-- COMMAND", help="the command to measure, after `--`")
    p.add_argument("--seconds", type=int, default=60, help="how long the command runs (default 60)")
    p.add_argument("--out", help="run directory for probe.json and probe.log (default runs/probe-<time>)")
    p.add_argument("--cluster", help="write a short one-GPU job running the probe on this profile's nodes")
    p.add_argument("--partition", help="partition of that job (default: the profile's)")
    p.add_argument("--account", help="SLURM --account / Grid Engine -P project of that job")
    p.add_argument("--submit", action="store_true", help="submit that job (else print it)")
    p.add_argument("--python", default=sys.executable, help="interpreter on the node (default: this one)")
    p.set_defaults(func=cmd_probe)


def cmd_probe(args: argparse.Namespace) -> int:
    from diffscale.cluster.probe.run import check_seconds
    from diffscale.cluster.scripts.values import check_job_flags

    argv = tuple(args.command)
    if not argv:
        raise UserError("nothing to probe", "write the command after `--`, e.g. diffscale probe -- python train.py")
    check_seconds(args.seconds)
    if args.cluster:
        check_job_flags(args)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = folder_target(args.out or f"runs/probe-{stamp}", "--out").absolute()
    if args.cluster:
        return _probe_job(args, argv, run_dir)
    from diffscale.cluster.probe import result as probe_result
    from diffscale.cluster.probe.run import run_probe

    result = run_probe(argv, args.seconds, run_dir / "probe.log")
    path = probe_result.save(result, run_dir)
    print_probe(result, path)
    return 0


def print_probe(r: ProbeResult, path: Path) -> None:
    g = resources.gib
    how = "stopped at the limit" if r.ended == "limit" else f"exited {r.exit_code}"
    print(f"probe: {' '.join(r.command)} ran {r.ran_s:.0f} s of {r.seconds} s ({how}) on {r.host}")
    print(f"memory measure: {r.measure}")
    print(f"main process {r.main.pid}: peak {g(r.main.memory_bytes):.2f} GiB"
          f" (RSS {g(r.main.rss_bytes):.2f} GiB{_uss(r.main.uss_bytes)}), {r.main.threads} threads")
    print(f"children (loader workers): {len(r.workers)} seen, {r.workers_at_once} at once, largest "
          f"{g(r.worker_bytes):.2f} GiB")
    for w in r.workers[:16]:
        print(f"  {w.pid}: {g(w.memory_bytes):.2f} GiB (RSS {g(w.rss_bytes):.2f}{_uss(w.uss_bytes)}) {w.cmdline[:80]}")
    print(f"whole tree: peak {g(r.tree_peak_bytes):.2f} GiB, {r.threads_peak} threads; {r.cpus} CPUs here")
    gpu = f"{r.gpu_bytes / 1e9:.2f} GB on {r.gpu_name}" if r.gpu_bytes else r.gpu_note
    print(f"GPU memory: {gpu}")
    rate = f"{r.steps_per_s:g} steps/s (from: {r.progress_line})" if r.steps_per_s is not None else "unknown"
    print(f"steps/s: {rate}")
    for note in r.notes:
        print(f"note: {note}")
    print(f"wrote {path}; plan uses it: diffscale plan --cluster NAME --probe {path} -- COMMAND")


def _uss(uss: int | None) -> str:
    return f", USS {resources.gib(uss):.2f} GiB" if uss is not None else ""


def _probe_job(args: argparse.Namespace, argv: tuple[str, ...], run_dir: Path) -> int:
    from diffscale.cluster import tables as report
    from diffscale.cluster.jobs import submit
    from diffscale.cluster.jobs.scheduler import for_kind
    from diffscale.cluster.profiles.loading import load_profile

    profile = load_profile(args.cluster)
    plan = probe_job_plan(profile, args.partition, args.seconds, str(run_dir), argv, python=args.python,
                          account=args.account)
    if not args.submit:
        sys.stdout.write(plan.script())
        return 0
    run_dir.mkdir(parents=True, exist_ok=True)
    sub = submit.submit([plan], for_kind(profile.scheduler), run_dir, cluster=profile.name, what="probe")
    report.print_submission(sub)
    return 0


def probe_job_plan(profile: ClusterProfile, partition: str | None, seconds: int, run_dir: str,
                   argv: tuple[str, ...], *, python: str, account: str | None = None) -> Plan:
    """A short job on one GPU (one process on a CPU partition) that runs the probe on a node."""
    from diffscale.cluster.planning.plan import PlanOptions, make_plan
    from diffscale.cluster.planning.shape import Shape
    from diffscale.cluster.planning.workload import UserCommand

    part = profile.partition(partition)
    time_s = int(math.ceil((seconds + PROBE_JOB_MARGIN_S) / 60) * 60)
    if part.max_time_s is not None and time_s > part.max_time_s:
        most = max(5, part.max_time_s - PROBE_JOB_MARGIN_S)
        raise UserError(f"a probe of {seconds} s needs a {time_s} s job, over partition '{part.name}''s "
                        f"limit of {part.max_time_s} s", f"pass --seconds {most} or less, or another --partition")
    command = probe_job_command(python, seconds, run_dir, argv)
    return make_plan(profile, Shape(1, 1, partition=part.name, time_s=time_s, use_gpus=part.has_gpus),
                     UserCommand(command, run_dir, python), PlanOptions(account=account, signal=None))


def probe_job_command(python: str, seconds: int, run_dir: str, argv: tuple[str, ...]) -> tuple[str, ...]:
    """What a probe job runs on its node: this probe, writing into the run directory."""
    return (python, "-m", "diffscale", "probe", "--seconds", str(seconds), "--out", run_dir, "--", *argv)
