"""CPU training beside busy processes: samples/s of ``diffscale train`` on the CPU alone and
beside N processes that each keep a core busy, with the threads chosen from the free cores
(``runtime.cpu_threads: 0``, the default) and with a thread per core (torch's own default).

``python -m diffscale.bench.cpuload --busy 0 2 4 --steps 60 --json OUT`` runs each case as its
own ``diffscale train`` process (threads are set once per process) and prints one table; the
record holds the machine's cores and its load before each case, since a shared machine's other
users count as busy processes too.
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


def measure(busy: int, preset: str, steps: int, threads: int, batch: int | None) -> dict[str, float | int]:
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(busy)]
    try:
        before = busy_elsewhere()
        with tempfile.TemporaryDirectory() as tmp:
            rate = _train(Path(tmp) / "run", preset, steps, threads, batch)
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    return {"busy": busy, "threads": threads, "samples_per_s": rate, "busy_elsewhere_at_start": before}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy", type=int, nargs="+", default=[0, 2, 4], help="busy processes beside training")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, help="train.batch_per_gpu (default: the preset's)")
    parser.add_argument("--json", type=Path, help="write the records here")
    args = parser.parse_args(argv)
    cores = len(os.sched_getaffinity(0))
    rows = []
    for busy in args.busy:
        for threads in (0, cores):  # 0: chosen from the free cores; cores: a thread per core
            rows.append(measure(busy, args.preset, args.steps, threads, args.batch))
            row = rows[-1]
            print(f"busy {busy}  threads {'auto' if threads == 0 else threads:>4}  "
                  f"{row['samples_per_s']:8.1f} samples/s  (busy elsewhere at start {row['busy_elsewhere_at_start']})",
                  flush=True)
    if args.json:
        from diffscale.io.atomic import write_text

        write_text(args.json, json.dumps({"cores": cores, "preset": args.preset, "steps": args.steps,
                                          "batch": args.batch, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
