"""The runs ``diffscale bench`` starts: which worker jobs, on which GPUs, side by side or not.

A job is one (preset, recipe, variant, GPU count) measurement: one worker process, a torchrun
group, or two torchrun "nodes" on one host. ``--concurrent N`` starts N jobs at once; they
compile side by side and take turns for their timed windows (``bench.worker --turns``), so no
timed window shares a GPU or the host's CPUs with a compilation or another measurement.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from diffscale import config as C
from diffscale.errors import UserError

SAMPLING_BATCH = {"small": 256, "medium": 64, "xl": 16}
"""Batch of the DDIM sampling comparison per preset (as recorded in docs/benchmarks.md, "Sampling speed"); 16 else."""
_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class Variant:
    """A labelled set of config overrides, measured beside the defaults (label "")."""

    label: str = ""
    overrides: tuple[str, ...] = ()


@dataclass(frozen=True)
class Job:
    preset: str
    recipe: str
    variant: Variant
    gpus: int  # per node
    nodes: int = 1

    @property
    def name(self) -> str:
        label = f"-{self.variant.label}" if self.variant.label else ""
        return f"{self.preset}-{self.recipe}{label}-{self.gpus}{'x2nodes' if self.nodes > 1 else 'gpu'}"


def parse_variants(items: list[list[str]] | None) -> list[Variant]:
    """``--variant LABEL [KEY=VALUE ...]`` items; a variant without overrides repeats the defaults."""
    variants: list[Variant] = []
    for label, *overrides in items or []:
        if not _LABEL.match(label) or "=" in label:
            raise UserError(f"--variant label '{label}' is not a name",
                            "start with the label, then its overrides: --variant sdpa runtime.attention=sdpa")
        if label in {v.label for v in variants}:
            raise UserError(f"--variant '{label}' is given twice", "give each variant its own label")
        for item in overrides:
            if "=" not in item:
                raise UserError(f"--variant {label}: '{item}' is not KEY=VALUE",
                                "e.g. --variant nchw runtime.channels_last=off")
        variants.append(Variant(label, tuple(overrides)))
    return variants


def check_configs(presets: list[str], sets: list[str], variants: list[Variant]) -> None:
    """Resolve every preset with every variant's overrides now, so a typo fails in a second
    instead of in each worker after its start-up."""
    for preset in presets:
        for variant in [Variant(), *variants]:
            try:
                C.resolve_config(C.ConfigSources(preset=preset, overrides=[*sets, *variant.overrides]))
            except UserError as exc:
                where = f" (variant {variant.label})" if variant.label else ""
                raise UserError(f"{exc.cause}{where}", exc.fix) from exc


def plan_jobs(presets: list[str], recipes: list[str], variants: list[Variant], gpus: list[int],
              two_node: int) -> list[Job]:
    """Every job, one-GPU runs first (a group of --concurrent jobs then spreads them over the
    GPUs). Variants run the fast recipe; the plain recipe is the fixed reference."""
    shapes = [(g, 1) for g in gpus] + ([(two_node, 2)] if two_node else [])
    jobs = [Job(preset, recipe, variant, count, nodes)
            for preset in presets for recipe in recipes
            for variant in [Variant(), *(variants if recipe == "fast" else [])]
            for count, nodes in shapes]
    return sorted(jobs, key=lambda j: (j.nodes, j.gpus))


def worker_cmd(args, job: Job, out: Path, turns: str | None) -> list[str]:
    cmd = ["-m", "diffscale.bench.worker", "--preset", job.preset, "--recipe", job.recipe, "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--json", str(out), "--plain-workers", str(args.plain_workers)]
    for item in [*(args.set or []), *job.variant.overrides]:  # the variant's own win
        cmd += ["--set", item]
    if job.variant.label:
        cmd += ["--label", job.variant.label]
    if turns:
        cmd += ["--turns", turns]
    if args.peak:
        cmd.append("--peak")
    if args.profile:
        cmd += ["--profile", str(args.profile)]
        if args.trace:
            cmd += ["--trace", str(out.parent / "traces" / out.stem)]
    return cmd


def _visible(indices) -> str:
    """CUDA_VISIBLE_DEVICES for these GPU indices, within the caller's own CUDA_VISIBLE_DEVICES."""
    mine = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return ",".join(mine[i] if i < len(mine) else str(i) for i in indices)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_plan(args, job: Job, out: Path, turns: str | None, gpu: int | None) -> list[tuple[dict, list[str]]]:
    """(extra environment, command) of each process of ``job``; ``gpu``: the one GPU of a
    one-GPU job started beside others (None: whatever is visible)."""
    base = worker_cmd(args, job, out, turns)
    cuda = args.device_type == "cuda"
    run = [sys.executable, "-m", "torch.distributed.run"]
    if job.nodes > 1:  # two torchrun 'nodes' on one host, each with its own GPUs, meeting on localhost
        port, n = _free_port(), job.gpus
        return [({"DIFFSCALE_BENCH_NODES": "2",
                  **({"CUDA_VISIBLE_DEVICES": _visible(range(node * n, (node + 1) * n))} if cuda else {})},
                 [*run, "--nnodes=2", f"--node_rank={node}", f"--nproc_per_node={n}", "--master_addr=127.0.0.1",
                  f"--master_port={port}", *base])
                for node in (0, 1)]
    if job.gpus == 1:
        pinned = {"CUDA_VISIBLE_DEVICES": _visible([gpu])} if cuda and gpu is not None else {}
        return [(pinned, [sys.executable, *base])]
    return [({}, [*run, "--standalone", f"--nproc_per_node={job.gpus}", *base])]


