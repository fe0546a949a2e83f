"""Do a preset's defaults hold on data other than the glyphs? Train it on every suite set with
several seeds, and report per run whether it collapsed, the divergence guard's restores, the final
loss and the task's quality score.

``python -m benchmarks.suite.defaults --preset tiny --out DIR [--sets NAME ...] [--seeds 3]
[--steps 600 | --seconds S] [--variant LABEL KEY=VALUE ...] [--set KEY=VALUE] [--gpus auto] [--jobs N]``

Each run is ``diffscale train --preset P --data npz:SET_FILE --out DIR/runs/P/SET/VARIANT/seedK``
(the set files written first under ``--data-dir``, default DIR/data, by benchmarks.suite.sets),
then ``diffscale eval RUN --json``: the Frechet distance (``fd``) for images, the CRPS on the set's
held-out pairs for fields, the rollouts' success rate in the set's environment for policies.
Runs go side by side, one per GPU (``--gpus``, default every GPU nvidia-smi lists), or on a CPU
``--jobs`` at a time sharing the cores; on GPUs the seeds of one set and variant start after its
first run has compiled the step. A preset trains on the sets of its own task (tiny, small,
medium, large, xl: images; field-icon, field-large: fields; policy-tiny, policy: policies).

``--variant LABEL KEY=VALUE ...`` (repeatable) trains every run once per variant with those
overrides, e.g. a guard off and on (``--variant off train.divergence_guard=off --variant on
train.divergence_guard=on``); without one, the preset's defaults are the only variant. ``--set``
applies to every run. The run's seed is ``train.seed``; ``--steps`` sets ``train.steps`` (default:
500 past the run's warm-up, at least 600; 0: the preset's own), ``--seconds`` stops each run that
long after it started (it checkpoints and exits 85, and is judged on what it logged). The collapse
criterion is benchmarks/suite/collapse.py's.

``--plain SECONDS`` also measures time to quality on each image set: the plain recipe against the
defaults, each trained SECONDS (benchmarks/suite/plain.py, by the time-to-quality benchmark).

A run trained with the guard off (``train.divergence_guard=off``) also gets the step at which the
guard, with the run's settings, would first have restored (``guard_would_restore_at``; the run is
the same up to there), so one pass with the guard off answers both "collapsed?" and "restored?".

Writes ``DIR/suite.json`` (provenance: date, host, GPUs, commit, command; the criterion; every
run; the summary) and ``DIR/suite.md`` (the tables), and prints the tables. A run whose
``result.json`` is already in its folder is reused, so a call cut short continues where it stopped.

``--prepare-features`` only builds the feature networks the image evaluations score in, on the CPU,
for a GPU call to carry in (benchmarks/suite/features.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import yaml

from benchmarks.suite import features, plain, report
from benchmarks.suite.collapse import Criterion, judge, read_metrics
from benchmarks.suite.launch import RunSpec, Slots, run_all
from benchmarks.suite.plain import PlainSpec, run_plain
from benchmarks.suite.replay import replayed as guard_replayed
from benchmarks.suite.sets import chosen
from diffscale.config import ConfigSources, resolve_config
from diffscale.errors import UserError
from diffscale.io.atomic import write_text

MIN_STEPS = 600
AFTER_WARMUP = 500
"""Steps a run trains at its full rate by default: the collapses seen came within 100 steps of the
warm-up's end (medium on `textures`, tiny on the CPU; docs/measurements/2026-11-29.md)."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.suite.defaults", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", action="append", help="preset, repeatable (default tiny)")
    parser.add_argument("--sets", nargs="+", metavar="NAME", help="suite sets (default: all of each preset's task)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 per set and variant (default 3)")
    parser.add_argument("--steps", type=int, help="train.steps of every run (default: 500 past the warm-up, at "
                        f"least {MIN_STEPS}; 0: the preset's own)")
    parser.add_argument("--seconds", type=float, help="stop each run this many seconds after it started")
    parser.add_argument("--variant", nargs="+", action="append", metavar=("LABEL", "KEY=VALUE"),
                        help="train every run also with these overrides, repeatable")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="overrides of every run")
    parser.add_argument("--log-every", type=int, default=10, help="train.log_every: records the criterion reads "
                        "(default 10; 0: the preset's own)")
    parser.add_argument("--out", type=Path, required=True, help="folder for the runs, suite.json and suite.md")
    parser.add_argument("--data-dir", type=Path, help="where the set files are written and read (default OUT/data)")
    parser.add_argument("--count", type=int, help="images / pairs / episodes per set (default: each set's own)")
    parser.add_argument("--gpus", default="auto", help="GPUs to run on, one run each: auto (every GPU listed), "
                        "none (the CPU), or indices 0,1,... (among those CUDA_VISIBLE_DEVICES allows, where set)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once on a CPU (default 1)")
    parser.add_argument("--no-eval", action="store_true", help="skip diffscale eval (no quality score)")
    parser.add_argument("--eval-count", type=int, help="diffscale eval --count: samples, members or rollouts")
    parser.add_argument("--plain", type=float, metavar="SECONDS",
                        help="also time to quality on each image set: the plain recipe against the defaults, "
                             "SECONDS of training each (benchmarks' quality_time)")
    parser.add_argument("--prepare-features", action="store_true",
                        help="only build the feature networks the image runs' evaluations score in (kept in "
                             "the data cache; benchmarks/suite/features.py), then exit")
    parser.add_argument("--jump", type=float, default=Criterion.jump, help="collapse criterion: the jump factor")
    parser.add_argument("--stay", type=float, default=Criterion.stay, help="collapse criterion: the stay factor")
    args = parser.parse_args(argv)
    for flag, value in (("--seeds", args.seeds), ("--jobs", args.jobs)):
        if value < 1:
            parser.error(f"{flag} must be at least 1")
    if (args.steps or 0) < 0 or any(v is not None and v <= 0 for v in (args.seconds, args.plain)):
        parser.error("--steps must be 0 or more, --seconds and --plain more than 0")
    if not 1 < args.stay <= args.jump:
        parser.error("the criterion needs 1 < --stay <= --jump")
    return args


