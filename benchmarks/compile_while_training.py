"""Training while the step compiles (``runtime.compile_while_training``), as a new user meets it:
for each preset, in a cache of its own (kernels, Triton's, the traced network, built-in data),

  cold            ``diffscale train`` on the empty cache, as it starts by default: eager steps while a
                  background process compiles the step, then the switch to the compiled step
  warm            a new run of the same network on the kernels the cold job left, as it starts by
                  default: compiled before its first step, the kernel cache holding a whole build of
                  the step (since 2026-11-30; before, eager while the background process loaded the
                  kernels): the steady speed of a run compiled from the start
  warm-eager      the same new run eager first (``runtime.compile_while_training=on``): eager while the
                  background process loads the kernels, then the switch
  cold-compiled   (``--cold-compiled``) on an empty cache of its own, compiled before its first step
                  (``runtime.compile_while_training=off``): the cold start as every run started before,
                  the time its compiled speed is to be compared with
  background-alone (``--background-alone``) the background compile of a cold job, run by itself on
                  an empty cache of its own and an idle GPU: what the eager steps beside it cost it
                  (its log, with dynamo's account, beside the cold job's background log)

Each preset's caches include an empty CUDA JIT cache of its own (``CUDA_CACHE_PATH``), as on a
fresh machine or a new account: cuDNN's algorithm search compiles kernels into it.

each timed from the command's start to its first optimizer step (the job's ``first step of this job``
line) and to the compiled speed (its ``compiled from step N`` line, printed after the first
compiled step; for the run compiled from the start, its first step), with the median samples/s
of ``--windows`` logged windows that start a whole window after the switch (after the first
window for the run compiled from the start). A job is ended (SIGKILL: no preview) once it has
logged them. The background process's log (its build, compile and dynamo's account) is kept too.

``python -m benchmarks.compile_while_training --preset small --preset medium --work DIR --out OUT``

Writes ``OUT/compile_while_training.json`` (every job's times, rates and the switch's record) and
``OUT/summary.txt`` (one line per preset and job), each job's lines with their seconds since launch
to ``OUT/PRESET-JOB.log`` and its background compile's log to ``OUT/PRESET-JOB-background.log``.
``--set KEY=VALUE`` passes overrides to every job (the CPU dry run: ``--preset tiny --set
runtime.compile=on --set runtime.compile_while_training=on``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from diffscale.io.rundir import read_records

BACKGROUND_DONE = "the first step compiled and ran in"
"""The background process's line after its step: the seconds of its compile."""

COMPILED_FIRST = ("runtime.compile_while_training=off",)
JOBS = (("cold", ()), ("warm", ()), ("warm-eager", ("runtime.compile_while_training=on",)))
"""(name, overrides): the jobs of each preset, in this order, on the same cache."""
COLD_COMPILED = ("cold-compiled", COMPILED_FIRST)
"""The job ``--cold-compiled`` adds, on an empty cache of its own."""
MARKS = {"first_step_s": "first step of this job", "switch_started_s": "the background compile has built",
         "compiled_s": "compiled from step"}
"""What each job's log line starts with, for the seconds from its launch to it."""


def windows_after(run_dir: Path, since: int) -> list[float]:
    """samples/s of the logged windows that end after step ``since``."""
    return [float(r["samples_per_s"]) for r in read_records(run_dir)[0] if r["step"] > since and "samples_per_s" in r]


def steady_since(run_dir: Path) -> int | None:
    """The step after which the windows ran compiled and hold no compile: windows ending this step
    or later start a whole window after the switch (``compiled`` record), as the run's own
    ``compiled_speed`` record has it; or past the first window of a run compiled from its start; None: not yet."""
    training, events = read_records(run_dir)
    switch = next((e["step"] for e in events if e.get("kind") == "compiled"), None)
    first = next((e for e in events if e.get("kind") == "first_step"), None)
    if switch is not None:
        log_every = training[1]["step"] - training[0]["step"] if len(training) > 1 else None
        return switch + 2 * log_every - 1 if log_every else None
    if first is not None and first.get("eager") is False and training:
        return int(training[0]["step"])
    return None


