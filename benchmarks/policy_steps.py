"""A policy preset's step count, chosen from a table: success rate and route shares through the
``Controller`` for several training step counts x seeds, each a CPU training of one thread on a
core of its own, side by side.

``python -m benchmarks.policy_steps --steps 800 1600 2400 --seeds 0 1 2 --cores 6-14 --json
OUT.json --markdown OUT.md`` trains ``--preset`` (default policy-tiny) on ``--data`` (default
builtin:reach2d-routes) with ``train.steps`` and ``train.seed`` set, as ``diffscale train``
does, then rolls it out as ``diffscale eval`` does: ``Controller.load`` with the run's defaults
(DDPM, ``train.sample_steps``), ``--episodes`` episodes seeded 1000 + i. Each (steps, seed) is
its own process pinned to one of ``--cores`` (more pairs than cores wait for a free one). The
table gives, per step count, each seed's success and largest route-share gap, and how many
seeds meet the bar (success >= 0.9, every route within 10 points of the demonstrations' share).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import child_env
from benchmarks.quality_clock import markdown_table, publish

EPISODE_SEED = 1000
SUCCESS_BAR = 0.9
GAP_BAR = 0.10


def parse_cores(text: str | None) -> list[int]:
    """``6-14``, ``0,2,4`` or both mixed (``0-3,8``); None: the cores this process may use."""
    if not text:
        return sorted(os.sched_getaffinity(0))
    cores: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        cores += list(range(int(first), int(last or first) + 1))
    return cores


def train_and_roll_out(args: argparse.Namespace) -> dict[str, Any]:
    """One (steps, seed): train on the CPU with one thread, then roll out through the controller."""
    import torch
    from rich.console import Console

    from diffscale import config as C
    from diffscale.policy import Controller
    from diffscale.tasks.policy.envs.rollout import environment_for, rollouts
    from diffscale.training.loop import train

    if args.core is not None:
        os.sched_setaffinity(0, {args.core})
    torch.set_num_threads(1)
    steps, seed = args.worker
    cfg = C.resolve_config(C.ConfigSources(
        preset=args.preset, data=args.data, device="cpu",
        overrides=[*(args.set or []), f"train.steps={steps}", f"train.seed={seed}", "runtime.cpu_threads=1",
                   f"train.checkpoint_every={steps}"]))
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        outcome = train(cfg, Path(tmp) / "run", console=Console(quiet=True))
        train_s = time.perf_counter() - start
        controller = Controller.load(Path(tmp) / "run", device="cpu")
        environment = environment_for(cfg.data.source, controller.obs_dim, controller.action_dim)
        start = time.perf_counter()
        results = rollouts(environment.make, controller, episodes=args.episodes, seed=EPISODE_SEED)
        eval_s = time.perf_counter() - start
    return {"steps": steps, "seed": seed, "core": args.core, "finished": bool(outcome.finished), "train_s": train_s,
            "eval_s": eval_s, **environment.summarize(results)}


def _launch(args: argparse.Namespace, steps: int, seed: int, core: int, folder: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "benchmarks.policy_steps", "--worker", str(steps), str(seed), "--core",
           str(core), "--preset", args.preset, "--data", args.data, "--episodes", str(args.episodes),
           "--json", str(folder / f"{steps}-{seed}.json")]
    for item in args.set or []:
        cmd += ["--set", item]
    env = child_env(dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1"))
    with open(folder / f"{steps}-{seed}.log", "wb") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)


def run_all(args: argparse.Namespace, folder: Path) -> list[dict[str, Any]]:
    """Every (steps, seed) as its own process, at most one per core, the longest first."""
    pending = [(steps, seed) for steps in sorted(args.steps, reverse=True) for seed in args.seeds]
    free, rows = parse_cores(args.cores), []
    running: dict[int, tuple[tuple[int, int], subprocess.Popen[bytes]]] = {}
    end = time.monotonic() + args.deadline_s
    while pending or running:
        if time.monotonic() > end:  # what runs is cut off, what waits is left out: both say so
            for core, ((steps, seed), proc) in running.items():
                proc.kill()
                proc.wait()
                rows.append({"steps": steps, "seed": seed, "core": core, "error": "cut off at --deadline-s",
                             "log_tail": ""})
            rows += [{"steps": steps, "seed": seed, "error": "not started before --deadline-s", "log_tail": ""}
                     for steps, seed in pending]
            break
        while pending and free:
            steps, seed = pending.pop(0)
            core = free.pop(0)
            running[core] = ((steps, seed), _launch(args, steps, seed, core, folder))
        time.sleep(1.0)
        for core, ((steps, seed), proc) in list(running.items()):
            if proc.poll() is None:
                continue
            del running[core]
            free.append(core)
            out = folder / f"{steps}-{seed}.json"
            if proc.returncode == 0 and out.exists():
                rows.append(json.loads(out.read_text()))
            else:
                tail = (folder / f"{steps}-{seed}.log").read_text(errors="replace")[-2000:]
                rows.append({"steps": steps, "seed": seed, "core": core, "error": f"exit {proc.returncode}",
                             "log_tail": tail})
            print(_line(rows[-1]), flush=True)
    return sorted(rows, key=lambda r: (r["steps"], r["seed"]))


def _line(row: dict[str, Any]) -> str:
    if "error" in row:
        return f"steps {row['steps']} seed {row['seed']}: failed ({row['error']})\n{row['log_tail']}"
    return (f"steps {row['steps']} seed {row['seed']}: success {row['success']:.2f}, largest gap "
            f"{row['mode_gap']:.2f}, trained in {row['train_s']:.0f} s, rolled out in {row['eval_s']:.0f} s")


def meets_bar(row: dict[str, Any]) -> bool:
    return "error" not in row and row["success"] >= SUCCESS_BAR and row["mode_gap"] <= GAP_BAR + 1e-9


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per step count: each seed's success and gap, their means, the seeds meeting the bar."""
    out = []
    for steps in sorted({r["steps"] for r in rows}):
        done = [r for r in rows if r["steps"] == steps and "error" not in r]
        modes = sorted(k[len("mode_"):] for k in (done[0] if done else {}) if k.startswith("mode_") and k != "mode_gap")
        out.append({"steps": steps, "seeds": [r["seed"] for r in done], "success": [r["success"] for r in done],
                    "mode_gap": [r["mode_gap"] for r in done],
                    "mean_success": statistics.fmean(r["success"] for r in done) if done else None,
                    "mean_shares": {m: statistics.fmean(r[f"mode_{m}"] for r in done) for m in modes},
                    "demo_shares": {m: done[0][f"demo_{m}"] for m in modes},
                    "meeting_bar": sum(meets_bar(r) for r in done), "failed": sum(r["steps"] == steps and "error" in r
                                                                                   for r in rows),
                    "mean_train_s": statistics.fmean(r["train_s"] for r in done) if done else None})
    return out


