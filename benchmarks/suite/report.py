"""The benchmark's records: one per run, a summary per preset, variant and set, a markdown table,
and where they were measured (date, host, GPUs, commit, command)."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
from datetime import datetime, timezone
from importlib.metadata import version
from pathlib import Path
from statistics import mean

from diffscale.io.numbers import cell

QUALITY = {"images": ("fd", "FD"), "fields": ("crps", "CRPS"), "policy": ("success", "success")}
"""Each task's headline score in ``diffscale eval --json`` and its column name."""


def quality(task: str, scores: dict | None) -> float | None:
    """The task's headline score of an eval record (None: not evaluated, or the eval failed)."""
    if not scores:
        return None
    value = scores.get(QUALITY[task][0])
    return float(value) if isinstance(value, (int, float)) else None


def table(records: list[dict]) -> str:
    """Every run as a markdown row."""
    lines = ["| preset | set | variant | seed | exit | steps | collapsed | restores | min loss | final loss "
             "| quality | why |", "|---|---|---|---:|---:|---:|---|---:|---:|---:|---|---|"]
    for r in records:
        name = QUALITY[r["task"]][1]
        lines.append(f"| {r['preset']} | {r['set']} | {r['variant']} | {r['seed']} | {r['exit_code']} | "
                     f"{r['steps_reached']} | {'yes' if r['collapsed'] else 'no'} | {r['restores']} | "
                     f"{cell(r['min_loss'], '.4f')} | {cell(r['final_loss'], '.4f')} | "
                     f"{name} {cell(r['quality'], '.4g')} | {r['reason'] or ''} |")
    return "\n".join(lines) + "\n"


def summarize(records: list[dict]) -> list[dict]:
    """Per preset, variant and set: runs, collapses, restores, and the means of the final loss and
    of the quality over the runs that have them."""
    groups: dict[tuple[str, str, str], list[dict]] = {}
    for r in records:
        groups.setdefault((r["preset"], r["variant"], r["set"]), []).append(r)
    rows = []
    for (preset, variant, set_name), runs in groups.items():
        losses = [r["final_loss"] for r in runs if r["final_loss"] is not None and not r["collapsed"]]
        scores = [r["quality"] for r in runs if r["quality"] is not None]
        rows.append({"preset": preset, "variant": variant, "set": set_name, "runs": len(runs),
                     "collapsed": sum(r["collapsed"] for r in runs), "restores": sum(r["restores"] for r in runs),
                     "guard_off": sum(bool(r.get("guard_off")) for r in runs),
                     "guard_would_restore": sum(r.get("guard_would_restore_at") is not None for r in runs),
                     "mean_final_loss_healthy": mean(losses) if losses else None,
                     "quality_name": QUALITY[runs[0]["task"]][0], "mean_quality": mean(scores) if scores else None})
    return rows


def summary_table(rows: list[dict]) -> str:
    lines = ["| preset | variant | set | collapsed / runs | restores | final loss (not collapsed) | quality |",
             "|---|---|---|---:|---:|---:|---|"]
    for s in rows:
        lines.append(f"| {s['preset']} | {s['variant']} | {s['set']} | {s['collapsed']} / {s['runs']} | "
                     f"{s['restores']} | {cell(s['mean_final_loss_healthy'], '.4f')} | "
                     f"{s['quality_name']} {cell(s['mean_quality'], '.4g')} |")
    total = sum(s["runs"] for s in rows)
    lines.append(f"\n{sum(s['collapsed'] for s in rows)} of {total} runs collapsed; "
                 f"{sum(s['restores'] for s in rows)} restores.")
    off = sum(s["guard_off"] for s in rows)
    if off:  # the guard's first decision replayed on the runs trained without it
        lines.append(f"The divergence guard would have restored in {sum(s['guard_would_restore'] for s in rows)} "
                     f"of the {off} runs trained with it off.")
    return "\n".join(lines) + "\n"


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(Path(__file__).resolve().parent), *args], capture_output=True,
                              text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def devices() -> list[str]:
    """The GPUs' names (nvidia-smi), or the CPU's where there is none."""
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=30)
        names = [line.strip() for line in done.stdout.splitlines() if line.strip()] if done.returncode == 0 else []
    except (OSError, subprocess.TimeoutExpired):
        names = []
    return names or [f"CPU: {platform.processor() or platform.machine()}"]


def provenance(command: str) -> dict:
    """Date, host, devices, cores, torch, commit (and whether tracked files differ from it), command."""
    commit = _git("rev-parse", "--short", "HEAD")
    return {"date_utc": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M"), "host": socket.gethostname(),
            "devices": devices(), "cpu_cores": os.cpu_count(), "torch": version("torch"), "commit": commit,
            "uncommitted_changes": bool(_git("status", "--porcelain", "--untracked-files=no")) if commit else None,
            "command": command}