def job(args: list[str], run_dir: Path, env: dict[str, str], *, windows: int, log: Path,
        limit_s: float) -> dict[str, Any]:
    """One ``diffscale train`` job, ended once ``windows`` steady windows are logged (or at ``limit_s``)."""
    start = time.perf_counter()
    marks: dict[str, float] = {}
    proc = subprocess.Popen([sys.executable, "-m", "diffscale", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)
    assert proc.stdout is not None
    ended_by = "exit"
    with log.open("w") as out:
        for line in proc.stdout:
            now = time.perf_counter() - start
            out.write(f"[{now:7.1f} s] {line}")
            out.flush()
            for key, prefix in MARKS.items():
                if key not in marks and line.startswith(prefix):
                    marks[key] = round(now, 2)
            since = steady_since(run_dir)
            if since is not None and len(windows_after(run_dir, since)) >= windows:
                ended_by = "enough windows"
            elif now > limit_s:
                ended_by = "time limit"
            else:
                continue
            proc.kill()
            break
    code = proc.wait()
    since = steady_since(run_dir)
    steady = windows_after(run_dir, since)[:windows] if since is not None else []
    events = read_records(run_dir)[1]
    record: dict[str, Any] = {**marks, "ended_by": ended_by, "exit_code": code,
                              "steady_samples_per_s": statistics.median(steady) if steady else None,
                              "steady_windows": steady}
    for kind in ("first_step", "compiled", "compiled_speed"):
        record[kind] = next((e for e in events if e.get("kind") == kind), None)
    if "compiled_s" not in record and (record["first_step"] or {}).get("eager") is False:
        record["compiled_s"] = record.get("first_step_s")  # compiled from its first step
    return record


def empty_caches(base: Path) -> dict[str, str]:
    """The environment of jobs on the caches under ``base``, made empty first."""
    shutil.rmtree(base, ignore_errors=True)
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    env.update(DIFFSCALE_CACHE_DIR=str(base / "cache"), CUDA_CACHE_PATH=str(base / "cuda-jit-cache"),
               PYTHONUNBUFFERED="1")
    return env


def background_alone(preset: str, overrides: list[str], *, work: Path, out: Path, limit_s: float) -> dict[str, Any]:
    """The background compile of ``preset``'s cold job, run by itself on empty caches: seconds
    from its launch to its exit and its own compile line."""
    from diffscale.config import ConfigSources, resolve_config
    from diffscale.training.background_compile import command, environment

    base = work / f"{preset}-background-alone"
    env = environment(empty_caches(base), local_world_size=1)  # as a one-process run starts it
    cfg = resolve_config(ConfigSources(preset=preset, overrides=list(overrides)))
    log = out / f"{preset}-background-alone.log"
    argv = command(base / "kernels")
    start = time.perf_counter()
    print(f"{preset} background-alone: {' '.join(argv[1:])}", flush=True)
    try:
        done = subprocess.run(argv, input=json.dumps(cfg.to_dict()), text=True, capture_output=True, env=env,
                              timeout=limit_s)
        output, code = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as expired:
        output, code = "".join(_text(part) for part in (expired.stdout, expired.stderr)), None
    took = time.perf_counter() - start
    log.write_text(output)
    line = next((text for text in output.splitlines() if text.startswith(BACKGROUND_DONE)), "")
    record = {"took_s": round(took, 2), "exit_code": code, "compile_line": line}
    print(f"  {preset} background-alone: {took:.1f} s to its exit (exit {code}); {line or 'no compile line'}",
          flush=True)
    return record


def _text(part: str | bytes | None) -> str:
    return part.decode(errors="replace") if isinstance(part, bytes) else part or ""


def measure(preset: str, overrides: list[str], *, work: Path, out: Path, windows: int, limit_s: float,
            cold_compiled: bool = False) -> dict:
    """The three jobs of ``preset`` on a cache of its own, made empty first (and ``COLD_COMPILED``
    on another)."""
    record: dict[str, Any] = {"preset": preset, "overrides": overrides, "windows": windows}
    jobs = [(name, extra, work / preset) for name, extra in JOBS]
    if cold_compiled:
        jobs.append((*COLD_COMPILED, work / f"{preset}-cold-compiled"))
    emptied: dict[Path, dict[str, str]] = {}
    for name, extra, base in jobs:
        if base not in emptied:  # a cache's first job finds it empty; the next ones what it left
            emptied[base] = empty_caches(base)
        env = emptied[base]
        run_dir = base / name
        args = ["train", "--preset", preset, "--out", str(run_dir),
                *[a for o in (*overrides, *extra) for a in ("--set", o)]]
        print(f"{preset} {name}: {' '.join(args)}", flush=True)
        record[name] = job(args, run_dir, env, windows=windows, log=out / f"{preset}-{name}.log", limit_s=limit_s)
        if (run_dir / "background-compile.log").is_file():
            shutil.copy(run_dir / "background-compile.log", out / f"{preset}-{name}-background.log")
        print(f"  {summary_line(preset, name, record[name])}", flush=True)
    return record


def _paused(compiled: dict[str, Any]) -> str:
    """The eager steps' pause for the background compile's kernel timing, where the run recorded one."""
    paused = compiled.get("paused_for_tuning_s")
    return "" if paused is None else f", eager steps paused {paused:.1f} s"


def summary_line(preset: str, name: str, job_record: dict[str, Any]) -> str:
    def s(key: str) -> str:
        value = job_record.get(key)
        return f"{value:.1f} s" if isinstance(value, (int, float)) else "-"

    steady = job_record.get("steady_samples_per_s")
    compiled = job_record.get("compiled") or {}
    switch = (f"; switch at step {compiled['step']} ({compiled['switch_s']:.1f} s, eager "
              f"{compiled['eager_samples_per_s'] or 0:,.0f} samples/s, background compile "
              f"{compiled.get('background_compile_s') or 0:.1f} s{_paused(compiled)})") if compiled else ""
    return (f"{preset} {name}: first step {s('first_step_s')}, compiled {s('compiled_s')}, steady "
            f"{f'{steady:,.0f}' if steady else '-'} samples/s{switch} [{job_record['ended_by']}]")


def comparison(record: dict[str, Any]) -> str:
    """Steady speed after the switch against the run compiled from the start, per eager-first job."""
    reference = record["warm"].get("steady_samples_per_s")
    parts = []
    for name in ("cold", "warm-eager"):
        steady = record[name].get("steady_samples_per_s")
        if steady and reference:
            parts.append(f"{name} {100 * (steady / reference - 1):+.1f} %")
    return f"{record['preset']}: steady after the switch vs compiled from the start: {', '.join(parts) or '-'}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compile_while_training", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", action="append", required=True, help="repeatable: each preset in turn")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config overrides")
    parser.add_argument("--windows", type=int, default=3, help="steady windows each job logs (default 3)")
    parser.add_argument("--limit", type=float, default=300.0, metavar="S", help="a job's time limit (default 300)")
    parser.add_argument("--work", type=Path, required=True, help="run dirs and caches (each preset's emptied first)")
    parser.add_argument("--out", type=Path, required=True, help="where the JSON, the summary and the logs go")
    parser.add_argument("--cold-compiled", action="store_true",
                        help="also a cold job compiled before its first step, on an empty cache of its own")
    parser.add_argument("--background-alone", action="store_true",
                        help="also the background compile by itself on an idle GPU, on an empty cache of its own")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    records, lines = [], []
    for preset in args.preset:
        record = measure(preset, args.set, work=args.work, out=args.out, windows=args.windows, limit_s=args.limit,
                         cold_compiled=args.cold_compiled)
        if args.background_alone:
            record["background-alone"] = background_alone(preset, args.set, work=args.work, out=args.out,
                                                          limit_s=args.limit)
        records.append(record)
        names = [name for name, _ in (*JOBS, COLD_COMPILED) if name in record]
        lines += [summary_line(preset, name, record[name]) for name in names] + [comparison(record)]
        if "background-alone" in record:
            alone = record["background-alone"]
            lines.append(f"{preset} background-alone: {alone['took_s']:.1f} s to its exit; {alone['compile_line']}")
        (args.out / "compile_while_training.json").write_text(json.dumps(records, indent=1) + "\n")
        (args.out / "summary.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
