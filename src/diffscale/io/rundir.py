"""What a run folder says about its run, read without torch: the training records of
metrics.jsonl, the checkpoints, the sample grids and the resolved config.

``diffscale status``, ``diffscale report`` and the model card of ``export`` read a run
through this module, so a local run (no jobs.json) and a cluster run are read the same way.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diffscale.errors import UserError
from diffscale.io.scores import eval_records, headline, summary
from diffscale.io.trainer import Trainer, TrainerState, read_trainer, trainer_line

_CHECKPOINT = re.compile(r"step_(\d+)$")
_SAMPLE_GRID = re.compile(r"step(\d+)\.png$")


def read_records(run_dir: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(training records, events) of ``RUN_DIR/metrics.jsonl``; a line cut by a kill is skipped.
    Events carry a ``kind`` (waiting for data, ``diffscale eval`` results)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return [], []
    training, events = [], []
    for line in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        if "kind" in record:
            events.append(record)
        elif isinstance(record.get("step"), int):
            training.append(record)
    return training, events


def checkpoints(run_dir: Path) -> list[Path]:
    """Checkpoint folders renamed into place, oldest first (the names runtime/checkpoint.py writes)."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and _CHECKPOINT.match(p.name)]
    return sorted(found, key=checkpoint_step)


def checkpoint_step(path: Path) -> int:
    """The step of a checkpoint folder named ``step_NNNNNNNN``."""
    match = _CHECKPOINT.match(path.name)
    return int(match.group(1)) if match else -1


def sample_grids(run_dir: Path) -> list[tuple[int, Path]]:
    """(step, PNG) of the preview grids training wrote (``samples/stepNNNNNNNN.png``), oldest first."""
    root = Path(run_dir) / "samples"
    if not root.is_dir():
        return []
    grids = [(int(m.group(1)), p) for p in root.iterdir() if (m := _SAMPLE_GRID.match(p.name))]
    return sorted(grids)


def newest_sample(run_dir: Path) -> Path | None:
    """The newest PNG of the samples folder (a preview grid or a ``diffscale sample`` grid)."""
    root = Path(run_dir) / "samples"
    pngs = [p for p in root.glob("*.png") if p.name != "latest.png"] if root.is_dir() else []
    return max(pngs, key=lambda p: p.stat().st_mtime) if pngs else None


def read_config(run_dir: Path) -> dict[str, Any]:
    """The run's resolved config (``RUN_DIR/config.yaml``) as plain data, or {} when absent."""
    import yaml

    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        return {}
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise UserError(f"{path} is not UTF-8 text",
                        "restore it from a checkpoint's config, or save it as UTF-8") from exc
    except yaml.YAMLError as exc:
        raise UserError(f"{path} is not valid YAML ({exc})",
                        "restore it from a checkpoint's config, or fix it") from exc
    return data if isinstance(data, dict) else {}


@dataclass(frozen=True)
class Progress:
    """Where a run stands, from its files."""

    run_dir: Path
    step: int
    total_steps: int | None
    loss: float | None
    samples_per_s: float | None
    eta_s: float | None
    logged_at: float | None
    """Wall-clock time (epoch seconds) of the newest training record."""
    checkpoint: Path | None
    sample: Path | None
    gpus: dict[str, float]
    """The newest record's GPU fields (``gpu0_util_pct``, ...), empty without NVML."""
    restores: tuple[dict[str, Any], ...] = ()
    """The divergence guard's restores (``kind: divergence`` records), oldest first."""
    source_ended: dict[str, Any] | None = None
    """How the run's data source ended (a coupled simulation), where it has: its ``source_ended`` event."""
    trainer: Trainer | None = None
    """The process that trains (or trained) here, as RUN_DIR/trainer.json records it."""
    submitted: bool = False
    """Whether the run was submitted to a scheduler (RUN_DIR/jobs.json): its job table says where it is."""
    evals: tuple[dict[str, Any], ...] = ()
    """The evaluations (``kind: eval`` records), oldest first."""


