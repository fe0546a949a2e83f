"""``diffscale bench``: fast vs plain recipe and scaling efficiency, measured side by side.

The driver starts one worker process group per (preset, recipe, GPU count) -- torchrun
for several GPUs, and two torchrun "nodes" on one host for the multi-node emulation --
collects their JSON records and reports a table, ``bench.json`` and ``bench.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from ..errors import UserError
from ..presets import PRESETS
from .comm import describe
from .profile import render_profile


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker_cmd(args, preset: str, recipe: str, out: Path) -> list[str]:
    cmd = ["-m", "diffscale.bench.worker", "--preset", preset, "--recipe", recipe, "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--json", str(out), "--plain-workers", str(args.plain_workers)]
    for item in args.set or []:
        cmd += ["--set", item]
    if args.peak:
        cmd.append("--peak")
    if args.profile:
        cmd += ["--profile", str(args.profile)]
        if args.trace:
            cmd += ["--trace", str(out.parent / "traces" / out.stem)]
    return cmd


def _env(extra: dict | None = None) -> dict:
    env = dict(os.environ, DIFFSCALE_BENCH_T0=str(time.time()), PYTHONUNBUFFERED="1")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    env.update(extra or {})
    return env


def _run_one(args, preset: str, recipe: str, gpus: int, out: Path, log) -> dict | None:
    base = _worker_cmd(args, preset, recipe, out)
    if gpus == 1:
        procs = [subprocess.Popen([sys.executable, *base], env=_env(), stdout=log, stderr=subprocess.STDOUT)]
    else:
        procs = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                   f"--nproc_per_node={gpus}", *base], env=_env(), stdout=log, stderr=subprocess.STDOUT)]
    return _collect(procs, out, args.timeout)


def _run_two_node(args, preset: str, recipe: str, per_node: int, out: Path, log) -> dict | None:
    """Two torchrun 'nodes' on one host, each with its own GPUs, rendezvousing on localhost."""
    port = _free_port()
    procs = []
    for node in (0, 1):
        extra = {"DIFFSCALE_BENCH_NODES": "2"}
        if args.device_type == "cuda":
            extra["CUDA_VISIBLE_DEVICES"] = ",".join(str(node * per_node + i) for i in range(per_node))
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node_rank={node}",
               f"--nproc_per_node={per_node}", "--master_addr=127.0.0.1", f"--master_port={port}",
               *_worker_cmd(args, preset, recipe, out)]
        procs.append(subprocess.Popen(cmd, env=_env(extra), stdout=log, stderr=subprocess.STDOUT))
    return _collect(procs, out, args.timeout)


def comm_check(gpus: int, out: Path, log, *, mib: tuple[str, ...] = ("8", "50", "100", "256"),
               repeats: int = 20, timeout: float = 300) -> list[dict]:
    """All-reduce bus bandwidth between ``gpus`` ranks at gradient-bucket sizes
    (``bench.comm``), so a scaling loss can be told from a slow interconnect."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={gpus}",
           "-m", "diffscale.bench.comm", "--mib", *mib, "--repeats", str(repeats), "--json", str(out)]
    out.unlink(missing_ok=True)
    try:
        done = subprocess.run(cmd, env=_env(), stdout=log, stderr=subprocess.STDOUT, timeout=timeout)
    except subprocess.TimeoutExpired:
        return []
    return json.loads(out.read_text()) if done.returncode == 0 and out.is_file() else []


def _collect(procs, out: Path, timeout: float) -> dict | None:
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            return None
    if any(p.returncode for p in procs) or not out.is_file():
        return None
    return json.loads(out.read_text())


