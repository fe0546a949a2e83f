"""Time to quality: the plain recipe and diffscale's defaults, trained one after the other on the
same card for the same wall-clock budget, with the Frechet distance measured along the way.

``python -m benchmarks.quality_time --preset small --seconds 40 --out DIR``

Each run is built as ``diffscale bench`` builds it (``bench.worker.build_recipe``: the plain
recipe of ``bench.plain``, or diffscale's own ``build_run``) on the preset's built-in
data. The training clock starts after ``--warmup`` steps (the compile and the loader's start,
recorded apart as ``startup_s``) and stops at every evaluation: an evaluation samples ``--count``
images (same seeded noise every time, ``--sampler``/``--eval-steps``, bf16 autocast on CUDA) and
scores them in the data set's feature network (``tasks/images/quality.py``), which is trained or
read from the data cache before any run starts. The plain recipe's raw weights are scored too
and the better of its two counts as its quality (a generous baseline: while a run improves fast
its raw weights lead its EMA); ``--raw-weights`` scores diffscale's by the same rule. diffscale
reaches the plain recipe's final FD at the first evaluation at or below it, interpolated linearly
from the one before (in seconds and in images seen); the ratio to the plain recipe's budget is the
figure (target: at most 40 %).

Writes ``DIR/quality_time.json`` (every point and the summary), ``DIR/quality_time.md`` (tables)
and ``DIR/quality_time.png``; the last weights of each diffscale run are kept as a run folder
(``--runs``, default ``DIR/runs``: ``PRESET-fast``), which ``benchmarks.sampler_quality`` samples.
The summary's arithmetic and the tables are ``benchmarks.quality_time_report``'s.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from benchmarks.quality_time_report import markdown, merged, summarize, write_chart
from diffscale import config as C
from diffscale.bench.runs import Variant, check_configs, parse_variants
from diffscale.errors import UserError

if TYPE_CHECKING:  # annotations only; the functions import these where they run
    from diffscale.bench.plain import PlainRunner
    from diffscale.runtime.device import DevicePolicy
    from diffscale.runtime.distributed import DistContext
    from diffscale.training.state import RunState
    from diffscale.training.step import StepRunner

    Runner = PlainRunner | StepRunner


@dataclass(frozen=True)
class EvalSpec:
    """How every evaluation samples: ``count`` images, ``steps`` of ``sampler``, noise of ``seed``."""

    count: int = 512
    steps: int = 20
    sampler: str = "ddim"
    seed: int = 1
    raw_too: bool = False
    """diffscale's raw weights scored too, the better FD counting, as the plain recipe's always are."""


def eval_marks(seconds: float, evals: int) -> list[float]:
    """Training seconds at which to evaluate: ``evals`` even steps up to ``seconds`` (its end included)."""
    return [seconds * k / evals for k in range(1, evals + 1)]


# What the common recipe trains (diffusers' unconditional training example): the noise, every
# timestep's error alike -- whatever the preset's own training choices are.
PLAIN_DIFFUSION = {"prediction_type": C.Prediction.EPSILON.value, "loss_weighting": C.LossWeighting.NONE.value}


def _config(preset: str, recipe: str, overrides: list[str], spec: EvalSpec) -> C.RunConfig:
    """The preset as a user runs it (its own step count and schedule), with the evaluation's
    sample count as ``train.eval_count`` (the data images the samples are scored against); the
    plain recipe predicts the noise with an unweighted loss, as the common recipe does."""
    fixed: dict = {"train": {"eval_count": spec.count}}
    if recipe == "plain":
        fixed["diffusion"] = PLAIN_DIFFUSION
    return C.resolve_config(C.ConfigSources(preset=preset, recipe=recipe, overrides=overrides, fixed=fixed))


def prepare_features(preset: str, overrides: list[str], spec: EvalSpec, say: Callable[[str], None]) -> dict:
    """The feature network of the preset's data, trained now (or read from the data cache), so
    that no run trains it inside its timed part."""
    from diffscale.runtime.device import pick_device
    from diffscale.tasks.images import quality
    from diffscale.tasks.registry import build_task

    cfg = _config(preset, "fast", overrides, spec)
    if not isinstance(cfg.model, C.ModelConfig):
        raise UserError(f"preset {preset} is a {cfg.task} run: this benchmark measures image quality",
                        "pick an image preset (tiny, small, medium, large, xl)")
    start, trained = time.perf_counter(), quality.TRAININGS
    task = build_task(cfg, pick_device(cfg.runtime.device))
    task.prepare_quality()
    seconds = time.perf_counter() - start
    fresh = quality.TRAININGS > trained
    say(f"{preset}: feature network {'trained' if fresh else 'read from the cache'} in {seconds:.1f} s")
    return {"trained": fresh, "seconds": seconds}


def _scores(run_state: RunState, network: torch.nn.Module, spec: EvalSpec) -> dict[str, float]:
    device = run_state.device
    autocast = functools.partial(torch.autocast, device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    features = run_state.task.quality_features(network, count=spec.count, steps=spec.steps, seed=spec.seed,
                                               sampler=spec.sampler, autocast=autocast)
    return run_state.task.quality_scores(features)


def _raw_scores(run_state: RunState, spec: EvalSpec) -> dict[str, float]:
    """diffscale's raw weights scored through its EMA network (the raw weights copied in, the EMA's
    put back after), so they sample exactly as the EMA does: the training network itself is
    compiled for training and keeps FlexAttention's training kernel."""
    ema: list[torch.Tensor] = list(run_state.ema.parameters())
    with torch.no_grad():
        kept = [p.detach().clone() for p in ema]
        torch._foreach_copy_(ema, [p.detach() for p in run_state.net.parameters()])
    try:
        return _scores(run_state, run_state.ema, spec)
    finally:
        with torch.no_grad():
            torch._foreach_copy_(ema, kept)


