"""Start-up time as a user meets it: ``diffscale train`` launched in a fresh run dir (cold:
nothing compiled yet), then the same run resumed, then a new run of the same network in another
run dir (both reuse the kernels the cold job left in the user's kernel cache), each timed from
launch to its first step (``first_step_s``: the line a compiled job prints after it) and to its
first logged step (``first_logged_step_s``: ``train.log_every`` steps later).

``python -m benchmarks.startup --preset small --json OUT``

Every job compiles before its first step (``runtime.compile_while_training=off``, first among the
overrides), as these figures always did; a run that trains while it compiles is measured by
``benchmarks.compile_while_training``.

Each job runs to the preset's first logged step (``--max-steps`` = ``train.log_every`` past
where it starts), so the time includes those steps. Every line the job prints is shown with
the seconds since launch, so the log says where the wait goes; ``--profile-resumed`` runs a
third job, resumed again, under cProfile and prints where its Python time went.

Settings that may shorten a cold compile are measured without changing diffscale's defaults:
``--inductor KEY=VALUE`` sets ``torch._inductor.config`` in both jobs before anything compiles
(e.g. ``triton.autotune_pointwise=False``: one launch configuration per pointwise kernel instead
of benchmarking several), environment variables such as ``TORCHINDUCTOR_COMPILE_THREADS`` pass
through, and ``--windows N`` runs the resumed job N logged windows, so the record's
``steady_samples_per_s`` (windows 2..N) says whether a setting costs speed; each ``--again-with
KEY=VALUE[;KEY=VALUE]`` resumes the run once more, after the new run, with those config overrides
added (e.g. ``runtime.cudnn_benchmark=off``; the record's ``again`` list, in turn), so settings that
only change a warm start are measured against the resumed job of the same round without another
cold compile. ``--skip-preview``
ends each job (SIGKILL, exit code -9) once its checkpoint is in place, before the preview it
would otherwise compile and write.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from diffscale import config as C
from diffscale.io.rundir import read_records

# The child prints dynamo's compile-phase totals and the cache hit counters at its first logged
# step (and when it exits, if it never logged): they say which part of the compile a job still pays.
_CHILD = """
from diffscale.runtime.bytecode import keep_bytecode
keep_bytecode()  # as the command line does first: bytecode kept where torch's installation has none
import atexit, json, os, runpy, sys
_reported = []
def _compile_report():
    if _reported:
        return
    _reported.append(True)
    try:
        from torch._dynamo.utils import compile_times, counters
    except Exception:
        return
    print("[compile times]", compile_times(repr="str", aggregate=True).replace(chr(10), " | "), flush=True)
    for group in ("inductor", "aot_autograd"):
        hits = {k: v for k, v in counters[group].items() if "cache" in k}
        if hits:
            print(f"[{group} cache]", dict(hits), flush=True)
atexit.register(_compile_report)
from diffscale.training.telemetry import Telemetry
_log = Telemetry.log
def _log_then_report(self, record):
    _log(self, record)
    _compile_report()
Telemetry.log = _log_then_report
# Inductor settings under test (--inductor KEY=VALUE): set on torch's global config before
# diffscale compiles; torch.compile's options patch only the keys they name.
_settings = json.loads(os.environ.pop("DIFFSCALE_BENCH_INDUCTOR", "{}"))
if _settings:
    import torch._inductor.config as _inductor_config
    for _key, _value in _settings.items():
        _owner = _inductor_config
        *_path, _leaf = _key.split(".")
        for _part in _path:
            _owner = getattr(_owner, _part)
        if not hasattr(_owner, _leaf):
            raise SystemExit(f"torch._inductor.config has no setting {_key!r}")
        setattr(_owner, _leaf, _value)
    print("[inductor settings]", _settings, flush=True)
sys.argv = ["diffscale", *sys.argv[1:]]
runpy.run_module("diffscale", run_name="__main__")
"""


COMPILED_FIRST = ("runtime.compile_while_training=off",)
"""Every job's first override (``--set`` may turn it on again)."""


