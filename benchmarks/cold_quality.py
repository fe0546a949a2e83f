"""Time to quality from a cold start, as a new user meets it: the plain recipe trained for its
budget (``benchmarks.quality_time --recipe plain``: its clock counts training only), then
``diffscale train --preset P`` started on an empty cache (kernels, traced network, built-in data:
eager steps while the step compiles in the background, as a run starts by default) and stopped
``--seconds`` after the command started, with a checkpoint every ``--checkpoint-every`` steps.
Each checkpoint's EMA weights are scored afterwards as quality_time scores (the same sample count,
sampler, steps, seed and feature network), at the seconds from the command's start to the step's
logged record. The figure: when the cold run reached the plain recipe's final FD, as a share of
the plain recipe's budget (target: at most 25 %).

``python -m benchmarks.cold_quality --preset small --seconds 240 --out DIR``

``--plain-json FILE`` reads the plain recipe's record from a ``quality_time.json`` instead of
training it: an earlier one, or one the plain recipe writes meanwhile on another GPU of the machine
(read once the cold run is scored). Writes ``DIR/cold_quality.json`` (provenance, the plain recipe's record, the cold
run's points and events, the summary) and ``DIR/cold_quality.md``; the runs stay under DIR
(``plain/``, ``cold/run``, ``cold/cache``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.quality_time_report import time_to_reach
from diffscale.io.numbers import cell

TARGET_SHARE = 0.25
"""A cold run reaches the plain recipe's final quality in at most this share of its budget."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cold_quality", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="small", help="image preset (default small)")
    parser.add_argument("--seconds", type=float, default=240.0, help="the plain recipe's training seconds, and the "
                        "cold run's wall seconds from its command's start (default 240)")
    parser.add_argument("--checkpoint-every", type=int, default=100, help="the cold run's checkpoint interval: "
                        "the points scored (default 100)")
    parser.add_argument("--evals", type=int, default=8, help="the plain recipe's evaluations (default 8)")
    parser.add_argument("--count", type=int, default=512, help="samples per evaluation (default 512)")
    parser.add_argument("--eval-steps", type=int, default=20, help="sampling steps per evaluation (default 20)")
    parser.add_argument("--sampler", choices=["ddim", "dpmsolver", "ddpm"], default="ddim")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="overrides of both runs")
    parser.add_argument("--plain-json", type=Path, help="the plain recipe's quality_time.json, trained earlier or "
                        "meanwhile on another GPU: read once the cold run is scored (waited for up to --plain-wait s)")
    parser.add_argument("--plain-wait", type=float, default=600.0,
                        help="seconds to wait for --plain-json (default 600)")
    parser.add_argument("--out", type=Path, required=True, help="folder for the runs and the results")
    args = parser.parse_args(argv)
    if not (args.seconds > 0 and args.checkpoint_every > 0 and args.evals > 0 and args.eval_steps > 0):
        parser.error("--seconds, --checkpoint-every, --evals and --eval-steps must be more than 0")
    if args.count < 2:
        parser.error("--count must be at least 2 (a Frechet distance fits a covariance)")
    return args


def _sets(items: list[str]) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


def plain_record(args: argparse.Namespace) -> dict[str, Any]:
    """The plain recipe's quality_time record: read from --plain-json, or trained now."""
    path = args.plain_json
    if path is None:
        path = args.out / "plain" / "quality_time.json"
        cmd = [sys.executable, "-m", "benchmarks.quality_time", "--preset", args.preset, "--recipe", "plain",
               "--seconds", str(args.seconds), "--evals", str(args.evals), "--count", str(args.count),
               "--eval-steps", str(args.eval_steps), "--sampler", args.sampler, *_sets(args.set),
               "--out", str(path.parent)]
        print(f"[cold-quality] the plain recipe, {args.seconds:g} s: {' '.join(cmd[1:])}", flush=True)
        subprocess.run(cmd, check=True)
    waited = time.perf_counter()
    while not path.exists() and time.perf_counter() - waited < args.plain_wait:
        time.sleep(2.0)  # the plain recipe still trains beside this run, on another GPU
    if not path.exists():
        raise SystemExit(f"{path}: not there after {args.plain_wait:g} s (the plain recipe's quality_time.json)")
    runs = json.loads(path.read_text())["runs"]
    plain = next((r for r in runs if r["recipe"] == "plain" and r["preset"] == args.preset), None)
    if plain is None:
        raise SystemExit(f"{path} holds no plain-recipe run of preset {args.preset}")
    return plain


def cold_run(args: argparse.Namespace) -> tuple[Path, float, float]:
    """``diffscale train`` on an empty cache, stopped (SIGTERM: a checkpoint, exit 85) ``--seconds``
    after it started; its run dir, its start and stop (epoch seconds)."""
    work = args.out / "cold"
    shutil.rmtree(work, ignore_errors=True)
    run_dir = work / "run"
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    env.update(DIFFSCALE_CACHE_DIR=str(work / "cache"), TRITON_CACHE_DIR=str(work / "triton"), PYTHONUNBUFFERED="1")
    every = args.checkpoint_every
    cmd = [sys.executable, "-m", "diffscale", "train", "--preset", args.preset, "--out", str(run_dir),
           *_sets([f"train.checkpoint_every={every}", f"train.log_every={every}", "train.keep_checkpoints=1000",
                   *args.set])]
    work.mkdir(parents=True)
    print(f"[cold-quality] cold: {' '.join(cmd[1:])}", flush=True)
    with (work / "train.out").open("w") as log:
        started = time.time()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        while proc.poll() is None and time.time() - started < args.seconds:
            time.sleep(0.2)
        stopped = time.time()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=600)
    if code not in (0, 85):
        raise SystemExit(f"the cold run ended with exit {code}: see {work / 'train.out'}")
    return run_dir, started, stopped