def progress(run_dir: Path) -> Progress:
    """The run's progress, or one error when the folder holds no run."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserError(f"run dir '{run_dir}' does not exist",
                        "pass the --out folder of `diffscale train` or `diffscale submit`")
    records, events = read_records(run_dir)
    ckpts = checkpoints(run_dir)
    if not records and not ckpts:
        raise UserError(f"'{run_dir}' holds no training records (metrics.jsonl) and no checkpoints",
                        "pass the --out folder of a run that has started (`diffscale train --out RUN_DIR`)")
    last = records[-1] if records else {}
    step = int(last.get("step", 0))
    if ckpts:
        step = max(step, checkpoint_step(ckpts[-1]))
    total = last.get("total_steps") or read_config(run_dir).get("train", {}).get("steps")
    return Progress(run_dir=run_dir, step=step, total_steps=total, loss=last.get("loss"),
                    samples_per_s=last.get("samples_per_s"), eta_s=last.get("eta_s"), logged_at=last.get("time"),
                    checkpoint=ckpts[-1] if ckpts else None, sample=newest_sample(run_dir),
                    gpus={k: v for k, v in last.items() if k.startswith("gpu") and isinstance(v, (int, float))},
                    restores=tuple(e for e in events if e.get("kind") == "divergence"),
                    source_ended=next((e for e in reversed(events) if e.get("kind") == "source_ended"), None),
                    trainer=read_trainer(run_dir), submitted=(run_dir / "jobs.json").is_file(),
                    evals=tuple(e for e in events if e.get("kind") == "eval"))


def _ago(when: float, now: float) -> str:
    seconds = max(0.0, now - when)
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h ago"
    return f"{seconds / 86400:.0f} days ago"


def duration(seconds: float) -> str:
    """``1 h 02 min``, ``3 min 10 s``, ``42 s``."""
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    if s >= 60:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s} s"


def describe(p: Progress, now: float | None = None) -> list[str]:
    """The lines ``diffscale status`` prints for a run's progress."""
    now = time.time() if now is None else now
    total = f"/{p.total_steps}" if p.total_steps else ""
    share = f" ({100 * p.step / p.total_steps:.0f} %)" if p.total_steps else ""
    lines = [f"run {p.run_dir}: step {p.step}{total}{share}"]
    if p.logged_at is not None:
        loss = f"loss {p.loss:.4f}, " if isinstance(p.loss, (int, float)) else ""
        rate = f"{p.samples_per_s:.0f} samples/s" if p.samples_per_s is not None else "rate unknown"
        lines.append(f"last logged {_ago(p.logged_at, now)}: {loss}{rate}")
    state = _trainer_state(p)
    if p.source_ended is not None:
        lines.append(source_ended(p.source_ended, p.step))
    elif p.total_steps and p.step >= p.total_steps:
        lines.append("finished")
    elif p.eta_s is not None and state in (None, TrainerState.RUNNING, TrainerState.ELSEWHERE):
        lines.append(f"eta {duration(p.eta_s)} to the step that invocation stops at (as of the last record)")
    if p.trainer is not None and state is not None:
        lines.append(trainer_line(p.run_dir, p.trainer, lambda when: _ago(when, now), p.logged_at))
    if p.restores:
        lines.append(restores_line(p.restores))
    scored = eval_records(p.evals)
    if scored:
        lines.append(f"eval at step {scored[-1].get('step')}: {summary(scored[-1])}")
    if p.gpus:
        lines.append("gpus: " + gpu_summary(p.gpus))
    ckpt = f"{p.checkpoint.name} ({_ago(p.checkpoint.stat().st_mtime, now)})" if p.checkpoint else "none yet"
    lines.append(f"newest checkpoint: {ckpt}")
    sample = f"{p.sample} ({_ago(p.sample.stat().st_mtime, now)})" if p.sample else "none yet"
    lines.append(f"last sample: {sample}")
    return lines