def variants(items: list[list[str]] | None) -> list[tuple[str, tuple[str, ...]]]:
    """``--variant LABEL KEY=VALUE ...`` items -> (label, overrides); none: the defaults alone."""
    found: list[tuple[str, tuple[str, ...]]] = []
    for label, *overrides in items or [["defaults"]]:
        if "=" in label or "/" in label or label in {v[0] for v in found}:
            raise UserError(f"--variant label '{label}' is not a new name",
                            "start each --variant with its own label, then its overrides: --variant off KEY=VALUE")
        bad = next((o for o in overrides if "=" not in o), None)
        if bad:
            raise UserError(f"--variant {label}: '{bad}' is not KEY=VALUE", "e.g. --variant low optim.lr=5e-4")
        found.append((label, tuple(overrides)))
    return found


def gpu_slots(choice: str) -> tuple[str, ...]:
    """The GPUs ``--gpus`` names: ``none``, indices, or ``auto`` (those CUDA_VISIBLE_DEVICES allows,
    else every GPU nvidia-smi lists). Under CUDA_VISIBLE_DEVICES an index counts among the GPUs it
    allows, as in torch (``CUDA_VISIBLE_DEVICES=1 ... --gpus 0,0`` runs both on GPU 1): each run's
    own CUDA_VISIBLE_DEVICES would otherwise name a GPU the caller kept it from."""
    if choice == "none":
        return ()
    visible_env = os.environ.get("CUDA_VISIBLE_DEVICES")
    visible = tuple(g.strip() for g in visible_env.split(",") if g.strip()) if visible_env is not None else None
    if choice != "auto":
        asked = tuple(g.strip() for g in choice.split(",") if g.strip())
        if visible is None:
            return asked
        outside = [g for g in asked if not (g.isdigit() and int(g) < len(visible))]
        if outside:
            raise UserError(f"--gpus {choice}: {', '.join(outside)} is not among the {len(visible)} GPU(s) "
                            f"CUDA_VISIBLE_DEVICES={visible_env} allows",
                            f"count from 0 among those (0-{len(visible) - 1}), or unset CUDA_VISIBLE_DEVICES")
        return tuple(visible[int(g)] for g in asked)
    if visible is not None:
        return visible
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return tuple(line.strip() for line in done.stdout.splitlines() if line.strip()) if done.returncode == 0 else ()