def evaluate_point(run_state: RunState, runner: Runner, spec: EvalSpec, clock: float) -> dict:
    """The quality of the run's weights now: its EMA (the plain recipe's own EMA copied into the
    run state's EMA network), and for the plain recipe (for diffscale's with ``spec.raw_too``) its raw
    weights too, the better FD counting."""
    from benchmarks.quality_clock import load_ema
    from diffscale.bench.plain import PlainRunner
    from diffscale.runtime.device import synchronize

    start = time.perf_counter()
    raw: dict[str, float] | None = None
    if isinstance(runner, PlainRunner):
        with torch.no_grad():
            load_ema(run_state.ema, run_state, runner)  # the plain recipe keeps its EMA apart
        raw = _scores(run_state, run_state.net, spec)
    elif spec.raw_too:
        raw = _raw_scores(run_state, spec)
    ema = _scores(run_state, run_state.ema, spec)
    synchronize(run_state.device)
    best = ema if raw is None or ema["fd"] <= raw["fd"] else raw  # precision and recall of the one that counts
    return {"seconds": clock, "steps": run_state.step, "images": run_state.step * runner.effective, "fd": best["fd"],
            "fd_ema": ema["fd"], "fd_raw": raw["fd"] if raw else None, "precision": best["precision"],
            "recall": best["recall"], "eval_s": time.perf_counter() - start}


def train_for(runner: Runner, seconds: float, marks: list[float], evaluate: Callable[[float], dict], *,
              check_every: int, stop_step: int, device: torch.device) -> list[dict]:
    """Steps until ``seconds`` of training (or ``stop_step``), the clock read every ``check_every``
    steps after the device caught up; ``evaluate(clock)`` at 0 and at each of ``marks`` passed,
    off the clock."""
    from diffscale.runtime.device import synchronize

    points = [evaluate(0.0)]
    pending = [m for m in marks if m > 0]
    clock = 0.0
    while clock < seconds and runner.run_state.step < stop_step:
        start = time.perf_counter()
        for _ in range(min(check_every, stop_step - runner.run_state.step)):
            runner.step()
        synchronize(device)
        clock += time.perf_counter() - start
        if pending and clock >= pending[0]:
            while pending and clock >= pending[0]:
                pending.pop(0)
            points.append(evaluate(clock))
    if points[-1]["seconds"] != clock:  # ended by the step count before the last mark
        points.append(evaluate(clock))
    return points


@dataclass(frozen=True)
class RunPlan:
    preset: str
    recipe: str
    variant: Variant
    seconds: float
    evals: int
    warmup: int
    check_every: int
    plain_workers: int

    @property
    def name(self) -> str:
        return self.recipe + (f"-{self.variant.label}" if self.variant.label else "")