def env(extra: dict | None = None) -> dict:
    out = dict(os.environ, DIFFSCALE_BENCH_T0=str(time.time()), PYTHONUNBUFFERED="1")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        out.pop(key, None)
    out.update(extra or {})
    return out


def groups(jobs: list[Job], concurrent: int) -> list[list[Job]]:
    size = max(1, concurrent)
    return [jobs[i:i + size] for i in range(0, len(jobs), size)]


def gpu_slots(group: list[Job], available: int) -> list[int | None]:
    """The GPU of each one-GPU job of a group started side by side, round robin; None for
    the others (a job alone, or one using several GPUs, sees them all)."""
    if len(group) == 1:
        return [None]
    slots, n = [], 0
    for job in group:
        slots.append(n % max(1, available) if job.gpus == 1 and job.nodes == 1 else None)
        n += job.gpus == 1 and job.nodes == 1
    return slots


def _kill(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)  # the job's whole process group: torchrun and its ranks
            except ProcessLookupError:
                pass
            p.wait()


def run_group(args, group: list[Job], out_dir: Path, available: int, tag: str) -> list[dict | None]:
    """Start the jobs of one group together and wait for them (``--timeout`` for the group).
    A job that fails still counts as ready, so the others do not wait for its turn."""
    turns_dir = out_dir / "turns" / tag if len(group) > 1 else None
    turns = f"{turns_dir}:{len(group)}" if turns_dir else None
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    started: list[tuple[Job, Path, list[subprocess.Popen]]] = []
    try:
        for job, gpu in zip(group, gpu_slots(group, available), strict=True):
            out = out_dir / f"{job.name}.json"
            out.unlink(missing_ok=True)
            with open(out_dir / "logs" / f"{job.name}.log", "a") as log:
                procs = [subprocess.Popen(cmd, env=env(extra), stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True)
                         for extra, cmd in launch_plan(args, job, out, turns, gpu)]
            started.append((job, out, procs))
        deadline = time.monotonic() + args.timeout
        waiting = list(started)
        while waiting and time.monotonic() < deadline:
            for item in list(waiting):
                job, out, procs = item
                if all(p.poll() is not None for p in procs):
                    waiting.remove(item)
                    if turns_dir and not out.is_file():
                        turns_dir.mkdir(parents=True, exist_ok=True)
                        (turns_dir / f"ready-failed-{job.name}").touch()
            time.sleep(0.2)
    finally:
        for _, _, procs in started:
            _kill(procs)
        if turns_dir:
            shutil.rmtree(turns_dir, ignore_errors=True)
    return [json.loads(out.read_text()) if not any(p.returncode for p in procs) and out.is_file() else None
            for _, out, procs in started]