def plan(args: argparse.Namespace, data_dir: Path) -> list[RunSpec]:
    """Every run: preset x set of its task x variant x seed, each config resolved once now so a typo
    in an override fails here, before anything trains."""
    specs = []
    fixed = [f"train.log_every={args.log_every}"] if args.log_every else []
    for preset in args.preset or ["tiny"]:
        task = resolve_config(ConfigSources(preset=preset)).task
        sets = [s for s in chosen(args.sets) if s.task == task]
        if not sets:
            raise UserError(f"preset {preset} trains {task}, and none of the chosen sets holds {task} data",
                            f"pick {task} sets with --sets, or leave --sets out for all of them")
        for entry in sets:
            data = f"npz:{entry.path(data_dir, args.count or entry.default_count, 0)}"
            for label, overrides in variants(args.variant):
                rest = [*fixed, *args.set, *overrides]  # train.steps set here wins over the default
                cfg = resolve_config(ConfigSources(preset=preset, data=data, overrides=[*entry.overrides, *rest]))
                base = [*entry.overrides, *run_steps(args.steps, cfg.optim.warmup_steps), *rest]
                for seed in range(args.seeds):
                    run_dir = args.out / "runs" / preset / entry.name / label / f"seed{seed}"
                    specs.append(RunSpec(preset, entry.name, task, label, seed, data,
                                         (*base, f"train.seed={seed}"), tuple(entry.eval_args(data_dir, args.count)),
                                         run_dir))
    return specs


def run_steps(asked: int | None, warmup_steps: int) -> list[str]:
    """The ``train.steps`` override of a run: ``asked`` (0: the preset's own, no override), else
    ``AFTER_WARMUP`` steps at the full rate, at least ``MIN_STEPS``: a run that ends inside its
    warm-up never trains at the learning rate under test (large's and xl's warm-ups are 1,000 steps)."""
    if asked == 0:
        return []
    return [f"train.steps={asked if asked is not None else max(MIN_STEPS, warmup_steps + AFTER_WARMUP)}"]


def finish(criterion: Criterion) -> Callable[[RunSpec, dict], dict]:
    """The record of a run from its outcome, its metrics.jsonl and its config.yaml."""

    def record(spec: RunSpec, outcome: dict) -> dict:
        metrics = read_metrics(spec.run_dir / "metrics.jsonl")
        config = spec.run_dir / "config.yaml"
        written = yaml.safe_load(config.read_text()) if config.is_file() else {}
        warmup = written.get("optim", {}).get("warmup_steps", 0)
        train = written.get("train", {})
        # with the guard off: where it would have restored (the same run up to there), None if nowhere
        guard_off = not train.get("divergence_guard", True)
        replayed = guard_replayed(metrics.steps, metrics.losses, train, None) if guard_off else None
        verdict = judge(metrics.steps, metrics.losses, warmup_steps=warmup, exit_code=outcome["exit_code"],
                        criterion=criterion)
        score = report.quality(spec.task, outcome["eval"])
        name = report.QUALITY[spec.task][0]
        summary = (f"{'COLLAPSED: ' + verdict.reason if verdict.collapsed else 'healthy'}, final loss "
                   f"{verdict.final_loss if verdict.final_loss is None else round(verdict.final_loss, 4)}, "
                   f"restores {metrics.restores}, {name} {score if score is None else round(score, 4)}"
                   + (f", the guard would have restored at step {replayed}" if replayed is not None
                      else ""))
        return {"preset": spec.preset, "set": spec.set_name, "task": spec.task, "variant": spec.variant,
                "seed": spec.seed, "overrides": list(spec.overrides), "run_dir": str(spec.run_dir),
                "steps_reached": metrics.steps[-1] if metrics.steps else 0, "warmup_steps": warmup,
                "restores": metrics.restores, "nonfinite_skipped": metrics.nonfinite_skipped, **asdict(verdict),
                "guard_off": guard_off,
                "guard_would_restore_at": replayed,
                "quality": score, **outcome, "summary": summary}

    return record


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        return _main(parse_args(argv), shlex.join(["python", "-m", "benchmarks.suite.defaults", *argv]))
    except UserError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("[suite] interrupted: the finished runs are kept; the same command trains the others", file=sys.stderr)
        return 130


