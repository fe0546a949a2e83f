"""``diffscale eval RUN_DIR``: the task's own evaluation of a trained run's EMA weights
(closed-loop rollouts for policies, in the environment ``--env`` names; ensemble scores for
fields; Frechet distance and precision/recall in a feature network's space for images),
printed as a table or one JSON line, kept in ``RUN_DIR/eval/step_NNNNNNNN/`` and appended to
``metrics.jsonl``."""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from diffscale.diffusion.inference import sampling_network
from diffscale.errors import check_seed
from diffscale.inference.trained import load_trained
from diffscale.io.atomic import write_text


def evaluate_run(run_dir: Path, *, count: int | None, steps: int | None, seed: int, device: str | None,
                 as_json: bool, env: str = "auto", max_episode_steps: int | None = None, sampler: str | None = None,
                 checkpoint: int | None = None, features: str | None = None, data: str | None = None,
                 guidance: float | None = None) -> int:
    check_seed(seed, "eval's seed")
    run = load_trained(run_dir, device, step=checkpoint, eval_features=features)
    sampler, steps = run.cfg.train.sampling(sampler, steps, task_sampler=run.task.evaluation_sampler)
    out_dir = run.run_dir / "eval" / f"step_{run.step:08d}"
    made = next((p for p in (*reversed(out_dir.parents), out_dir) if not p.exists()), None)
    out_dir.mkdir(parents=True, exist_ok=True)
    network = sampling_network(run.network, run.cfg.runtime)
    try:
        scores = run.task.evaluate(network, out_dir, count=count, steps=steps, seed=seed, env=env,
                                   max_episode_steps=max_episode_steps, data=data, sampler=sampler,
                                   guidance=guidance)
    except BaseException:
        if made is not None:  # a task that cannot evaluate (or an interrupted one) leaves no empty folders
            shutil.rmtree(made, ignore_errors=True)
        raise
    if scores.get("held_out") == 0:  # a task that scores pairs says when they were trained on
        print(f"note: scored on {scores.get('cases', 'some')} rows of the training data (held_out 0): pass "
              "--data npz:HELDOUT for pairs the model has not seen", file=sys.stderr)
    record = {"kind": "eval", "step": run.step, "task": run.cfg.task, "steps": steps, "seed": seed,
              **({"data": data} if data else {}), **scores,
              "time": time.time()}
    write_text(out_dir / "metrics.json", json.dumps(record, indent=1))
    with open(run.run_dir / "metrics.jsonl", "a") as fh:
        fh.write(json.dumps(record) + "\n")
    if as_json:
        print(json.dumps(record))
        return 0
    table = Table(title=f"{run.cfg.task} evaluation of {run.run_dir} at step {run.step}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in scores.items():
        table.add_row(key, f"{value:.4g}" if isinstance(value, float) else str(value))
    Console(width=None if sys.stdout.isatty() else 120).print(table)
    print(f"files: {out_dir}")
    return 0
