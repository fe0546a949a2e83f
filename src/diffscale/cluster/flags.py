"""Range checks of the job flags of plan and submit, each message naming the flag and its range.

argparse checks that a value is a number; these check that it is a usable one, before a
profile is read or anything is written. Without them ``--gpus-per-node 0`` silently meant
"all of a node's", ``--max-restarts -1`` "never requeue", ``--mem -5`` an OOM warning, and
``--signal BOGUS`` or ``--signal-lead -5`` reached sbatch.
"""

from __future__ import annotations

import argparse
import math
import signal as signals
from typing import TYPE_CHECKING

from diffscale.cluster.planning.shape import at_least, at_most, check_job_size
from diffscale.errors import UserError, closest
from diffscale.runtime.signals import STOP_SIGNALS

if TYPE_CHECKING:
    from diffscale.cluster.planning.plan import PlanOptions

MAX_SIGNAL_LEAD_S = 65535
"""SLURM's --signal=...@LEAD takes at most 65535 seconds."""
MAX_CPUS_PER_TASK = 1024
"""More cores than any node has."""
MAX_MEM_GB = 65536
"""More host memory (GB) than any node has."""
MAX_RESTARTS = 10000
TRAINER_SIGNALS = tuple(s.name.removeprefix("SIG") for s in STOP_SIGNALS)
"""Signals a diffscale run checkpoints on."""
COMMAND_SIGNALS = tuple(name for name in ("USR1", "USR2", "TERM", "INT", "HUP", "QUIT", "ALRM", "CONT", "URG", "XCPU",
                                          "WINCH") if hasattr(signals, f"SIG{name}"))
"""Signals a user command may trap (KILL and STOP cannot be caught: no warning at all)."""


def check_numbers(args: argparse.Namespace) -> None:
    """Every numeric job flag within its range (argparse already checked the types), and the
    names and lines passed on to the scheduler usable."""
    from diffscale.cluster.scripts.values import check_job_flags

    check_job_flags(args)
    check_job_size(args.nodes, args.gpus_per_node, gpus=True)
    check_job_size(args.nodes, args.procs_per_node, gpus=False)
    for flag in ("--cpus-per-task", "--sim-cpus-per-task"):
        cpus = getattr(args, flag[2:].replace("-", "_"), None)
        at_least(cpus, 1, flag, "each rank needs at least 1 core")
        at_most(cpus, MAX_CPUS_PER_TASK, flag, "more cores per rank than any node has")
    if args.mem is not None and not (0 < args.mem <= MAX_MEM_GB and math.isfinite(args.mem)):
        raise UserError(f"--mem {args.mem:g} is out of range: host memory per node is a positive number of GB, "
                        f"at most {MAX_MEM_GB}", "pass e.g. --mem 64, or leave --mem out for the estimate")
    at_least(args.global_batch, 1, "--global-batch", "a batch of at least 1 example")
    at_least(args.max_restarts, 0, "--max-restarts", "0 (never requeue) or more requeues")
    at_most(args.max_restarts, MAX_RESTARTS, "--max-restarts", "requeues of one run")
    lead = args.signal_lead
    if lead is not None and not 1 <= lead <= MAX_SIGNAL_LEAD_S:
        raise UserError(f"--signal-lead {lead} is out of range: the warning comes 1 to {MAX_SIGNAL_LEAD_S} s before "
                        "the time limit", "pass e.g. --signal-lead 120, or leave it out for the default")
    for line in getattr(args, "setup", ()):
        if not line.strip():
            raise UserError(f"--setup {line!r} is not one shell line",
                            "pass each line as its own --setup, e.g. --setup 'module load miniconda' "
                            "--setup 'conda activate dp'")


def plan_options(args: argparse.Namespace, *, diffscale_run: bool) -> PlanOptions:
    """What plan and submit's flags ask of every job (the warning signal for what runs)."""
    from diffscale.cluster.planning.plan import PlanOptions

    return PlanOptions(account=args.account, qos=args.qos, max_restarts=args.max_restarts,
                       signal_lead_s=args.signal_lead, chain=not args.no_chain, global_batch=args.global_batch,
                       setup=tuple(args.setup), signal=warning_signal(args.signal, diffscale_run=diffscale_run),
                       python_asked=args.python is not None)