def comm_check(gpus: int, out: Path, log, *, mib: tuple[str, ...] = ("8", "50", "100", "256"),
               repeats: int = 20, timeout: float = 300) -> list[dict]:
    """All-reduce bus bandwidth between ``gpus`` ranks at gradient-bucket sizes
    (``bench.comm``), so a scaling loss can be told from a slow interconnect."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={gpus}",
           "-m", "diffscale.bench.comm", "--mib", *mib, "--repeats", str(repeats), "--json", str(out)]
    out.unlink(missing_ok=True)
    try:
        done = subprocess.run(cmd, env=env(), stdout=log, stderr=subprocess.STDOUT, timeout=timeout)
    except subprocess.TimeoutExpired:
        return []
    return json.loads(out.read_text()) if done.returncode == 0 and out.is_file() else []


def sampling_cmd(args, preset: str, variant: Variant, out: Path) -> list[str]:
    """DDIM sampling against diffusers' DDIMPipeline (``bench.sampling``), same UNet and batch."""
    batch = args.sampling_batch or SAMPLING_BATCH.get(preset, 16)
    cmd = [sys.executable, "-m", "diffscale.bench.sampling", "--preset", preset, "--batch", str(batch),
           "--steps", str(args.sampling_steps), "--repeats", str(args.sampling_repeats), "--json", str(out)]
    for item in [*(args.set or []), *variant.overrides]:
        cmd += ["--set", item]
    return cmd


def run_sampling(args, preset: str, variant: Variant, out_dir: Path) -> dict | None:
    name = f"sampling-{preset}{'-' + variant.label if variant.label else ''}"
    out = out_dir / f"{name}.json"
    out.unlink(missing_ok=True)
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    with open(out_dir / "logs" / f"{name}.log", "a") as log:
        try:
            done = subprocess.run(sampling_cmd(args, preset, variant, out), env=env(), stdout=log,
                                  stderr=subprocess.STDOUT, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            return None
    if done.returncode or not out.is_file():
        return None
    record = dict(json.loads(out.read_text()), label=variant.label or None)
    out.write_text(json.dumps(record, indent=1))
    return record


def command_line(args) -> str:
    """The ``diffscale bench`` command that repeats this measurement (options in a fixed order)."""
    parts = ["diffscale", "bench", "--preset", *(args.preset or ["small"]), "--gpus", args.gpus,
             "--recipe", args.recipe, "--steps", str(args.steps), "--warmup", str(args.warmup)]
    if args.two_node:
        parts += ["--two-node", str(args.two_node)]
    for item in args.set or []:
        parts += ["--set", item]
    for label, *overrides in args.variant or []:
        parts += ["--variant", label, *overrides]
    flags = {"--peak": args.peak, "--comm": args.comm, "--trace": args.trace}
    parts += [flag for flag, on in flags.items() if on]
    if args.profile:
        parts += ["--profile", str(args.profile)]
    if args.concurrent > 1:
        parts += ["--concurrent", str(args.concurrent)]
    if args.sampling:
        parts += ["--sampling", "--sampling-steps", str(args.sampling_steps),
                  "--sampling-repeats", str(args.sampling_repeats)]
        if args.sampling_batch:
            parts += ["--sampling-batch", str(args.sampling_batch)]
    if args.plain_workers != 4:
        parts += ["--plain-workers", str(args.plain_workers)]
    return shlex.join(parts + ["--out", str(args.out)])


def provenance(args, command: str | None = None) -> dict:
    """Date, command, commit and software of this call, for the record (docs/benchmarks.md asks
    every figure for its card, date, command and commit); ``command``: another bench's command
    line (default: this ``diffscale bench`` call's)."""
    import torch

    root = Path(__file__).resolve().parents[3]

    def git(*cmd: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(root), *cmd], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "--short", "HEAD") if (root / ".git").exists() else None
    dirty = bool(git("status", "--porcelain", "--untracked-files=no")) if commit else None
    devices = ([torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
               if torch.cuda.is_available() else ["CPU"])
    return {"date_utc": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M"), "command": command or command_line(args),
            "commit": commit, "uncommitted_changes": dirty, "torch": torch.__version__, "devices": devices}
