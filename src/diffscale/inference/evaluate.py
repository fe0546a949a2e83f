"""``diffscale eval RUN_DIR``: the task's own evaluation of a trained run's EMA weights
(closed-loop rollouts for policies, in the environment ``--env`` names; ensemble scores for
fields; Frechet distance and precision/recall in a feature network's space for images),
printed as a table (images: beside the data scored against other data images) or one JSON line,
kept in ``RUN_DIR/eval/step_NNNNNNNN/``, appended to ``metrics.jsonl`` and sent to TensorBoard and
the run's trackers (``eval/NAME`` at the checkpoint's step). Progress goes to stderr."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from diffscale.diffusion.inference import sampling_network
from diffscale.diffusion.sampler import reporting
from diffscale.errors import check_seed
from diffscale.inference.sample import progress_for
from diffscale.inference.trained import load_trained
from diffscale.io.atomic import write_text
from diffscale.io.numbers import rounded
from diffscale.io.stages import saying
from diffscale.io.tables import terminal_width
from diffscale.training.telemetry import record_evaluation


def evaluate_run(run_dir: Path, *, count: int | None, steps: int | None, seed: int, device: str | None,
                 as_json: bool, env: str = "auto", max_episode_steps: int | None = None, sampler: str | None = None,
                 checkpoint: int | None = None, features: str | None = None, data: str | None = None,
                 guidance: float | None = None) -> int:
    check_seed(seed, "eval's seed")
    status = Console(stderr=True, soft_wrap=True, highlight=False)  # progress on stderr: stdout has the result
    run = load_trained(run_dir, device, step=checkpoint, eval_features=features)
    sampler, steps = run.cfg.train.sampling(sampler, steps, task_sampler=run.task.evaluation_sampler)
    out_dir = run.run_dir / "eval" / f"step_{run.step:08d}"
    made = next((p for p in (*reversed(out_dir.parents), out_dir) if not p.exists()), None)
    out_dir.mkdir(parents=True, exist_ok=True)
    network = sampling_network(run.network, run.cfg.runtime, one_job=True)
    try:
        with reporting(progress_for(status)), saying(lambda line: status.print(line, markup=False)):
            scores = run.task.evaluate(network, out_dir, count=count, steps=steps, seed=seed, env=env,
                                       max_episode_steps=max_episode_steps, data=data, sampler=sampler,
                                       guidance=guidance)
    except BaseException:
        if made is not None:  # a task that cannot evaluate (or an interrupted one) leaves no empty folders
            shutil.rmtree(made, ignore_errors=True)
        raise
    _notes(scores, count, status)
    record = {"kind": "eval", "step": run.step, "task": run.cfg.task, "steps": steps, "seed": seed,
              **({"data": data} if data else {}), **scores,
              "time": time.time()}
    write_text(out_dir / "metrics.json", json.dumps(record, indent=1))
    with open(run.run_dir / "metrics.jsonl", "a") as fh:
        fh.write(json.dumps(record) + "\n")
    record_evaluation(run.run_dir, run.cfg, scores, run.step, lambda line: status.print(line, markup=False))
    if as_json:
        print(json.dumps(rounded(record)))
        return 0
    print_scores(f"{run.cfg.task} evaluation of {run.run_dir} at step {run.step}", scores)
    print(f"files: {out_dir}")
    return 0


def _notes(scores: Mapping[str, Any], count: int | None, status: Console) -> None:
    """What the numbers are measured on, where a reader could take it for something else."""
    if scores.get("held_out") == 0:  # a task that scores pairs says when they were trained on
        status.print(f"note: scored on {scores.get('cases', 'some')} rows of the training data (held_out 0): pass "
                     "--data npz:HELDOUT for pairs the model has not seen", markup=False)
    asked, used = scores.get("count"), scores.get("data_count")
    if isinstance(asked, (int, float)) and isinstance(used, (int, float)) and used < asked:
        status.print(f"note: {asked} samples scored against all {used} images the data holds (a Frechet distance "
                     "between sets of different sizes reads high: compare runs at the same --count)", markup=False)
    reference = scores.get("reference_count")
    if isinstance(used, (int, float)) and (not isinstance(reference, (int, float)) or reference < used):
        what = f"{reference} other data images" if reference else "no other data images (too few)"
        status.print(f"note: the reference scores {what} against those {used}", markup=False)


def print_scores(title: str, scores: Mapping[str, Any]) -> None:
    """The scores as a table: with a reference column where the task scored the data against itself."""
    references = {k[len("reference_"):]: v for k, v in scores.items() if k.startswith("reference_")}
    table = Table(title=title)
    table.add_column("metric", no_wrap=True)
    table.add_column("value", justify="right", no_wrap=True)
    if references:
        table.add_column("data vs data", justify="right", no_wrap=True)
    for key, value in scores.items():
        if key.startswith("reference_"):
            continue
        row = [key, _cell(value)]
        if references:
            row.append(_cell(references[key]) if key in references else "")
        table.add_row(*row)
    Console(width=terminal_width(pipe=120)).print(table)


def _cell(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
