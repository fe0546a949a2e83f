"""CPU training beside busy processes: samples/s of ``diffscale train`` on the CPU alone and
beside N processes that each keep a core busy, with the threads chosen from the free cores
(``runtime.cpu_threads: 0``, the default) and with a thread per core (torch's own default).

``python -m benchmarks.cpuload --busy 0 2 4 --steps 60 --json OUT`` runs each case as its
own ``diffscale train`` process (threads are set once per process) and prints one table; the
record holds the machine's cores and its load before each case, since a shared machine's other
users count as busy processes too. ``--online`` measures a field trainer instead: steps/s of one
``OnlineTrainer.train_for`` round (``benchmarks.online`` on the CPU, the field preset's batch), the
climate users' setting of a trainer beside the simulation's busy ranks. Under ``taskset -c 0,1``
on an idle host, the spinning processes inherit the two cores: an idle two-core machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import child_env
from diffscale.runtime.resources import busy_elsewhere

SPIN = "while True: pass"


def _train(out: Path, preset: str, steps: int, threads: int, batch: int | None) -> float:
    """Median samples/s of a fresh ``diffscale train`` process over its logged steps after the first third."""
    cmd = [sys.executable, "-m", "diffscale", "train", "--preset", preset, "--device", "cpu", "--out", str(out),
           "--set", f"train.steps={steps}", "--set", "train.log_every=5", "--set", f"train.checkpoint_every={steps}",
           "--set", "train.sample_every=0", "--set", "train.sample_count=1", "--set", "train.sample_steps=1",
           "--set", f"runtime.cpu_threads={threads}"]
    if batch:
        cmd += ["--set", f"train.batch_per_gpu={batch}"]
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    subprocess.run(cmd, check=True, capture_output=True, env=env, timeout=3600)
    rates = [r["samples_per_s"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
             if "samples_per_s" in r and r["step"] > steps // 3]
    return statistics.median(rates)


def _online(out: Path, preset: str, steps: int, threads: int, batch: int | None) -> float:
    """Training steps/s of one ``OnlineTrainer.train_for(steps)`` round, in a fresh process."""
    record = out.parent / "online.json"
    cmd = [sys.executable, "-m", "benchmarks.online", "--preset", preset, "--device", "cpu",
           "--round-steps", str(steps), "--warmup", str(max(steps // 10, 5)), "--repeats", "1", "--pushes", "1",
           "--members", "2", "--sample-steps", "2", "--set", f"runtime.cpu_threads={threads}", "--json", str(record)]
    if batch:
        cmd += ["--set", f"train.batch_per_gpu={batch}"]
    env = child_env({k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"})
    subprocess.run(cmd, check=True, capture_output=True, env=env, timeout=3600)
    return float(json.loads(record.read_text())["steps_per_s"])


def measure(busy: int, preset: str, steps: int, threads: int, batch: int | None,
            online: bool = False) -> dict[str, float | int]:
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(busy)]
    try:
        before = busy_elsewhere()
        with tempfile.TemporaryDirectory() as tmp:
            rate = (_online if online else _train)(Path(tmp) / "run", preset, steps, threads, batch)
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    return {"busy": busy, "threads": threads, "steps_per_s" if online else "samples_per_s": rate,
            "busy_elsewhere_at_start": before}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy", type=int, nargs="+", default=[0, 2, 4], help="busy processes beside training")
    parser.add_argument("--preset", help="default: tiny, or field-icon with --online")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, help="train.batch_per_gpu (default: the preset's)")
    parser.add_argument("--online", action="store_true", help="time OnlineTrainer.train_for rounds (steps/s)")
    parser.add_argument("--json", type=Path, help="write the records here")
    args = parser.parse_args(argv)
    args.preset = args.preset or ("field-icon" if args.online else "tiny")
    unit = "steps_per_s" if args.online else "samples_per_s"
    cores = len(os.sched_getaffinity(0))
    rows = []
    for busy in args.busy:
        for threads in (0, cores):  # 0: chosen from the free cores; cores: a thread per core
            rows.append(measure(busy, args.preset, args.steps, threads, args.batch, args.online))
            row = rows[-1]
            print(f"busy {busy}  threads {'auto' if threads == 0 else threads:>4}  "
                  f"{row[unit]:8.1f} {unit.replace('_per_s', '/s')}  "
                  f"(busy elsewhere at start {row['busy_elsewhere_at_start']})",
                  flush=True)
    if args.json:
        from diffscale.io.atomic import write_text

        write_text(args.json, json.dumps({"cores": cores, "preset": args.preset, "online": args.online,
                                          "steps": args.steps, "batch": args.batch, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