def add_derived(records: list[dict]) -> list[dict]:
    """Scaling efficiency (vs the same preset and recipe on 1 GPU) and fast / plain ratio."""
    def key(r):  # a labelled variant (e.g. channels_last on) scales against its own 1-GPU run,
        # or the unlabelled one where it has none (a DDP setting changes nothing on 1 GPU)
        return (r["preset"], r["recipe"], r["world_size"], r.get("nodes", 1), r.get("label") or "")

    index = {key(r): r for r in records}
    for r in records:
        one = (index.get((r["preset"], r["recipe"], 1, 1, r.get("label") or ""))
               or index.get((r["preset"], r["recipe"], 1, 1, "")))
        r["scaling_efficiency"] = (r["samples_per_s"] / (r["world_size"] * one["samples_per_s"])) if one else None
        other = index.get((r["preset"], "plain", r["world_size"], r.get("nodes", 1), ""))
        r["fast_over_plain"] = (r["samples_per_s"] / other["samples_per_s"]) if other and r["recipe"] == "fast" else None
    return records


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def render_table(records: list[dict]):
    from rich.table import Table

    table = Table(title="diffscale bench")
    cols = ["preset", "recipe", "GPUs", "nodes", "samples/s", "per GPU", "step ms", "scaling", "fast/plain",
            "peak GiB", "reserved GiB", "TFLOP/s/GPU", "of peak", "data wait", "GPU util", "SM MHz", "start-up s"]
    for col in cols:
        table.add_column(col, no_wrap=True, justify="right" if col not in ("preset", "recipe") else "left")
    for r in records:
        recipe = r["recipe"] + (f" ({r['label']})" if r.get("label") else "")
        table.add_row(r["preset"], recipe, str(r["world_size"]), str(r.get("nodes", 1)),
                      _fmt(r["samples_per_s"], ",.0f"), _fmt(r["samples_per_s_per_gpu"], ",.0f"),
                      _fmt(r["step_s"] * 1000, ".1f"), _fmt(r.get("scaling_efficiency"), ".1%"),
                      _fmt(r.get("fast_over_plain"), ".2f"), _fmt(r["peak_mem_gib"], ".2f"),
                      _fmt(r.get("reserved_gib"), ".2f"), _fmt(r["tflops_per_gpu"], ".1f"), _fmt(r.get("mfu"), ".1%"),
                      _fmt(r["data_wait_share"], ".1%"), _fmt(r.get("gpu_util"), ".0f"),
                      _fmt(r.get("sm_clock_mhz"), ".0f"), _fmt(r["startup_s"], ".0f"))
    return table


