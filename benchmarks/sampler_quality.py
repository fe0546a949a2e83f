"""Sampling at equal quality: the Frechet distance and sampling time of each sampler and step
count, from one trained checkpoint, against DDIM with 50 steps.

``python -m benchmarks.sampler_quality --run RUN_DIR --out DIR``

The run's EMA network runs as ``diffscale sample`` runs it (``sampling_network``: compiled with
CUDA graphs and frozen weights on a GPU). Every sampler starts from the same seeded noise, so the
differences between rows are the samplers' own. Each row: one untimed call (compiles, records
graphs), ``--repeats`` timed calls of ``--count`` images in one batch, and the FD, precision and
recall of those images in the data set's feature network against the run's ``train.eval_count``
data images. The verdict says whether DPM-Solver++ at 15 or 20 steps is within 5 % of DDIM-50's
FD, and how much less its sampling costs. Writes ``DIR/sampler_quality.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch

from diffscale.errors import UserError

DEFAULT_SAMPLERS = ("ddim:50", "ddim:20", "ddim:10", "dpmsolver:10", "dpmsolver:15", "dpmsolver:20")
REFERENCE = ("ddim", 50)
CANDIDATE_STEPS = (15, 20)
"""DPM-Solver++ step counts that may replace DDIM-50 as the default."""
WITHIN = 0.05
"""Relative FD margin of "equal quality"."""


def parse_samplers(items: list[str]) -> list[tuple[str, int]]:
    """``KIND:STEPS`` items, e.g. ``dpmsolver:20``."""
    parsed = []
    for item in items:
        kind, sep, steps = item.partition(":")
        if not sep or kind not in ("ddim", "dpmsolver", "ddpm") or not steps.isdigit() or int(steps) < 1:
            raise UserError(f"--samplers item '{item}' is not KIND:STEPS",
                            "use ddim, dpmsolver or ddpm with a step count, e.g. dpmsolver:20")
        parsed.append((kind, int(steps)))
    return parsed


def verdict(rows: list[dict]) -> dict:
    """Each row's FD and time against DDIM-50's, and whether DPM-Solver++ at 15-20 steps is within
    ``WITHIN`` of its FD; the cheapest such row is the one to default to."""
    reference = next((r for r in rows if (r["sampler"], r["steps"]) == REFERENCE), None)
    if reference is None:
        return {"reference": None, "dpmsolver_within": None, "default_candidate": None}
    for r in rows:
        r["fd_vs_ddim50"] = r["fd"] / reference["fd"] - 1 if reference["fd"] > 0 else None
        r["speedup_vs_ddim50"] = reference["seconds"] / r["seconds"] if r["seconds"] > 0 else None
    candidates = [r for r in rows if r["sampler"] == "dpmsolver" and r["steps"] in CANDIDATE_STEPS]
    good = [r for r in candidates if r["fd"] <= reference["fd"] * (1 + WITHIN)]
    best = min(good, key=lambda r: r["seconds"]) if good else None
    return {"reference": f"{REFERENCE[0]}:{REFERENCE[1]}", "reference_fd": reference["fd"],
            "dpmsolver_within": bool(good) if candidates else None,
            "default_candidate": f"dpmsolver:{best['steps']}" if best else None,
            "cost_ratio": reference["seconds"] / best["seconds"] if best else None}


def markdown(rows: list[dict], summary: dict, about: dict) -> str:
    lines = [f"Samplers at equal quality on {about['device']}, {about['date_utc']} UTC, commit "
             f"{about.get('commit') or '-'}: run {about['run']} (step {about['step']}), {about['count']} samples "
             f"in one batch, the same seeded noise for every row; FD in the data set's feature network.", "",
             "| sampler | steps | FD | vs DDIM-50 | precision | recall | sampling s | images/s | cost vs DDIM-50 |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        change = "-" if r.get("fd_vs_ddim50") is None else f"{r['fd_vs_ddim50']:+.1%}"
        speed = "-" if r.get("speedup_vs_ddim50") is None else f"{1 / r['speedup_vs_ddim50']:.2f} x"
        lines.append(f"| {r['sampler']} | {r['steps']} | {r['fd']:.3f} | {change} | {r['precision']:.3f} | "
                     f"{r['recall']:.3f} | {r['seconds']:.4f} | {r['images_per_s']:,.0f} | {speed} |")
    if summary["dpmsolver_within"] is None:
        lines += ["", "No verdict: the table needs ddim:50 and dpmsolver at 15 or 20 steps."]
    elif summary["default_candidate"]:
        lines += ["", f"DPM-Solver++ is within {WITHIN:.0%} of DDIM-50's FD: {summary['default_candidate']} samples "
                  f"{summary['cost_ratio']:.2f} x cheaper (the table supports it as `diffscale sample`'s default)."]
    else:
        lines += ["", f"DPM-Solver++ at {' or '.join(map(str, CANDIDATE_STEPS))} steps is not within {WITHIN:.0%} "
                  "of DDIM-50's FD: DDIM stays the default."]
    return "\n".join(lines) + "\n"


def measure(run_dir: Path, samplers: list[tuple[str, int]], *, count: int | None, repeats: int, seed: int,
            say: Callable[[str], None] = print) -> tuple[list[dict], dict]:
    """One row per sampler (see the module docstring) and what the run was."""
    from diffscale.diffusion.inference import sampling_network
    from diffscale.inference.trained import load_trained
    from diffscale.runtime.device import synchronize

    run = load_trained(run_dir)
    count = count or run.cfg.train.eval_count
    network = sampling_network(run.network, run.cfg.runtime)
    run.task.prepare_quality()
    rows = []
    for kind, steps in samplers:
        steps = min(steps, run.cfg.diffusion.num_train_timesteps)

        def generate(kind: str = kind, steps: int = steps) -> torch.Tensor:
            return run.task.generate(network, count=count, steps=steps, seed=seed, sampler=kind).samples

        start = time.perf_counter()
        generate()  # compiles, records graphs
        synchronize(run.device)
        first = time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(repeats):
            generate()
        synchronize(run.device)
        seconds = (time.perf_counter() - start) / repeats
        scores = run.task.quality_scores(run.task.quality_features(network, count=count, steps=steps, seed=seed,
                                                                   sampler=kind))
        rows.append({"sampler": kind, "steps": steps, "count": count, "seconds": seconds, "first_call_s": first,
                     "images_per_s": count / seconds, **scores})
        say(f"{kind} {steps} steps: FD {scores['fd']:.3f}, {seconds:.4f} s for {count} images")
    about = {"run": str(run_dir), "step": run.step, "preset": run.cfg.preset, "count": count, "seed": seed,
             "repeats": repeats, "precision": network.policy.precision.value, "compiled": network.policy.compile,
             "device": torch.cuda.get_device_name(run.device) if run.device.type == "cuda" else "CPU"}
    return rows, about


def main(argv: list[str] | None = None) -> int:
    import shlex
    import sys

    from diffscale.bench.runs import provenance
    from diffscale.io.atomic import write_text

    parser = argparse.ArgumentParser(prog="python -m benchmarks.sampler_quality", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", type=Path, required=True,
                        help="a trained run (e.g. benchmarks.quality_time's PRESET-fast)")
    parser.add_argument("--samplers", nargs="+", default=list(DEFAULT_SAMPLERS), metavar="KIND:STEPS",
                        help=f"default: {' '.join(DEFAULT_SAMPLERS)}")
    parser.add_argument("--count", type=int, help="images per row, one batch (default: the run's train.eval_count)")
    parser.add_argument("--repeats", type=int, default=2, help="timed calls per row (default 2)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True, help="folder for sampler_quality.json and .md")
    args = parser.parse_args(argv)
    if args.repeats < 1 or (args.count is not None and args.count < 2):
        parser.error("--repeats must be at least 1 and --count at least 2")
    samplers = parse_samplers(args.samplers)
    rows, about = measure(args.run, samplers, count=args.count, repeats=args.repeats, seed=args.seed,
                          say=lambda text: print(f"[sampler-quality] {text}", flush=True))
    summary = verdict(rows)
    command = shlex.join(["python", "-m", "benchmarks.sampler_quality", *(argv or sys.argv[1:])])
    about = {**provenance(args, command=command), **about}
    args.out.mkdir(parents=True, exist_ok=True)
    write_text(args.out / "sampler_quality.json", json.dumps({"about": about, "summary": summary, "rows": rows},
                                                             indent=1))
    table = markdown(rows, summary, about)
    write_text(args.out / "sampler_quality.md", table)
    print(table, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