def _trainer_state(p: Progress) -> TrainerState | None:
    """The trainer's state for a run trained here; None for a submitted run, whose job table (and
    the scheduler's accounting) says what became of it."""
    return p.trainer.state() if p.trainer is not None and not p.submitted else None


def as_dict(p: Progress) -> dict[str, Any]:
    """What ``status --json`` prints of a run's progress: the numbers of :func:`describe`'s lines
    (``eta_s`` None where the trainer is not running), the trainer and the newest evaluation."""
    state = _trainer_state(p)
    running = state in (None, TrainerState.RUNNING, TrainerState.ELSEWHERE)
    trainer = None
    if p.trainer is not None and state is not None:
        trainer = {"state": state.value if state else None, "host": p.trainer.host, "pid": p.trainer.pid,
                   "since": p.trainer.since, "ended": p.trainer.ended, "outcome": p.trainer.outcome}
    scored = eval_records(p.evals)
    newest = scored[-1] if scored else None
    return {"run_dir": str(p.run_dir), "step": p.step, "total_steps": p.total_steps,
            "finished": bool(p.total_steps and p.step >= p.total_steps), "loss": p.loss,
            "samples_per_s": p.samples_per_s, "logged_at": p.logged_at, "eta_s": p.eta_s if running else None,
            "checkpoint": p.checkpoint.name if p.checkpoint else None, "sample": str(p.sample) if p.sample else None,
            "gpus": p.gpus, "restores": len(p.restores), "trainer": trainer,
            "eval": None if newest is None else {"step": newest.get("step"), **headline(newest),
                                                 **{k: v for k, v in newest.items() if k.startswith("reference_")}}}


def restores_line(restores: tuple[dict[str, Any], ...]) -> str:
    """``diverged 2 times, restored each time: at step 350 the loss ... (back to step 300, lr 5.0e-04)``."""
    last = restores[-1]
    times = "once" if len(restores) == 1 else f"{len(restores)} times"
    lr = last.get("lr")
    lr_text = f", learning rate now {lr:.2e}" if isinstance(lr, (int, float)) else ""
    return (f"divergence guard: diverged {times} and went back to a good state; last at step {last.get('step')}: "
            f"{last.get('why', '?')} (back to step {last.get('restored_step')}{lr_text})")


def source_ended(event: dict[str, Any], step: int) -> str:
    """The line of a run whose data source ended (metrics.jsonl's ``source_ended``): done once
    the pass over the final buffer is trained, stopped where the source failed."""
    when = event.get("at") if isinstance(event.get("at"), (int, float)) else event.get("time")
    at = f" at {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(when))}" if isinstance(when, (int, float)) else ""
    how = f"the simulation ended ({event.get('words') or 'exit status ' + str(event.get('exit_status'))}{at})"
    if event.get("ok") is False:
        return f"stopped: {event['error']}; it ended{at}" if event.get("error") else f"stopped: {how}"
    end = int(event.get("step", 0)) + int(event.get("end_after_steps", 0))
    if step >= end:
        return f"done: {how}"
    return f"{how}: training one more pass over its final buffer, to step {end}"


def gpu_summary(fields: dict[str, Any]) -> str:
    """``gpu0 97% 31.2 GB`` for each GPU of a record's ``gpuN_util_pct`` / ``gpuN_mem_mb`` fields."""
    parts = []
    for index in sorted({int(m.group(1)) for k in fields if (m := re.match(r"gpu(\d+)_", k))}):
        util, mem = fields.get(f"gpu{index}_util_pct"), fields.get(f"gpu{index}_mem_mb")
        text = f"gpu{index}"
        if util is not None:
            text += f" {util:.0f}%"
        if mem is not None:
            text += f" {mem / 1024:.1f} GB"
        parts.append(text)
    return ", ".join(parts)