def scored_points(run_dir: Path, logged: dict[int, float], started: float, stopped: float,
                  args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each checkpoint's EMA scored as quality_time scores, at the seconds since the command started
    that its step was logged (the stop for the checkpoint the stop signal wrote)."""
    import torch

    from benchmarks.quality_time import EvalSpec
    from diffscale.inference.trained import load_trained
    from diffscale.runtime import checkpoint as ckpt

    spec = EvalSpec(count=args.count, steps=args.eval_steps, sampler=args.sampler)
    run = load_trained(run_dir)

    def autocast() -> torch.autocast:  # as quality_time samples: bf16 on CUDA
        return torch.autocast(run.device.type, dtype=torch.bfloat16, enabled=run.device.type == "cuda")

    points = []
    for path in ckpt.list_checkpoints(run_dir):
        step = ckpt.step_of(path)
        run.network.load_state_dict(ckpt.load_checkpoint(path).ema)
        features = run.task.quality_features(run.network, count=spec.count, steps=spec.steps, seed=spec.seed,
                                             sampler=spec.sampler, autocast=autocast)
        scores = run.task.quality_scores(features)
        points.append({"seconds": logged.get(step, stopped) - started, "steps": step, "fd": scores["fd"],
                       "precision": scores["precision"], "recall": scores["recall"]})
        print(f"[cold-quality] step {step}: {points[-1]['seconds']:.1f} s after the start, FD {scores['fd']:.3f}",
              flush=True)
    return sorted(points, key=lambda p: p["seconds"])


def summary(plain: dict[str, Any], points: list[dict[str, Any]]) -> dict[str, Any]:
    target, budget = plain["points"][-1]["fd"], plain["points"][-1]["seconds"]
    reach = time_to_reach([(p["seconds"], p["fd"]) for p in points], target)
    share = reach / budget if reach is not None and budget > 0 else None
    return {"plain_final_fd": target, "plain_seconds": budget, "cold_final_fd": points[-1]["fd"] if points else None,
            "reach_plain_final_s": reach, "share_of_plain_time": share,
            "target_met": share is not None and share <= TARGET_SHARE}


def markdown(about: dict[str, Any], result: dict[str, Any], points: list[dict[str, Any]], events: dict) -> str:
    lines = [f"Cold time to quality, {about['preset']}, {about['date_utc']} UTC, {about['device']}, "
             f"commit {about['commit']}:", f"`{about['command']}`", "",
             f"The plain recipe's final FD {result['plain_final_fd']:.3f} after {result['plain_seconds']:.0f} s of "
             f"training; the cold run reached it {cell(result['reach_plain_final_s'], '.1f')} s after its command "
             f"started ({cell(result['share_of_plain_time'] and 100 * result['share_of_plain_time'], '.1f')} % of the "
             f"plain recipe's time; target <= {100 * TARGET_SHARE:.0f} %: "
             f"{'met' if result['target_met'] else 'missed'}). First step at {cell(events['first_step_s'], '.1f')} s "
             f"(logged by compiled runs), compiled from step {cell(events['compiled_step'], 'd')}.",
             "", "| seconds from the start | step | FD | precision | recall |", "|---:|---:|---:|---:|---:|"]
    lines += [f"| {p['seconds']:.1f} | {p['steps']} | {p['fd']:.3f} | {p['precision']:.3f} | {p['recall']:.3f} |"
              for p in points]
    return "\n".join(lines) + "\n"


def _events(records: list[dict[str, Any]], started: float) -> dict[str, Any]:
    events = {e["kind"]: e for e in records}
    first, compiled = events.get("first_step"), events.get("compiled")
    return {"first_step_s": first["time"] - started if first and "time" in first else None,
            "compiled_step": compiled["step"] if compiled else None}


def main(argv: list[str] | None = None) -> int:
    import shlex

    from diffscale.bench.runs import provenance
    from diffscale.io.atomic import write_text
    from diffscale.io.rundir import read_records

    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    plain = plain_record(args) if args.plain_json is None else None  # trained first, on this GPU; else read last
    run_dir, started, stopped = cold_run(args)
    training, records = read_records(run_dir)
    logged = {r["step"]: r["time"] for r in training if "time" in r}  # when each step was logged
    points = scored_points(run_dir, logged, started, stopped, args)
    if plain is None:  # trained beside this run on another GPU, or earlier
        plain = plain_record(args)
    result, events = summary(plain, points), _events(records, started)
    command = shlex.join(["python", "-m", "benchmarks.cold_quality", *(sys.argv[1:] if argv is None else argv)])
    about = {**provenance(args, command=command),
             "preset": args.preset, "device": plain.get("device", "-")}
    write_text(args.out / "cold_quality.json", json.dumps(
        {"about": about, "summary": result, "events": events, "plain": plain, "points": points}, indent=1))
    table = markdown(about, result, points, events)
    write_text(args.out / "cold_quality.md", table)
    print(table, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