def warning_signal(text: str | None, *, diffscale_run: bool) -> str | None:
    """``--signal`` as the job scripts take it: ``auto``, a signal name without SIG, or None (``none``)."""
    value = "auto" if text is None else str(text).strip()
    if value.lower() in ("auto", "none"):
        return None if value.lower() == "none" else "auto"
    name = value.upper().removeprefix("SIG")
    valid = TRAINER_SIGNALS if diffscale_run else COMMAND_SIGNALS
    if name not in valid:
        who = "a diffscale run checkpoints on" if diffscale_run else "a job can trap"
        raise UserError(f"--signal '{text}' is not a signal {who}{closest(name, valid)}",
                        f"use one of: {', '.join(valid)}, none (no warning) or auto")
    return name


def check_signal_lead(lead_s: int, time_s: int | None, signal: str | None) -> None:
    """The warning must come after the job starts: a lead as long as the limit fires at once."""
    if signal and time_s is not None and lead_s >= time_s:
        raise UserError(f"--signal-lead {lead_s} s is not shorter than the job's time limit ({time_s} s)",
                        f"pass --signal-lead below {time_s} (e.g. {max(1, time_s // 4)}), or a longer --time")


def add_job_arguments(p: argparse.ArgumentParser, *, race: bool) -> None:
    """The flags of ``plan`` and ``submit`` (``race``: also --race and the coupled layout's)."""
    p.add_argument("target", nargs="*", metavar="CONFIG.yaml | -- COMMAND",
                   help="a diffscale run config (or use --preset), or any command after `--`")
    p.add_argument("--cluster", required=True,
                   help="bundled profile name (`diffscale cluster list`) or profile YAML path")
    p.add_argument("--preset", help="train this preset (see `diffscale presets`)")
    p.add_argument("--data", metavar="SPEC",
                   help="data spec, as for train (a relative path is made absolute: the job runs in its run dir)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set train.steps=1000 (repeatable)")
    p.add_argument("--out", help="run directory (default: runs/<preset or job>-<time>)")
    p.add_argument("--nodes", type=int, default=1, help="nodes (default 1)")
    gpus = p.add_mutually_exclusive_group()
    gpus.add_argument("--gpus-per-node", type=int, help="GPUs per node = ranks per node (default: all of a node's)")
    gpus.add_argument("--procs-per-node", type=int,
                      help="CPU ranks per node, asking for no GPUs (CPU partitions, tests)")
    p.add_argument("--partition", help="partition (SLURM) / GPU class or queue (Grid Engine) from the profile")
    p.add_argument("--time",
                   help="wall time per job, HH:MM:SS or D-HH:MM:SS (default: estimated, capped at the maximum)")
    p.add_argument("--cpus-per-task", type=int, help="CPU cores per rank (default: the node's cores shared, at most 8)")
    p.add_argument("--mem", type=float, help="host memory per node in GB (default: estimated)")
    p.add_argument("--account", help="SLURM --account / Grid Engine -P project")
    p.add_argument("--qos", help="SLURM QOS")
    p.add_argument("--setup", action="append", default=[], metavar="LINE",
                   help="a shell line the job runs before the command, after the profile's own "
                        "(e.g. --setup 'module load miniconda' --setup 'conda activate dp'; repeatable)")
    p.add_argument("--global-batch", type=int, help="check that this global batch divides over the ranks")
    p.add_argument("--max-restarts", type=int, default=20, help="requeues after a checkpoint-on-signal (default 20)")
    p.add_argument("--signal", default="auto",
                   help="warning signal before the time limit: USR2 (default for diffscale runs), USR1, ... or none")
    p.add_argument("--signal-lead", type=int, help="seconds of warning before the time limit (default 120)")
    p.add_argument("--no-chain", action="store_true",
                   help="for runs longer than the limit: one self-requeueing job instead of a chain of segments")
    p.add_argument("--python", help="interpreter on the nodes (default: `python` of the environment a set-up line "
                                     "activates, else this one)")
    p.add_argument("--force", action="store_true", help="go ahead although a preflight check failed")
    from diffscale.cluster.probe.cli import add_command_arguments

    add_command_arguments(p)
    if race:
        p.add_argument("--race", metavar="NxG,... | N",
                       help="submit several shapes (nodes x GPUs per node) of one partition, or with "
                            "--partition auto a count N: the N candidates that finish first, each its own "
                            "partition and shape (plan shows which); the first to start wins, the others "
                            "are cancelled")
        from diffscale.cluster.planning.couple import add_arguments

        add_arguments(p)