def write_chart(records: list[dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    presets = list(dict.fromkeys(r["preset"] for r in records))
    fig, axes = plt.subplots(1, len(presets), figsize=(5 * len(presets), 4), squeeze=False)
    for ax, preset in zip(axes[0], presets):
        rows = [r for r in records if r["preset"] == preset]
        labels = [f"{r['recipe']}{'-' + r['label'] if r.get('label') else ''}\n"
                  f"{r['world_size']}{'x2n' if r.get('nodes', 1) > 1 else ''}" for r in rows]
        colors = ["tab:blue" if r["recipe"] == "fast" else "tab:gray" for r in rows]
        ax.bar(range(len(rows)), [r["samples_per_s_per_gpu"] for r in rows], color=colors)
        ax.set_xticks(range(len(rows)), labels, fontsize=8)
        ax.set_title(f"{preset}: samples/s per GPU")
    fig.suptitle(f"diffscale bench on {records[0]['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def run_bench(args: argparse.Namespace) -> int:
    from rich.console import Console

    console = Console(soft_wrap=True)
    if args.collect:  # report only: nothing is run, so nothing else needs checking
        return report(sorted(Path(args.out).glob("*.json")), Path(args.out), console)
    presets = args.preset or ["small"]
    for name in presets:
        if name not in PRESETS:
            raise UserError(f"unknown preset '{name}'", f"choose from {', '.join(PRESETS)}")
    recipes = [r.strip() for r in args.recipe.split(",") if r.strip()]
    for r in recipes:
        if r not in ("fast", "plain"):
            raise UserError(f"unknown recipe '{r}'", "use fast, plain or fast,plain")
    try:
        gpus = [int(g) for g in args.gpus.split(",") if g.strip()]
    except ValueError as exc:
        raise UserError(f"--gpus '{args.gpus}' is not a list of numbers", "e.g. --gpus 1,2,4") from exc
    if args.trace and not args.profile:
        raise UserError("--trace writes the timeline of the profiled steps, and none are profiled",
                        "add --profile N (e.g. --profile 5)")
    import torch

    args.device_type = "cuda" if torch.cuda.is_available() else "cpu"
    available = torch.cuda.device_count() if args.device_type == "cuda" else os.cpu_count() or 1
    if args.device_type == "cuda" and max(gpus) > available:
        raise UserError(f"--gpus asks for {max(gpus)} GPUs but {available} are visible", f"use --gpus up to {available}")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    records: list[dict] = []
    with open(out_dir / "workers.log", "a") as log:
        for count in sorted({g for g in gpus if g > 1} if args.comm else ()):
            rows = comm_check(count, out_dir / f"comm-{count}.json", log,
                              repeats=20 if args.device_type == "cuda" else 3)
            for r in rows:
                console.print(describe(r), highlight=False)
            if not rows:
                console.print(f"[red]all-reduce check on {count} failed[/]: see {out_dir / 'workers.log'}")
        for preset in presets:
            for recipe in recipes:
                shapes = [(g, 1) for g in gpus] + ([(args.two_node, 2)] if args.two_node else [])
                for count, nodes in shapes:
                    name = f"{preset}-{recipe}-{count}{'x2nodes' if nodes > 1 else 'gpu'}.json"
                    out = out_dir / name
                    out.unlink(missing_ok=True)
                    console.print(f"bench {preset} {recipe} on {count * nodes if nodes > 1 else count} "
                                  f"{'GPUs' if args.device_type == 'cuda' else 'processes'}"
                                  f"{' (2 nodes)' if nodes > 1 else ''} ...", highlight=False)
                    log.flush()
                    record = (_run_two_node(args, preset, recipe, count, out, log) if nodes > 1
                              else _run_one(args, preset, recipe, count, out, log))
                    if record is None:
                        console.print(f"[red]failed[/]: see {out_dir / 'workers.log'}")
                        continue
                    records.append(record)
    if not records:
        raise UserError("every benchmark run failed", f"read {out_dir / 'workers.log'}")
    return _report(records, out_dir, console)


def report(paths: list[Path], out_dir: Path, console) -> int:
    """Table, bench.json and bench.png from worker records already in ``out_dir``."""
    records = []
    for path in paths:
        if path.name == "bench.json":
            continue
        data = json.loads(path.read_text())
        if isinstance(data, dict) and "samples_per_s" in data:
            records.append(data)
    if not records:
        raise UserError(f"no worker records (*.json) in {out_dir}", "run diffscale bench first, or point --out at its folder")
    order = {"fast": 0, "plain": 1}
    records.sort(key=lambda r: (r["preset"], order.get(r["recipe"], 2), r.get("label") or "", r.get("nodes", 1),
                                r["world_size"]))
    return _report(records, out_dir, console)


def _report(records: list[dict], out_dir: Path, console) -> int:
    from rich.console import Console

    add_derived(records)
    Console(width=None if sys.stdout.isatty() else 250).print(render_table(records))
    for record in records:
        if record.get("profile"):
            console.print(render_profile(record), highlight=False, markup=False)
    (out_dir / "bench.json").write_text(json.dumps(records, indent=1))
    chart = write_chart(records, out_dir / "bench.png")
    console.print(f"wrote {out_dir / 'bench.json'} and {chart}", highlight=False)
    return 0


def register(sub) -> None:
    p = sub.add_parser("bench", help="measure samples/s, memory, TFLOP/s and scaling; fast vs plain recipe")
    p.add_argument("--preset", nargs="+", help="presets to measure (default small)")
    p.add_argument("--gpus", default="1", help="GPU counts, e.g. 1,2,4 (processes on a CPU)")
    p.add_argument("--recipe", default="fast,plain", help="fast, plain or fast,plain")
    p.add_argument("--steps", type=int, default=50, help="timed steps after warm-up")
    p.add_argument("--warmup", type=int, default=20, help="untimed steps first (compilation happens here)")
    p.add_argument("--two-node", type=int, default=0, metavar="G",
                   help="also emulate 2 nodes x G GPUs on this host (torchrun --nnodes=2)")
    p.add_argument("--plain-workers", type=int, default=4, help="DataLoader workers of the plain recipe")
    p.add_argument("--peak", action="store_true", help="measure the card's bf16 matmul peak for the MFU column")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="after timing, profile N steps: top kernels, time per kind (convolution, attention, ...) "
                        "and GPU idle time")
    p.add_argument("--trace", action="store_true",
                   help="with --profile: also write each rank's Chrome trace (Perfetto) to OUT/traces/RUN/rankR.json")
    p.add_argument("--comm", action="store_true",
                   help="first measure all-reduce bus bandwidth between the GPUs of each count above 1 "
                        "(NVLink: a few hundred GB/s; through host memory: tens at most)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="config override for every run")
    p.add_argument("--collect", action="store_true",
                   help="only report: rebuild the table, bench.json and bench.png from the worker records in --out")
    p.add_argument("--timeout", type=float, default=900, help="seconds per run before it is killed")
    p.add_argument("--out", default="bench", help="folder for bench.json, bench.png and worker logs")
    p.set_defaults(func=run_bench)
