"""Time to quality on a suite set: the plain recipe (diffusers' unconditional example) against
diffscale's defaults, by the repository's time-to-quality benchmark (``quality_time``: both trained
for the same seconds on the same device, the Frechet distance measured along the way) with the set
as its data (``--set data.source=npz:FILE``). Its own files (quality_time.json, .md, .png) go to
``OUT/plain/PRESET-SET/``; the summary rows come back for the suite's report."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from benchmarks.suite.launch import Slots, in_slots, run_logged
from diffscale.errors import UserError

MODULES = ("benchmarks.quality_time",)
"""Where the time-to-quality benchmark lives (research scripts move from the package to benchmarks/)."""
EVALS = 4
"""Evaluations along each run's seconds, besides the one at 0 s."""


def module() -> str:
    """The first of ``MODULES`` that can be imported."""
    for name in MODULES:
        try:
            if importlib.util.find_spec(name) is not None:
                return name
        except ModuleNotFoundError:  # its parent package is absent
            continue
    raise UserError(f"no time-to-quality benchmark to run ({' or '.join(MODULES)})",
                    "run from the repository's root, where benchmarks/ is, with diffscale installed from it")


@dataclass(frozen=True)
class PlainSpec:
    preset: str
    set_name: str
    data: str
    out: Path


def command(spec: PlainSpec, seconds: float, overrides: list[str], count: int | None, cpu: bool) -> list[str]:
    """The time-to-quality call of one preset and set; on a CPU the plain recipe loads its batches
    in the training process (loader workers would compete with it for the cores)."""
    sets = [arg for item in [f"data.source={spec.data}", *overrides] for arg in ("--set", item)]
    return [sys.executable, "-m", module(), "--preset", spec.preset, "--seconds", f"{seconds:g}", "--evals",
            str(EVALS), "--out", str(spec.out), *sets, *(["--count", str(count)] if count else []),
            *(["--plain-workers", "0"] if cpu else [])]


def run_plain(specs: list[PlainSpec], slots: Slots, seconds: float, overrides: list[str], count: int | None,
              say: Callable[[str], None]) -> list[dict]:
    """Each spec's time-to-quality summary row (diffscale's defaults against the plain recipe), with
    its preset and set; one with an ``error`` where the benchmark failed. A folder that already holds
    quality_time.json is read, not measured again."""

    def one(spec: PlainSpec, env: dict[str, str], where: str) -> dict:
        kept = spec.out / "quality_time.json"
        if not kept.is_file():
            say(f"{spec.preset}/{spec.set_name}: time to quality against the plain recipe{where}")
            log = spec.out.with_name(spec.out.name + ".log")
            log.parent.mkdir(parents=True, exist_ok=True)
            code, _, _ = run_logged(command(spec, seconds, overrides, count, not slots.gpus), env, log, None)
            if code != 0 or not kept.is_file():
                return {"preset": spec.preset, "set": spec.set_name, "error": f"exit {code} (see {log})"}
        rows = [r for r in json.loads(kept.read_text())["summary"] if r["run"] == "fast"]
        return {"preset": spec.preset, "set": spec.set_name, **(rows[0] if rows else {"error": "no summary"})}

    return in_slots(specs, slots, one)


def table(rows: list[dict]) -> str:
    lines = ["| preset | set | plain final FD | defaults final FD | defaults reach plain's final FD at s "
             "| of plain's time |", "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['preset']} | {r['set']} | {r['error']} | | | |")
            continue
        reach = "never" if r["reach_plain_final_s"] is None else f"{r['reach_plain_final_s']:.1f}"
        share = "-" if r["share_of_plain_time"] is None else f"{r['share_of_plain_time']:.1%}"
        lines.append(f"| {r['preset']} | {r['set']} | {r['plain_final_fd']:.2f} | {r['final_fd']:.2f} | {reach} "
                     f"| {share} |")
    return "\n".join(lines) + "\n"
