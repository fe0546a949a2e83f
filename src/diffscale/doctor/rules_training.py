"""Failure signatures of the training itself: non-finite losses (from diffscale's own
messages and any trainer's "loss nan" lines) and the records of metrics.jsonl and benchmark
JSON (non-finite steps skipped, a GPU idle while it waits for data).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from diffscale.doctor.rules import RecordRule, TextRule

TEXT_RULES: tuple[TextRule, ...] = (
    TextRule(
        "nonfinite-stop", "the loss stayed non-finite (NaN/Inf)",
        (r"the loss stayed non-finite at step (?P<step>\d+)",
         r"the loss was non-finite for (?P<n>\d+) steps in a row at step (?P<step>\d+)"),
        "the loss was NaN/Inf at step {step} and rolling back did not help",
        "lower optim.lr (e.g. --set optim.lr=1e-4), keep optim.grad_clip on (1.0), use --precision bf16 or "
        "fp32 instead of fp16, and check the data for NaNs",
    ),
    TextRule(
        "nonfinite-rollback", "non-finite loss, rolled back",
        (r"non-finite loss for (?P<n>\d+) steps in a row at step (?P<step>\d+): rolled back to step (?P<to>\d+)",),
        "the loss was NaN/Inf for {n} steps in a row at step {step}; the run rolled back to step {to} with "
        "the learning rate halved",
        "if it recurs, lower optim.lr and keep optim.grad_clip on; use --precision bf16 instead of fp16",
    ),
    TextRule(
        "divergence-stop", "the loss diverged and the guard gave up",
        (r"the loss diverged at step (?P<step>\d+) \((?P<why>[^)]*)\) after (?P<n>\d+) restores",
         r"the loss diverged at step (?P<step>\d+) \((?P<why>[^)]*)\) and no earlier state was kept"),
        "the loss diverged at step {step} ({why}) and going back to a good state at a lower learning rate "
        "did not help",
        "train with a lower optim.lr (the error line names one), keep optim.grad_clip on (1.0), and check the "
        "data (docs/decisions.md, \"The divergence guard\")",
    ),
    TextRule(
        "divergence-restore", "the loss diverged, the guard went back",
        (r"divergence at step (?P<step>\d+): (?P<why>.+?); went back to step (?P<to>\d+)",),
        "the loss diverged at step {step} ({why}); the run went back to step {to} with the learning rate halved",
        "if it recurs, set optim.lr lower for this data (the presets' rates were chosen on several data sets: "
        "docs/decisions.md, \"The divergence guard\")",
    ),
    TextRule(
        "simulation-too-short", "the simulation ended before the trainer's buffer was full",
        (r"the simulation writing (?P<spool>.+?) ended \((?P<how>[^);]+)(?:;.*?)?\) after (?P<samples>\d+) samples "
         r"in (?P<files>\d+) spool files, fewer than the (?P<need>\d+) the buffer waits for",),
        "the simulation the trainer followed ended ({how}) after {samples} samples in {files} output steps, fewer "
        "than the {need} its buffer waits for before it trains: the trainer had nothing to train on",
        "let the simulation write more output steps before it ends (see its log for why it ended: a longer run, or "
        "a longer --sim-time if its time limit ended it), or give the trainer a smaller buffer: --couple "
        "SPOOL_DIR:N (or --data spool:DIR:N) with N at most {samples}",
    ),
    TextRule(
        "simulation-failed", "the simulation the trainer followed failed",
        (r"the simulation writing (?P<spool>.+?) failed \((?P<how>[^);]+)(?:;.*?)?\) after (?P<files>\d+) spool "
         r"files",),
        "the simulation writing {spool} failed ({how}) after {files} output steps; the trainer stopped with it, "
        "checkpointed",
        "read the simulation's log (diffscale logs RUN_DIR --job SIMULATION_JOB_ID; a failure it shows is listed "
        "above), fix it and submit again: the trainer resumes from its checkpoint",
    ),
    TextRule(
        "nan-loss", "NaN loss",
        (r"\bloss[ =:]+nan\b", r"Loss is nan", r"loss is NaN"),
        "the loss became NaN",
        "lower optim.lr, keep optim.grad_clip on (1.0), use --precision bf16 or fp32 instead of fp16",
        flags=re.I,
    ),
)


LOW_GPU_UTIL = 50.0       # percent
DATA_WAIT_SHARE = 0.3     # share of step time spent waiting for the next batch


def _nonfinite(records: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    counted = [r for r in records if isinstance(r.get("nonfinite_skipped"), (int, float))]
    if not counted or counted[-1]["nonfinite_skipped"] <= 0:
        return None
    first = next(r for r in counted if r["nonfinite_skipped"] > 0)
    return {"n": int(counted[-1]["nonfinite_skipped"]), "first": first.get("step", "?"),
            "last": counted[-1].get("step", "?")}


def _data_bound(records: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    for r in records:
        util, wait = r.get("gpu_util"), r.get("data_wait_share")
        if isinstance(util, (int, float)) and isinstance(wait, (int, float)) and util < LOW_GPU_UTIL \
                and wait > DATA_WAIT_SHARE:
            return {"util": f"{util:.0f}", "wait": f"{wait:.0%}", "what": r.get("recipe") or r.get("preset") or "run"}
    return None


def _trainer_gone(records: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    return next((r for r in records if r.get("kind") == "trainer" and r.get("state") == "gone"), None)


RECORD_RULES: tuple[RecordRule, ...] = (
    RecordRule(
        "trainer-killed", "the trainer was killed", _trainer_gone,
        "the trainer (pid {pid} on {host}, started {since}) is gone without recording how it ended: it was "
        "killed from outside (SIGKILL, the kernel's out-of-memory killer, a closed terminal or a logout) after "
        "its last output at {last_output}",
        "look for the out-of-memory killer around that time (journalctl -k or dmesg: 'Killed process {pid}'); "
        "train in tmux, screen or under nohup so a closed terminal does not end it; continue with "
        "diffscale train --out {run_dir} --resume auto (what it printed: diffscale logs {run_dir})",
        "trainer.json: pid {pid} recorded no end, and no process {pid} runs on {host}",
    ),
    RecordRule(
        "nonfinite-skipped", "non-finite steps skipped", _nonfinite,
        "{n} optimizer steps had a non-finite loss or gradient and were skipped (first by step {first})",
        "a few are harmless with fp16; many mean the learning rate is too high: lower optim.lr, keep "
        "optim.grad_clip on, prefer --precision bf16",
        "metrics.jsonl: nonfinite_skipped={n} at step {last}",
    ),
    RecordRule(
        "data-bound", "GPU idle, waiting for data", _data_bound,
        "the GPU was busy only {util}% of the time and {wait} of each step waited for data ({what})",
        "use --recipe fast (data on the GPU, as diffscale train keeps it) or, for a CPU loader, more loader "
        "workers (diffscale bench --plain-workers, your DataLoader's num_workers; a streamed diffscale train run: "
        "more CPUs per rank, or --set data.workers=N); keep the data on a local disk",
        "gpu_util={util}%, data_wait_share={wait}",
    ),
)
