"""The divergence guard replayed on finished runs' loss curves, as it would judge them at another
``log_every``: ``python -m benchmarks.suite.replay DIR ... [--log-every 50] [--set train.KEY=VALUE]``.

The suite logs every 10 steps; a user's run of small..xl logs every 50. The logged loss is a window's
mean, so averaging a run's 10-step windows five at a time gives exactly the windows it would have
logged every 50 steps; between them, over its first ``train.divergence_early_steps``, the guard
judges 10-step windows of its own (``training/guard.py``). This replays that on every metrics.jsonl
under the folders given (runs trained with the guard off: a run is unchanged until its first restore)
and prints, per run, the step the suite's collapse criterion names and the step the guard would have
restored at, then how many collapsed runs it caught and how many healthy ones it would have stopped.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import yaml

from benchmarks.suite.collapse import judge, read_metrics


def judged_windows(steps: list[int], losses: list[float], log_every: int,
                   early_steps: int) -> Iterator[tuple[int, int, float]]:
    """(index of the logged window it ends at, its steps, its mean loss) of each window the guard of
    a run logged every ``log_every`` steps judges, from windows logged every few steps (a divisor)."""
    from diffscale.training.guard import early_window_ends

    total, count, previous = 0.0, 0, 0
    for index, (step, loss) in enumerate(zip(steps, losses, strict=True)):
        steps_in = step - previous
        previous = step
        total, count = total + loss * steps_in, count + steps_in
        if step % log_every == 0 or early_window_ends(step, log_every, early_steps) or index == len(steps) - 1:
            yield index, count, (loss if count == steps_in else total / count)
            total, count = 0.0, 0


def replayed(steps: list[int], losses: list[float], train: dict, log_every: int | None) -> int | None:
    """The step at which the guard, with ``train``'s settings (absent keys: the shipped defaults),
    would first have restored a run logged every ``log_every`` steps (None: as it was logged)."""
    from diffscale.config import TrainConfig
    from diffscale.training.guard import GuardState
    from diffscale.training.guard import judge as guard_judge

    shipped = TrainConfig()
    get = {name: train.get(name, getattr(shipped, name)) for name in (
        "divergence_rise", "divergence_patience", "divergence_noise", "divergence_patience_steps",
        "divergence_early_steps")}
    # as logged: each logged window alone (a window of 1 step always ends one)
    state = GuardState()
    for index, count, loss in judged_windows(steps, losses, log_every or 1, get["divergence_early_steps"]):
        if guard_judge(state, loss, rise=get["divergence_rise"], patience=get["divergence_patience"],
                       noise=get["divergence_noise"], steps=count,
                       patience_steps=get["divergence_patience_steps"]).diverged:
            return steps[index]
    return None


def replay_run(run_dir: Path, log_every: int | None, settings: dict) -> dict | None:
    """One run's row: its criterion step (None: healthy) and the guard's replayed step, or None where
    the run trained with the guard on, logged nothing, or logs too seldom for ``log_every``."""
    train, warmup = _settings(run_dir)
    train.update(settings)
    metrics = read_metrics(run_dir / "metrics.jsonl")
    # a config without the key was written before the guard existed: trained without it
    if train.get("divergence_guard", False) not in (False, "off") or len(metrics.steps) < 2:
        return None
    if log_every and log_every % (metrics.steps[1] - metrics.steps[0]):
        return None
    verdict = judge(metrics.steps, metrics.losses, warmup_steps=warmup)
    return {"run": str(run_dir), "last_step": metrics.steps[-1],
            "collapsed_at": verdict.step if verdict.collapsed else None,
            "guard_at": replayed(metrics.steps, metrics.losses, train, log_every)}


def _settings(run_dir: Path) -> tuple[dict, int]:
    """A run's ``train`` section and warm-up steps: from its config.yaml, else (a suite call's
    tarball keeps only result.json and metrics.jsonl) from the suite's record of its overrides."""
    if (run_dir / "config.yaml").is_file():
        written = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
        return dict(written.get("train", {})), int(written.get("optim", {}).get("warmup_steps", 0))
    if not (run_dir / "result.json").is_file():
        return {}, 0
    record = json.loads((run_dir / "result.json").read_text())
    train = {key.removeprefix("train."): yaml.safe_load(value) for key, _, value in
             (item.partition("=") for item in record.get("overrides", [])) if key.startswith("train.")}
    return train, int(record.get("warmup_steps") or 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.suite.replay", description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path, help="folders holding runs (searched for metrics.jsonl)")
    parser.add_argument("--log-every", type=int, help="replay as logged every N steps (a multiple of the runs' own)")
    parser.add_argument("--min-steps", type=int, default=0, help="only runs that reached this many steps")
    parser.add_argument("--set", action="append", default=[], metavar="train.KEY=VALUE",
                        help="a guard setting instead of the run's own (e.g. train.divergence_early_steps=0)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args(argv)
    settings = {}
    for item in args.set:
        key, _, value = item.partition("=")
        if not key.startswith("train.") or not value:
            parser.error(f"--set {item}: expected train.KEY=VALUE")
        settings[key.removeprefix("train.")] = yaml.safe_load(value)
    rows = [row for folder in args.folders for path in sorted(folder.rglob("metrics.jsonl"))
            if (row := replay_run(path.parent, args.log_every, settings)) and row["last_step"] >= args.min_steps]
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    for row in rows:
        if row["collapsed_at"] or row["guard_at"]:
            print(f"{row['run']}: collapsed at {row['collapsed_at']}, the guard at {row['guard_at']}")
    collapsed = [r for r in rows if r["collapsed_at"]]
    caught = [r for r in collapsed if r["guard_at"]]
    stopped = [r for r in rows if r["guard_at"] and not r["collapsed_at"]]
    print(f"{len(rows)} runs, {len(collapsed)} collapsed: the guard caught {len(caught)}, and would have "
          f"stopped {len(stopped)} healthy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
