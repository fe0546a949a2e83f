"""Start-up time as a user meets it: ``diffscale train`` launched in a fresh run dir (cold:
nothing compiled yet), then the same run resumed (the run's cached kernels reused), each
timed from launch to its first logged step.

``python -m diffscale.bench.startup --preset small --json OUT``

Each job runs to the preset's first logged step (``--max-steps`` = ``train.log_every`` past
where it starts), so the time includes those steps. Every line the job prints is shown with
the seconds since launch, so the log says where the wait goes; ``--profile-resumed`` runs a
third job, resumed again, under cProfile and prints where its Python time went.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .. import config as C

# The child prints dynamo's compile-phase totals and the cache hit counters when it exits:
# they say which part of the compile a resumed job still pays.
_CHILD = """
import atexit, runpy, sys
def _compile_report():
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
sys.argv = ["diffscale", *sys.argv[1:]]
runpy.run_module("diffscale", run_name="__main__")
"""


def _first_logged_step(run_dir: Path, since: int) -> int | None:
    """The step of the first metrics.jsonl record past ``since``, if one was written."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return None
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record.get("step"), int) and record["step"] > since and "loss" in record:
            return int(record["step"])
    return None


def timed_job(args: list[str], run_dir: Path, since: int, *, profile: Path | None = None) -> dict:
    """One ``diffscale train`` job: seconds from launch to its first logged step past
    ``since`` and to its exit; its lines echoed with their times."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    child = run_dir.parent / "startup_child.py"
    child.write_text(_CHILD)
    prefix = [sys.executable, *(["-m", "cProfile", "-o", str(profile)] if profile else []), str(child)]
    # Built-in data is rendered by the cold job and read from this folder by the resumed ones;
    # compiled kernels go where a user's would (the run dir), not to a cache set for the machine.
    env = {"DIFFSCALE_CACHE_DIR": str(run_dir.parent / "cache"), **os.environ, "PYTHONUNBUFFERED": "1"}
    for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        env.pop(name, None)
    start = time.perf_counter()
    first_log: float | None = None
    proc = subprocess.Popen([*prefix, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    assert proc.stdout is not None
    for line in proc.stdout:
        now = time.perf_counter() - start
        print(f"  [{now:7.1f} s] {line.rstrip()}", flush=True)
        if first_log is None and _first_logged_step(run_dir, since) is not None:
            first_log = now
    code = proc.wait()
    ended = time.perf_counter() - start
    if first_log is None and _first_logged_step(run_dir, since) is not None:
        first_log = ended
    return {"first_logged_step_s": first_log, "exit_s": ended, "exit_code": code}


def measure(preset: str, overrides: list[str], *, profile_resumed: bool, work: Path) -> dict:
    cfg = C.resolve_config(C.ConfigSources(preset=preset, overrides=overrides))
    window = cfg.train.log_every
    run_dir = work / f"startup-{preset}"
    common = ["train", "--preset", preset, "--out", str(run_dir), *[a for o in overrides for a in ("--set", o)]]
    record: dict = {"preset": preset, "overrides": overrides, "steps_per_job": window}
    print(f"cold: {preset}, {window} steps", flush=True)
    record["cold"] = timed_job([*common, "--max-steps", str(window)], run_dir, 0)
    print(f"resumed: {preset}, {window} more steps", flush=True)
    record["resumed"] = timed_job([*common, "--resume", "auto", "--max-steps", str(2 * window)], run_dir, window)
    if profile_resumed:
        import pstats

        stats_file = work / f"startup-{preset}.prof"
        print("resumed again, under cProfile", flush=True)
        record["profiled"] = timed_job([*common, "--resume", "auto", "--max-steps", str(3 * window)], run_dir,
                                       2 * window, profile=stats_file)
        stats = pstats.Stats(str(stats_file))
        stats.sort_stats("cumulative").print_stats(45)
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m diffscale.bench.startup", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", action="append", required=True, help="repeatable: each preset in turn")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config overrides")
    parser.add_argument("--profile-resumed", action="store_true", help="a third job under cProfile")
    parser.add_argument("--work", type=Path, help="where the run dirs go (default: a new temporary folder)")
    parser.add_argument("--json", type=Path, help="append one JSON line per preset here")
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="diffscale-startup-"))
    for preset in args.preset:
        record = measure(preset, args.set, profile_resumed=args.profile_resumed, work=work)
        line = json.dumps(record)
        print(line, flush=True)
        if args.json:
            with args.json.open("a") as out:
                out.write(line + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