def run_one(plan: RunPlan, overrides: list[str], spec: EvalSpec, runs_dir: Path, say: Callable[[str], None]) -> dict:
    """One recipe trained for the budget, with its points; a diffscale run's last state is kept."""
    from diffscale.bench.worker import join

    cfg = _config(plan.preset, plan.recipe, [*overrides, *plan.variant.overrides], spec)
    ctx, policy = join(cfg)
    try:
        record = _trained(plan, cfg, ctx, policy, spec, runs_dir / f"{plan.preset}-{plan.name}", say)
    finally:
        ctx.shutdown()
    _release()  # the run's network, graphs and loader are gone with _trained's frame
    return {**record, "overrides": [*overrides, *plan.variant.overrides]}


def _trained(plan: RunPlan, cfg: C.RunConfig, ctx: DistContext, policy: DevicePolicy, spec: EvalSpec,
             run_dir: Path, say: Callable[[str], None]) -> dict:

    from diffscale.bench.worker import build_recipe
    from diffscale.runtime.device import synchronize
    from diffscale.training.step import StepRunner

    say(f"{plan.preset} {plan.name}: building, {plan.warmup} warm-up steps (compiles)")
    start = time.perf_counter()
    # the cached feature network and the data's features are ready before anything compiles
    run_state, runner = build_recipe(cfg, run_dir, ctx, policy, plan.recipe, plain_workers=plan.plain_workers,
                                     prepare=lambda state: state.task.prepare_quality())
    for _ in range(plan.warmup):
        runner.step()
    synchronize(policy.device)
    startup = time.perf_counter() - start

    def evaluate(clock: float) -> dict:
        point = evaluate_point(run_state, runner, spec, clock)
        say(f"{plan.preset} {plan.name}: {clock:6.1f} s, step {point['steps']}, FD {point['fd']:.3f} "
            f"(evaluated in {point['eval_s']:.1f} s)")
        return point

    points = train_for(runner, plan.seconds, eval_marks(plan.seconds, plan.evals), evaluate,
                       check_every=plan.check_every, stop_step=cfg.train.steps, device=policy.device)
    kept = _keep(run_state, runner, cfg) if isinstance(runner, StepRunner) else None
    trained_s = points[-1]["seconds"]
    images = points[-1]["images"] - plan.warmup * runner.effective  # those of the clock's steps
    return {"preset": plan.preset, "recipe": plan.recipe, "label": plan.variant.label or None, "name": plan.name,
            "device": policy.name, "precision": policy.precision.value, "compiled": policy.compile,
            "effective_batch": runner.effective, "budget_s": plan.seconds, "startup_s": startup,
            "warmup_steps": plan.warmup, "samples_per_s": images / trained_s if trained_s > 0 else None,
            "eval_total_s": sum(p["eval_s"] for p in points), "points": points, "run_dir": kept}


def _keep(run_state: RunState, runner: StepRunner, cfg: C.RunConfig) -> str:
    """The run's last state as a run folder (config.yaml + checkpoint) that load_trained reads."""
    run_state.run_dir.mkdir(parents=True, exist_ok=True)
    C.write_yaml(cfg, run_state.run_dir / "config.yaml")
    run_state.save(runner.batcher)
    return str(run_state.run_dir)


