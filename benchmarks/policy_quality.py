"""A diffusion policy's time to success: closed-loop success rate through the ``Controller``
against training wall clock, for the plain recipe (the reference's: fp32, AdamW at a constant
rate, a CPU DataLoader; ``bench.plain``) and for diffscale's defaults, on one device.

``python -m benchmarks.policy_quality --preset policy --data builtin:reach2d-routes --json
OUT.json --markdown OUT.md`` trains each recipe from the same initial weights, scoring its EMA
weights every ``--eval-every`` steps: ``--episodes`` rollouts (episode i seeded 1000 + i, as the
benchmarks' route tables are) through one ``Controller`` with the run's sampler defaults (DDPM,
``train.sample_steps`` steps), on an evaluation network compiled once for both recipes. A
recipe stops at its first score at or above ``--target`` (the time it needed) or after
``--max-train-s`` seconds of training. Training seconds exclude start-up (compilation, loader
workers), reported apart (``benchmarks.quality_clock``).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from benchmarks.quality_clock import (
    Deadline,
    Schedule,
    eval_network,
    first_reaching,
    load_ema,
    markdown_table,
    publish,
    recipe_run,
    scoring_runtime,
    train_curve,
    warm_up,
)
from diffscale import config as C
from diffscale.errors import UserError

if TYPE_CHECKING:
    from diffscale.bench.plain import PlainRunner
    from diffscale.training.state import RunState
    from diffscale.training.step import StepRunner

EPISODE_SEED = 1000
"""Seed of the first evaluation episode (the benchmarks' route tables use 1000-1099)."""


class PolicyScorer:
    """Success rate and route shares of a run's EMA weights, rolled out through the controller."""

    def __init__(self, run_state: RunState, args: argparse.Namespace) -> None:
        from diffscale.diffusion.inference import sampling_network
        from diffscale.tasks.policy.envs.rollout import environment_for

        task, cfg = run_state.task, run_state.cfg
        sizes = getattr(task, "obs_dim"), getattr(task, "action_dim")  # noqa: B009 (a PolicyTask's; resolve checked)
        self.environment = environment_for(cfg.data.source, *sizes)
        self.episodes, self.steps, self.device = args.episodes, cfg.train.sample_steps, run_state.device
        self.net = eval_network(run_state)
        self.network = sampling_network(self.net, scoring_runtime(cfg, args.eval_compile), live=True)

    def __call__(self, run_state: RunState, runner: StepRunner | PlainRunner) -> dict[str, Any]:
        from diffscale.tasks.policy.controller import Controller
        from diffscale.tasks.policy.envs.rollout import rollouts

        load_ema(self.net, run_state, runner)
        controller = Controller(run_state.task, self.network, steps=self.steps)  # the run's default sampler
        results = rollouts(self.environment.make, controller, episodes=self.episodes, seed=EPISODE_SEED)
        return dict(self.environment.summarize(results))


def resolve(args: argparse.Namespace, recipe: str) -> C.RunConfig:
    cfg = C.resolve_config(C.ConfigSources(preset=args.preset, data=args.data, device=args.device, recipe=recipe,
                                           overrides=args.set or []))
    if not isinstance(cfg.model, C.PolicyModelConfig):
        raise UserError(f"preset '{args.preset}' is a {cfg.task} run; time to success is measured on policies",
                        "use a policy preset, e.g. --preset policy")
    return cfg


def measure_recipe(args: argparse.Namespace, recipe: str, scorer: list[PolicyScorer], tmp: Path,
                   max_train_s: float) -> dict[str, Any]:
    cfg = resolve(args, recipe)
    run_state, runner, rewind = recipe_run(cfg, tmp / recipe, plain_workers=args.plain_workers)
    startup = warm_up(runner.step, args.warmup, run_state.device)
    if not scorer:
        scorer.append(PolicyScorer(run_state, args))
    rewind(run_state, runner)
    at = tuple(range(args.eval_every, args.max_steps + 1, args.eval_every))
    points = train_curve(runner.step, run_state, Schedule(at, max_train_s, lambda p: p["success"] >= args.target),
                         lambda: scorer[0](run_state, runner))
    first = first_reaching(points, lambda p: p["success"] >= args.target)
    last = points[-1] if points else {}
    row = {"recipe": recipe, "batch": cfg.train.batch_per_gpu, "lr": cfg.optim.lr, "startup_s": startup,
           "startup_steps": args.warmup, "step_ms": 1e3 * last["train_s"] / last["step"] if last else None,
           "max_train_s": max_train_s, "points": points, "first_reaching": first}
    reached = f"{args.target:g} at {first['train_s']:.1f} s (step {first['step']})" if first else \
        f"not {args.target:g} within {last.get('train_s', 0):.1f} s (step {last.get('step', 0)})"
    print(f"{recipe}: success {last.get('success', float('nan')):.2f}, {reached}; start-up {startup:.1f} s", flush=True)
    return row


def measure(args: argparse.Namespace) -> dict[str, Any]:
    deadline, rows = Deadline(args.deadline_s), []
    scorer: list[PolicyScorer] = []  # built by the first run, then shared
    with tempfile.TemporaryDirectory() as tmp:
        for recipe, cap in (("fast", args.max_train_s), ("plain", args.plain_max_train_s)):
            # what is left of the deadline, less the start-up and scoring a run needs beside its training
            allowed = min(cap, deadline.left() - args.overhead_s)
            if allowed <= 0:
                rows.append({"recipe": recipe, "skipped_for_time": True})
                continue
            rows.append(measure_recipe(args, recipe, scorer, Path(tmp), allowed))
    device = scorer[0].device if scorer else torch.device("cpu")
    return {"preset": args.preset, "data": args.data, "env": scorer[0].environment.name if scorer else None,
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU",
            "torch": torch.__version__, "episodes": args.episodes, "episode_seed": EPISODE_SEED,
            "target": args.target, "runs": rows}


def render(record: dict[str, Any]) -> str:
    head = (f"Policy success against training wall clock, `{record['preset']}` on `{record['data']}`, "
            f"{record['device']}, torch {record['torch']}; {record['episodes']} episodes (seeds "
            f"{record['episode_seed']}-{record['episode_seed'] + record['episodes'] - 1}) through the controller "
            f"(DDPM) at each point.\n\n")
    rows = []
    for r in record["runs"]:
        if r.get("skipped_for_time"):
            rows.append([r["recipe"], "skipped for time", "", "", "", ""])
            continue
        first, last = r["first_reaching"], r["points"][-1] if r["points"] else {}
        rows.append([r["recipe"], f"{r['step_ms']:.2f}" if r["step_ms"] else "",
                     f"**{first['train_s']:.1f} s** (step {first['step']})" if first else
                     f"not within {last.get('train_s', 0):.1f} s", f"{last.get('success', float('nan')):.2f}",
                     f"{last.get('mode_gap', float('nan')):.2f}", f"{r['startup_s']:.1f}"])
    table = markdown_table(["recipe", "ms a step", f"first success >= {record['target']:g}", "last success",
                            "last largest route gap", "start-up s"], rows)
    curves = "\n".join(f"- {r['recipe']}: " + ", ".join(f"{p['train_s']:.1f} s {p['success']:.2f}" for p in r["points"])
                       for r in record["runs"] if not r.get("skipped_for_time"))
    return head + table + "\nSuccess against training seconds:\n" + curves + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.policy_quality",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="policy")
    parser.add_argument("--data", default="builtin:reach2d-routes")
    parser.add_argument("--eval-every", type=int, default=500, help="training steps between scores")
    parser.add_argument("--max-steps", type=int, default=20_000, help="stop a recipe after this many steps")
    parser.add_argument("--max-train-s", type=float, default=60.0, help="stop diffscale's run after this many "
                        "seconds of training")
    parser.add_argument("--plain-max-train-s", type=float, default=120.0, help="the same for the plain recipe")
    parser.add_argument("--target", type=float, default=0.9, help="the success rate a recipe stops at")
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=20, help="untimed steps before each run (compilation)")
    parser.add_argument("--plain-workers", type=int, default=4, help="the plain recipe's DataLoader workers")
    parser.add_argument("--deadline-s", type=float, default=float("inf"),
                        help="give each recipe only what is left of this many seconds (less --overhead-s)")
    parser.add_argument("--overhead-s", type=float, default=40.0,
                        help="seconds a recipe needs beside its training (start-up, scoring)")
    parser.add_argument("--eval-compile", action="store_true",
                        help="score on the compiled sampling network (default: eager; scoring is off the clock)")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda", "mps"])
    parser.add_argument("--set", action="append", metavar="KEY=VALUE")
    parser.add_argument("--json", type=Path, help="write the record here")
    parser.add_argument("--markdown", type=Path, help="write the table here")
    args = parser.parse_args(argv)
    record = measure(args)
    publish(record, render(record), args.json, args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