def _first_logged_step(run_dir: Path, since: int) -> int | None:
    """The step of the first metrics.jsonl record past ``since``, if one was written."""
    return next((int(r["step"]) for r in read_records(run_dir)[0] if r["step"] > since and "loss" in r), None)


def _rates_after_first(run_dir: Path, since: int) -> list[float]:
    """samples/s of the logged windows past ``since`` except the first (which holds the compile)."""
    windows = [r for r in read_records(run_dir)[0] if r["step"] > since and "samples_per_s" in r]
    return [float(r["samples_per_s"]) for r in windows[1:]]


def parse_inductor(settings: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs for ``torch._inductor.config``; values read as Python literals
    (``False``, ``4``), anything else as a string."""
    parsed: dict[str, Any] = {}
    for item in settings:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--inductor {item!r}: expected KEY=VALUE, e.g. triton.autotune_pointwise=False")
        try:
            parsed[key] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            parsed[key] = text
    return parsed


def _checkpointed(run_dir: Path, step: int) -> bool:
    from diffscale.runtime.checkpoint import list_checkpoints, step_of

    return any(step_of(p) >= step for p in list_checkpoints(run_dir))


def timed_job(args: list[str], run_dir: Path, since: int, *, profile: Path | None = None,
              inductor: dict[str, Any] | None = None, end_at: int | None = None) -> dict:
    """One ``diffscale train`` job: seconds from launch to its first logged step past
    ``since`` and to its exit; its lines echoed with their times. ``inductor``: settings of
    ``torch._inductor.config`` the job starts with. ``end_at``: the job is killed once it has
    logged and its checkpoint of step ``end_at`` is in place, before the preview it would write."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    child = run_dir.parent / "startup_child.py"
    child.write_text(_CHILD)
    prefix = [sys.executable, *(["-m", "cProfile", "-o", str(profile)] if profile else []), str(child)]
    # Built-in data is rendered by the cold job and read from this folder by the later ones, and
    # compiled kernels go where a user's would (this folder's kernels/), not to a cache set for the machine.
    env = {"DIFFSCALE_CACHE_DIR": str(run_dir.parent / "cache"), **os.environ, "PYTHONUNBUFFERED": "1"}
    for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        env.pop(name, None)
    if inductor:
        env["DIFFSCALE_BENCH_INDUCTOR"] = json.dumps(inductor)
    start = time.perf_counter()
    first_log: float | None = None
    first_step: float | None = None  # the job's "first step of this job" line (compiled jobs print it)
    proc = subprocess.Popen([*prefix, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    assert proc.stdout is not None
    for line in proc.stdout:
        now = time.perf_counter() - start
        print(f"  [{now:7.1f} s] {line.rstrip()}", flush=True)
        if first_step is None and line.startswith("first step of this job"):
            first_step = now
        if first_log is None and _first_logged_step(run_dir, since) is not None:
            first_log = now
        if end_at is not None and first_log is not None and _checkpointed(run_dir, end_at):
            proc.kill()  # the checkpoint is renamed into place whole: the next job resumes from it
            print(f"  [{now:7.1f} s] (ended by the bench after the checkpoint of step {end_at})", flush=True)
            break
    code = proc.wait()
    ended = time.perf_counter() - start
    if first_log is None and _first_logged_step(run_dir, since) is not None:
        first_log = ended
    steady = _rates_after_first(run_dir, since)
    return {"first_step_s": first_step, "first_logged_step_s": first_log, "exit_s": ended, "exit_code": code,
            "steady_samples_per_s": statistics.median(steady) if steady else None}


def measure(preset: str, overrides: list[str], *, profile_resumed: bool, work: Path, windows: int = 1,
            inductor: dict[str, Any] | None = None, skip_preview: bool = False,
            again_with: list[str] | None = None) -> dict:
    cfg = C.resolve_config(C.ConfigSources(preset=preset, overrides=overrides))
    window = cfg.train.log_every
    run_dir = work / f"startup-{preset}"

    def train_args(out: Path) -> list[str]:
        # each job compiles before its first step, as these figures always did (the cold job's few steps
        # would end before a background compile): training while compiling is benchmarks.compile_while_training's
        return ["train", "--preset", preset, "--out", str(out),
                *[a for o in (*COMPILED_FIRST, *overrides) for a in ("--set", o)]]

    common = train_args(run_dir)
    record: dict = {"preset": preset, "overrides": overrides, "inductor": inductor or {}, "steps_per_job": window,
                    "resumed_windows": windows}
    print(f"cold: {preset}, {window} steps", flush=True)
    record["cold"] = timed_job([*common, "--max-steps", str(window)], run_dir, 0, inductor=inductor,
                               end_at=window if skip_preview else None)
    print(f"resumed: {preset}, {windows} x {window} more steps", flush=True)
    record["resumed"] = timed_job([*common, "--resume", "auto", "--max-steps", str((1 + windows) * window)], run_dir,
                                  window, inductor=inductor, end_at=(1 + windows) * window if skip_preview else None)
    resumed_to = (1 + windows) * window
    print(f"new run: {preset}, {window} steps, in another run dir", flush=True)
    new_dir = work / f"startup-{preset}-new"
    record["new_run"] = timed_job([*train_args(new_dir), "--max-steps", str(window)], new_dir, 0, inductor=inductor,
                                  end_at=window if skip_preview else None)
    record["again"] = []
    for group in again_with or []:
        extra = [item.strip() for item in group.split(";") if item.strip()]
        print(f"resumed again with {' '.join(extra)}: {windows} x {window} more steps", flush=True)
        again_to = resumed_to + windows * window
        job = timed_job([*common, *[a for o in extra for a in ("--set", o)], "--resume", "auto",
                         "--max-steps", str(again_to)],
                        run_dir, resumed_to, inductor=inductor, end_at=again_to if skip_preview else None)
        record["again"].append({"with": extra, **job})
        resumed_to = again_to
    if profile_resumed:
        import pstats

        stats_file = work / f"startup-{preset}.prof"
        print("resumed again, under cProfile", flush=True)
        record["profiled"] = timed_job([*common, "--resume", "auto", "--max-steps", str(resumed_to + window)],
                                       run_dir, resumed_to, profile=stats_file, inductor=inductor)
        stats = pstats.Stats(str(stats_file))
        stats.sort_stats("cumulative").print_stats(45)
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.startup", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", action="append", required=True, help="repeatable: each preset in turn")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config overrides")
    parser.add_argument("--inductor", action="append", default=[], metavar="KEY=VALUE",
                        help="a torch._inductor.config setting both jobs start with (repeatable), e.g. "
                             "triton.autotune_pointwise=False")
    parser.add_argument("--windows", type=int, default=1, metavar="N",
                        help="the resumed job runs N logged windows (default 1); with N > 1 the record holds the "
                             "median samples/s of windows 2..N (steady_samples_per_s), to compare settings' speed")
    parser.add_argument("--skip-preview", action="store_true",
                        help="end each job once its last checkpoint is written, before the preview it would write "
                             "(on a GPU that compiles the sampling network too: minutes of bench time)")
    parser.add_argument("--again-with", action="append", default=[], metavar="KEY=VALUE[;KEY=VALUE]",
                        help="resume once more, after the new run, with these config overrides added (repeatable: "
                             "one more job each, in turn), e.g. runtime.cudnn_benchmark=off")
    parser.add_argument("--profile-resumed", action="store_true", help="a third job under cProfile")
    parser.add_argument("--work", type=Path, help="where the run dirs go (default: a new temporary folder)")
    parser.add_argument("--json", type=Path, help="append one JSON line per preset here")
    args = parser.parse_args(argv)
    if args.windows < 1:
        parser.error("--windows must be at least 1")
    inductor = parse_inductor(args.inductor)
    work = args.work or Path(tempfile.mkdtemp(prefix="diffscale-startup-"))
    for preset in args.preset:
        record = measure(preset, args.set, profile_resumed=args.profile_resumed, work=work, windows=args.windows,
                         inductor=inductor, skip_preview=args.skip_preview, again_with=args.again_with)
        line = json.dumps(record)
        print(line, flush=True)
        if args.json:
            with args.json.open("a") as out:
                out.write(line + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