def _release() -> None:
    """Free the last run's compiled code, CUDA graphs and memory before the next one starts."""
    gc.collect()
    torch._dynamo.reset()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.quality_time", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", action="append", help="image preset, repeatable (default small)")
    parser.add_argument("--seconds", type=float, default=40, help="training seconds of each run (default 40)")
    parser.add_argument("--evals", type=int, default=8, help="evaluations along the way, besides the one at 0 s")
    parser.add_argument("--count", type=int, default=512, help="samples per evaluation (and data images scored "
                        "against; default 512)")
    parser.add_argument("--eval-steps", type=int, default=20, help="sampling steps per evaluation (default 20)")
    parser.add_argument("--sampler", choices=["ddim", "dpmsolver", "ddpm"], default="ddim")
    parser.add_argument("--raw-weights", action="store_true",
                        help="score diffscale's raw weights too, the better FD counting, as the plain recipe's are")
    parser.add_argument("--recipe", default="plain,fast", help="plain, fast or plain,fast (default)")
    parser.add_argument("--variant", nargs="+", action="append", metavar=("LABEL", "KEY=VALUE"),
                        help="also train diffscale with these overrides (a training choice to weigh), repeatable")
    parser.add_argument("--variants-only", action="store_true",
                        help="diffscale's recipe trains its --variant runs only, not its defaults (e.g. variants on "
                             "more GPUs beside a process that trains the defaults)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="overrides of every run")
    parser.add_argument("--warmup", type=int, default=3, help="steps before the clock starts (default 3)")
    parser.add_argument("--check-every", type=int, default=5, help="steps between clock reads (default 5)")
    parser.add_argument("--plain-workers", type=int, default=4)
    parser.add_argument("--out", type=Path, help="folder for quality_time.json, .md and .png (required to train)")
    parser.add_argument("--merge", nargs="+", type=Path, metavar="JSON",
                        help="train nothing: the tables and summary of the runs in these quality_time.json files "
                             "(e.g. the plain recipe and diffscale trained on two GPUs at once)")
    parser.add_argument("--against", metavar="RUN",
                        help="with --merge: compare with this run (e.g. fast, diffscale's defaults) instead of the "
                             "plain recipe; the 40 %% target is the plain recipe's, so it is not judged")
    parser.add_argument("--features-only", action="store_true",
                        help="train nothing: the feature network prepared (trained or read from the data cache) "
                             "for runs started after, e.g. on two GPUs at once sharing it")
    parser.add_argument("--runs", type=Path, help="where diffscale's last weights are kept (default OUT/runs)")
    args = parser.parse_args(argv)
    if args.out is None and not (args.merge or args.features_only):
        parser.error("--out is required (or --merge JSON ... to summarize earlier runs, --features-only)")
    for flag, value in (("--seconds", args.seconds), ("--evals", args.evals), ("--eval-steps", args.eval_steps),
                        ("--check-every", args.check_every), ("--warmup", args.warmup)):
        if not value > 0:
            parser.error(f"{flag} must be more than 0")
    if args.count < 2:
        parser.error("--count must be at least 2 (a Frechet distance fits a covariance)")
    if args.against and not args.merge:
        parser.error("--against compares runs already trained: use it with --merge JSON ...")
    if args.variants_only and not args.variant:
        parser.error("--variants-only needs at least one --variant LABEL KEY=VALUE to train")
    return args


def _plans(args: argparse.Namespace) -> list[RunPlan]:
    presets = args.preset or ["small"]
    recipes = [r.strip() for r in args.recipe.split(",") if r.strip()]
    if not recipes or set(recipes) - {"plain", "fast"}:
        raise UserError(f"--recipe '{args.recipe}' is not plain, fast or plain,fast", "e.g. --recipe plain,fast")
    variants = parse_variants(args.variant)
    check_configs(presets, args.set, variants)
    fast_runs = variants if args.variants_only else [Variant(), *variants]
    # plain first: its loader workers fork before anything of the compiled runs exists
    return [RunPlan(p, recipe, variant, args.seconds, args.evals, args.warmup, args.check_every, args.plain_workers)
            for p in presets for recipe in ("plain", "fast") if recipe in recipes
            for variant in (fast_runs if recipe == "fast" else [Variant()])]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.merge:
        print(merged(args.merge, args.against), flush=True)
        return 0
    plans = _plans(args)
    spec = EvalSpec(count=args.count, steps=args.eval_steps, sampler=args.sampler, raw_too=args.raw_weights)

    def say(text: str) -> None:
        print(f"[quality-time] {text}", flush=True)

    features = {p: prepare_features(p, args.set, spec, say) for p in dict.fromkeys(plan.preset for plan in plans)}
    if args.features_only:
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    records: list[dict] = []
    table = ""
    for plan in plans:
        record = run_one(plan, args.set, spec, args.runs or args.out / "runs", say)
        record["feature_network"] = features[plan.preset]
        records.append(record)
        table = write_results(args, records, spec)  # after each run: a call cut short keeps what it finished
    print(table, flush=True)
    return 0


def write_results(args: argparse.Namespace, records: list[dict], spec: EvalSpec) -> str:
    """quality_time.json, .md and .png of the runs so far; returns the markdown."""
    from diffscale.bench.runs import provenance
    from diffscale.io.atomic import write_text

    summary = summarize(records)
    about = {**provenance(args, command=_command()), "device": records[0]["device"], "eval": vars(spec)}
    write_text(args.out / "quality_time.json", json.dumps({"about": about, "summary": summary, "runs": records},
                                                          indent=1))
    table = markdown(records, summary, about)
    write_text(args.out / "quality_time.md", table)
    write_chart(records, args.out / "quality_time.png")
    return table


def _command() -> str:
    import shlex
    import sys

    return shlex.join(["python", "-m", "benchmarks.quality_time", *sys.argv[1:]])


if __name__ == "__main__":
    raise SystemExit(main())