def plain_specs(args: argparse.Namespace, specs: list[RunSpec]) -> list[PlainSpec]:
    """With ``--plain``: one time-to-quality comparison per image preset and set of the plan."""
    if args.plain is None:
        return []
    pairs = dict.fromkeys((s.preset, s.set_name, s.data) for s in specs if s.task == "images")
    if not pairs:
        raise UserError("--plain measures time to quality of image presets, and no image preset is chosen",
                        "add an image preset (tiny, small, medium, large, xl), or leave --plain out")
    return [PlainSpec(p, name, data, args.out / "plain" / f"{p}-{name}") for p, name, data in pairs]


def _main(args: argparse.Namespace, command: str) -> int:
    data_dir = args.data_dir or args.out / "data"
    specs = plan(args, data_dir)
    comparisons = plain_specs(args, specs)
    for entry in chosen(list(dict.fromkeys(s.set_name for s in specs))):
        print(f"[suite] {entry.name}: npz:{entry.ensure(data_dir, args.count)}", flush=True)
    if args.prepare_features:
        built = features.prepare(specs, lambda text: print(f"[suite] {text}", flush=True))
        print(f"[suite] {built} feature network{'s' if built != 1 else ''} in the data cache", flush=True)
        return 0
    gpus = gpu_slots(args.gpus)
    slots = Slots(gpus=gpus, jobs=args.jobs, cores=os.cpu_count() or 1)
    criterion = Criterion(jump=args.jump, stay=args.stay)
    where = f"GPUs {', '.join(gpus)}" if gpus else f"the CPU ({slots.cores} cores)"
    print(f"[suite] {len(specs)} runs, {slots.count} at a time on {where}", flush=True)

    def say(text: str) -> None:  # runs in several threads: one write a line keeps lines whole
        sys.stdout.write(f"[suite] {text}\n")
        sys.stdout.flush()

    records = run_all(specs, slots, finish(criterion), say, stagger=bool(gpus), budget_s=args.seconds,
                      evaluate=not args.no_eval, eval_count=args.eval_count)
    rows = run_plain(comparisons, slots, args.plain, args.set, args.eval_count, say) if comparisons else []
    summary = report.summarize(records)
    about = report.provenance(command)
    write_text(args.out / "suite.json", json.dumps({"about": about, "criterion": asdict(criterion), "runs": records,
                                                    "summary": summary, "plain": rows}, indent=1))
    text = (f"Suite benchmark, {about['date_utc']} UTC, {', '.join(about['devices'])}, commit {about['commit']}:\n"
            f"`{command}`\n\n{report.table(records)}\n{report.summary_table(summary)}")
    if rows:
        text += f"\nTime to quality against the plain recipe, {args.plain:g} s each:\n\n{plain.table(rows)}"
    write_text(args.out / "suite.md", text)
    print(text, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