def render(record: dict[str, Any]) -> str:
    rows = []
    for s in record["by_steps"]:
        shares = " / ".join(f"{100 * v:.0f}" for v in s["mean_shares"].values())
        demo = " / ".join(f"{100 * v:.0f}" for v in s["demo_shares"].values())
        rows.append([str(s["steps"]), " / ".join(f"{v:.2f}" for v in s["success"]),
                     f"{s['mean_success']:.2f}" if s["mean_success"] is not None else "",
                     " / ".join(f"{100 * v:.0f}" for v in s["mode_gap"]), f"{shares} (demonstrated {demo})",
                     f"{s['meeting_bar']} of {len(s['seeds']) + s['failed']}",
                     f"{s['mean_train_s']:.0f}" if s["mean_train_s"] is not None else ""])
    head = (f"`{record['preset']}` on `{record['data']}`, CPU, one thread a process ({record['cpu']}), torch "
            f"{record['torch']}; {record['episodes']} episodes per run through the controller (DDPM), seeds "
            f"{', '.join(map(str, record['seeds']))}. Bar: success >= {SUCCESS_BAR:g} and every route within "
            f"{100 * GAP_BAR:.0f} points.\n\n")
    return head + markdown_table(["steps", "success per seed", "mean", "largest gap per seed (points)",
                                  "mean route shares %", "seeds meeting the bar", "train s (mean)"], rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.policy_steps", description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="policy-tiny")
    parser.add_argument("--data", default="builtin:reach2d-routes")
    parser.add_argument("--steps", type=int, nargs="+", default=[800, 1600, 2400])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--cores", help="cores to pin the trainings to, one each: e.g. 6-14 (default: every core "
                        "this process may use)")
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--deadline-s", type=float, default=float("inf"),
                        help="stop the trainings still running after this many seconds (reported as cut off)")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE")
    parser.add_argument("--json", type=Path, help="write the record here")
    parser.add_argument("--markdown", type=Path, help="write the table here")
    parser.add_argument("--worker", type=int, nargs=2, metavar=("STEPS", "SEED"), help=argparse.SUPPRESS)
    parser.add_argument("--core", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    from diffscale.io.atomic import write_text

    if args.worker:
        write_text(args.json, json.dumps(train_and_roll_out(args)))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        rows = run_all(args, Path(tmp))
    import torch

    record = {"preset": args.preset, "data": args.data, "episodes": args.episodes, "seeds": args.seeds,
              "cpu": _cpu_name(), "torch": torch.__version__, "runs": rows, "by_steps": summarize(rows)}
    publish(record, render(record), args.json, args.markdown)
    return 0 if all("error" not in r for r in rows) else 1


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


if __name__ == "__main__":
    raise SystemExit(main())
