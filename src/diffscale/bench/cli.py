"""``diffscale bench``: fast vs plain recipe and scaling efficiency, measured side by side.

The driver starts one worker process group per (preset, recipe, variant, GPU count) --
torchrun for several GPUs, and two torchrun "nodes" on one host for the multi-node emulation
(``bench.runs``) -- one at a time or ``--concurrent`` side by side, optionally times DDIM
sampling against diffusers' pipeline, collects the JSON records and reports tables,
``bench.json``, ``sampling.json`` and ``bench.png``, with the date, command and commit of each
call (``provenance.jsonl``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from diffscale.bench.runs import (
    Job,
    Variant,
    check_configs,
    comm_check,
    gpu_slots,
    groups,
    launch_plan,
    parse_variants,
    plan_jobs,
    provenance,
    run_group,
    run_sampling,
    sampling_cmd,
)
from diffscale.config.presets import PRESETS
from diffscale.errors import UserError
from diffscale.io.numbers import cell
from diffscale.io.paths import folder_target

__all__ = ["add_derived", "comm_check", "register", "report", "run_bench"]


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
        r["fast_over_plain"] = ((r["samples_per_s"] / other["samples_per_s"])
                                if other and r["recipe"] == "fast" else None)
    return records


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
                      cell(r["samples_per_s"], ",.0f"), cell(r["samples_per_s_per_gpu"], ",.0f"),
                      cell(r["step_s"] * 1000, ".1f"), cell(r.get("scaling_efficiency"), ".1%"),
                      cell(r.get("fast_over_plain"), ".2f"), cell(r["peak_mem_gib"], ".2f"),
                      cell(r.get("reserved_gib"), ".2f"), cell(r["tflops_per_gpu"], ".1f"), cell(r.get("mfu"), ".1%"),
                      cell(r["data_wait_share"], ".1%"), cell(r.get("gpu_util"), ".0f"),
                      cell(r.get("sm_clock_mhz"), ".0f"), cell(r["startup_s"], ".0f"))
    return table


def write_chart(records: list[dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    presets = list(dict.fromkeys(r["preset"] for r in records))
    fig, axes = plt.subplots(1, len(presets), figsize=(5 * len(presets), 4), squeeze=False)
    for ax, preset in zip(axes[0], presets, strict=True):
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


def render_sampling(records: list[dict]):
    from rich.table import Table

    table = Table(title="DDIM sampling: diffscale vs diffusers' DDIMPipeline (same UNet, batch and steps)")
    for col in ("preset", "variant", "batch", "steps", "DDIMPipeline s", "diffscale s", "speed-up", "images/s"):
        table.add_column(col, no_wrap=True, justify="left" if col in ("preset", "variant") else "right")
    for r in records:
        table.add_row(r["preset"], r.get("label") or "default", str(r["batch"]), str(r["ddim_steps"]),
                      f"{r['ddimpipeline_s']:.4f}", f"{r['diffscale_s']:.4f}", f"{r['speedup']:.2f}",
                      f"{r['images_per_s']:,.0f}")
    return table


def _check_counts(args: argparse.Namespace) -> None:
    """Counts below their range would run and report nonsense (a negative throughput): refused first."""
    for flag, value, least in (("--steps", args.steps, 1), ("--warmup", args.warmup, 0),
                               ("--two-node", args.two_node, 0), ("--plain-workers", args.plain_workers, 0),
                               ("--profile", args.profile, 0),
                               ("--sampling-steps", args.sampling_steps, 1),
                               ("--sampling-repeats", args.sampling_repeats, 1),
                               ("--sampling-batch", args.sampling_batch, 0)):
        if value < least:
            raise UserError(f"{flag} {value} is out of range (it must be {least} or more)", f"e.g. {flag} {least + 1}")
    if not args.timeout > 0:
        raise UserError(f"--timeout {args.timeout:g} is out of range (seconds, more than 0)", "e.g. --timeout 900")


def _options(args: argparse.Namespace) -> tuple[list[str], list[str], list[int], list[Variant]]:
    """Presets, recipes, GPU counts and variants, each checked before anything starts."""
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
    if not gpus or min(gpus) < 1:
        raise UserError(f"--gpus '{args.gpus}' is out of range: every count is 1 or more", "e.g. --gpus 1,2,4")
    _check_counts(args)
    if args.trace and not args.profile:
        raise UserError("--trace writes the timeline of the profiled steps, and none are profiled",
                        "add --profile N (e.g. --profile 5)")
    variants = parse_variants(args.variant)
    if variants and "fast" not in recipes:
        raise UserError("--variant changes the fast recipe, and --recipe has no fast",
                        "use --recipe fast or fast,plain")
    if args.concurrent < 1:
        raise UserError(f"--concurrent {args.concurrent} starts no run", "use 1 (one at a time) or more")
    check_configs(presets, args.set or [], variants)
    return presets, recipes, gpus, variants


def run_bench(args: argparse.Namespace) -> int:
    from rich.console import Console

    console = Console(soft_wrap=True)
    if args.collect:  # report only: nothing is run, so nothing else needs checking
        return report(sorted(Path(args.out).glob("*.json")), Path(args.out), console)
    presets, recipes, gpus, variants = _options(args)
    import torch

    args.device_type = "cuda" if torch.cuda.is_available() or args.dry_run else "cpu"
    needed = max(gpus + [2 * args.two_node])
    if torch.cuda.is_available():
        available = torch.cuda.device_count()
    elif args.dry_run:  # no GPU here: plan for those CUDA_VISIBLE_DEVICES lists, or as many as asked for
        listed = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
        available = max(needed, len(listed))
    else:
        available = os.cpu_count() or 1
    if args.device_type == "cuda" and needed > available:
        raise UserError(f"--gpus asks for {needed} GPUs but {available} are visible", f"use --gpus up to {available}")
    jobs = plan_jobs(presets, recipes, variants, gpus, args.two_node)
    samplings = [(p, v) for p in presets for v in [Variant(), *variants]] if args.sampling else []
    out_dir = folder_target(args.out, "--out")
    if args.dry_run:
        return _dry_run(args, jobs, samplings, out_dir, available, console)
    out_dir.mkdir(parents=True, exist_ok=True)
    info = provenance(args)
    with open(out_dir / "provenance.jsonl", "a") as f:
        f.write(json.dumps(info) + "\n")
    _comm(args, gpus, out_dir, console)
    records: list[dict] = []
    for k, group in enumerate(groups(jobs, args.concurrent)):
        for job in group:
            console.print(f"bench {_describe(job, args.device_type)} ...", highlight=False)
        for job, record in zip(group, run_group(args, group, out_dir, available, f"{os.getpid()}-{k}"), strict=True):
            if record is None:
                console.print(f"[red]failed[/]: {job.name}, see {out_dir / 'logs' / (job.name + '.log')}")
            else:
                records.append(record)
    sampled = []
    for preset, variant in samplings:
        console.print(f"sampling {preset}{' ' + variant.label if variant.label else ''} ...", highlight=False)
        record = run_sampling(args, preset, variant, out_dir)
        if record is None:
            console.print(f"[red]failed[/]: sampling {preset}, see {out_dir / 'logs'}")
        else:
            sampled.append(record)
    if not records and not sampled:
        raise UserError("every benchmark run failed", f"read the logs in {out_dir / 'logs'}")
    return _report(records, sampled, [info], out_dir, console)


def _describe(job: Job, device_type: str) -> str:
    count = job.gpus * job.nodes
    unit = ("GPUs" if count > 1 else "GPU") if device_type == "cuda" else ("processes" if count > 1 else "process")
    label = f" ({job.variant.label})" if job.variant.label else ""
    return f"{job.preset} {job.recipe}{label} on {count} {unit}{' (2 nodes)' if job.nodes > 1 else ''}"


def _comm(args, gpus: list[int], out_dir: Path, console) -> None:
    if not args.comm:
        return
    from diffscale.bench.comm import describe

    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    for count in sorted({g for g in gpus if g > 1}):
        with open(out_dir / "logs" / f"comm-{count}.log", "a") as log:
            rows = comm_check(count, out_dir / f"comm-{count}.json", log,
                              repeats=20 if args.device_type == "cuda" else 3)
        for r in rows:
            console.print(describe(r), highlight=False)
        if not rows:
            console.print(f"[red]all-reduce check on {count} failed[/]: see {out_dir / 'logs' / f'comm-{count}.log'}")


def _dry_run(args, jobs: list[Job], samplings: list[tuple[str, Variant]], out_dir: Path, available: int,
             console) -> int:
    """What a call would start, and where, without starting anything."""
    import shlex

    parts = groups(jobs, args.concurrent)
    unit = "GPU" if args.device_type == "cuda" else "process"
    console.print(f"{len(jobs)} runs in {len(parts)} group(s) of at most {args.concurrent}, on {available} "
                  f"{unit}{'' if available == 1 else 'es' if unit == 'process' else 's'}:", highlight=False)
    for k, group in enumerate(parts):
        turns = f"{out_dir / 'turns' / f'PID-{k}'}:{len(group)}" if len(group) > 1 else None
        console.print(f"group {k + 1}:{' compiled side by side, timed one at a time' if turns else ''}",
                      highlight=False)
        for job, gpu in zip(group, gpu_slots(group, available), strict=True):
            console.print(f"  {job.name}: {_describe(job, args.device_type)}", highlight=False)
            for extra, cmd in launch_plan(args, job, out_dir / f"{job.name}.json", turns, gpu):
                env = " ".join(f"{key}={value}" for key, value in extra.items())
                console.print(f"    {env + ' ' if env else ''}{shlex.join(cmd)}", highlight=False, markup=False)
    for preset, variant in samplings:
        name = f"sampling-{preset}{'-' + variant.label if variant.label else ''}"
        cmd = sampling_cmd(args, preset, variant, out_dir / f"{name}.json")
        console.print(f"{name}: {shlex.join(cmd)}", highlight=False, markup=False)
    return 0


def report(paths: list[Path], out_dir: Path, console) -> int:
    """Tables, bench.json, sampling.json and bench.png from records already in ``out_dir``."""
    records, sampled = [], []
    for path in paths:
        if path.name in ("bench.json", "sampling.json"):
            continue
        data = json.loads(path.read_text())
        if isinstance(data, dict) and "samples_per_s" in data:
            records.append(data)
        elif isinstance(data, dict) and "ddimpipeline_s" in data:
            sampled.append(data)
    if not records and not sampled:
        raise UserError(f"no worker records (*.json) in {out_dir}",
                        "run diffscale bench first, or point --out at its folder")
    info_path = out_dir / "provenance.jsonl"
    lines = info_path.read_text().splitlines() if info_path.is_file() else []
    infos = [json.loads(line) for line in lines if line.strip()]
    return _report(records, sampled, infos, out_dir, console)


def _report(records: list[dict], sampled: list[dict], infos: list[dict], out_dir: Path, console) -> int:
    from rich.console import Console

    order = {"fast": 0, "plain": 1}
    records.sort(key=lambda r: (r["preset"], order.get(r["recipe"], 2), r.get("label") or "", r.get("nodes", 1),
                                r["world_size"]))
    sampled.sort(key=lambda r: (r["preset"], r.get("label") or ""))
    wide = Console(width=None if sys.stdout.isatty() else 250)
    written = []
    if records:
        from diffscale.bench.profile import render_profile

        add_derived(records)
        wide.print(render_table(records))
        for record in records:
            if record.get("profile"):
                console.print(render_profile(record), highlight=False, markup=False)
        (out_dir / "bench.json").write_text(json.dumps(records, indent=1))
        written += [out_dir / "bench.json", write_chart(records, out_dir / "bench.png")]
    if sampled:
        wide.print(render_sampling(sampled))
        (out_dir / "sampling.json").write_text(json.dumps(sampled, indent=1))
        written.append(out_dir / "sampling.json")
    for info in infos:
        changes = " with uncommitted changes" if info.get("uncommitted_changes") else ""
        console.print(f"measured {info['date_utc']} UTC, commit {info.get('commit') or 'unknown'}{changes}, "
                      f"torch {info['torch']}, {', '.join(dict.fromkeys(info['devices']))}: {info['command']}",
                      highlight=False, markup=False)
    console.print(f"wrote {', '.join(str(p) for p in written)}", highlight=False)
    return 0


def register(sub) -> None:
    from diffscale.cli_parser import verb

    p = verb(sub, "bench", "measure samples/s, memory, TFLOP/s and scaling; fast vs plain recipe",
             "diffscale bench --preset small medium --gpus 1,2,4 --recipe fast,plain --out bench")
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
    p.add_argument("--variant", action="append", nargs="+", metavar=("LABEL", "KEY=VALUE"),
                   help="also measure the fast recipe with these overrides, labelled LABEL, beside the defaults "
                        "(repeatable; no overrides: the defaults again, to see the spread)")
    p.add_argument("--concurrent", type=int, default=1, metavar="N",
                   help="start N runs at once: they compile side by side and are timed one at a time; one-GPU "
                        "runs go round robin over the GPUs (80 GiB cards: at most two one-GPU runs per card, "
                        "four jobs per card in all, while CUDA-graph pools compile)")
    p.add_argument("--sampling", action="store_true",
                   help="also time DDIM sampling per preset (and variant) against diffusers' DDIMPipeline")
    p.add_argument("--sampling-batch", type=int, default=0, metavar="B",
                   help="sampling batch (default: small 256, medium 64, xl 16, else 16)")
    p.add_argument("--sampling-steps", type=int, default=50, metavar="N", help="DDIM steps of the sampling comparison")
    p.add_argument("--sampling-repeats", type=int, default=3, metavar="N", help="timed calls of each sampler")
    p.add_argument("--dry-run", action="store_true",
                   help="print the runs (groups, GPUs, commands) and start nothing; without a GPU here, planned "
                        "for the GPUs CUDA_VISIBLE_DEVICES lists (e.g. 0,1,2,3), else as many as --gpus needs")
    p.add_argument("--collect", action="store_true",
                   help="only report: rebuild the tables, bench.json, sampling.json and bench.png from the records "
                        "in --out")
    p.add_argument("--timeout", type=float, default=900,
                   help="seconds per run (per group with --concurrent) before it is killed")
    p.add_argument("--out", default="bench", help="folder for bench.json, bench.png, records and logs/")
    p.set_defaults(func=run_bench)
