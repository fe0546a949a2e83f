"""Streamed against resident data: ``diffscale train`` on a generated image folder, per preset,
with ``data.resident`` on and off; per run the median samples/s and data-wait share of the
logged windows after the first (compilation), the run's own end summary of its data wait, and
the peak host RSS (and PSS) of the rank and of each of its loader workers, sampled twice a second.

``python -m benchmarks.streaming --preset medium xl --images 200000 --steps 300 --work DIR``

The images (``--side`` px JPEGs in 10 class folders, written once by ``--gen-workers`` processes)
are decoded once into the cache at each preset's resolution (the first run's start-up); the
decoded size per preset is printed, so ``--images`` can be chosen to exceed a GPU's memory (the
resident runs then fail, which is what the streaming path is for: ``--resident off``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.imagefolder import make_image_folder

GIB = 2**30


@dataclass
class Memory:
    """Peak host memory (bytes) of a rank and of its loader workers, sampled twice a second."""

    rank_rss: int = 0
    rank_pss: int = 0
    worker_rss: dict[int, int] = field(default_factory=dict)
    """Peak RSS of each loader worker (pid -> bytes)."""
    worker_pss: dict[int, int] = field(default_factory=dict)

    def sample(self, rank: Any) -> None:
        import psutil

        try:
            self.rank_rss, self.rank_pss = _peak(rank, self.rank_rss, self.rank_pss)
            cmdline = rank.cmdline()
            children = rank.children()
        except psutil.Error:
            return
        for child in children:
            try:  # loader workers are forks of the rank (its command line); compile workers are not
                if child.cmdline() != cmdline:
                    continue
                rss, pss = _peak(child, self.worker_rss.get(child.pid, 0), self.worker_pss.get(child.pid, 0))
            except psutil.Error:
                continue
            self.worker_rss[child.pid], self.worker_pss[child.pid] = rss, pss


def _peak(proc: Any, rss: int, pss: int) -> tuple[int, int]:
    info = proc.memory_full_info()
    return max(rss, int(info.rss)), max(pss, int(getattr(info, "pss", 0)))


def _median_after_first(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows[1:] if key in r]
    return statistics.median(values) if values else None


def run_one(preset: str, resident: str, args: argparse.Namespace, images: Path) -> dict[str, Any]:
    import psutil

    out = args.work / "runs" / f"{preset}-{resident}"
    shutil.rmtree(out, ignore_errors=True)
    command = [sys.executable, "-m", "diffscale", "train", "--preset", preset, "--data", f"imagefolder:{images}",
               "--out", str(out), "--set", f"data.resident={resident}", "--set", f"train.steps={args.steps}",
               "--set", f"train.log_every={args.log_every}", "--set", "train.checkpoint_every=1000000",
               "--set", "train.sample_count=4", "--set", "train.sample_steps=2",
               # compiled before the first step, as the figures were measured: the steady speed of a short run
               "--set", "runtime.compile_while_training=off"]
    if args.workers is not None:
        command += ["--set", f"data.workers={args.workers}"]
    for item in args.set:
        command += ["--set", item]
    started = time.perf_counter()
    memory = Memory()
    log = out.with_suffix(".log")
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as sink:
        job = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
        rank = psutil.Process(job.pid)
        while job.poll() is None:
            memory.sample(rank)
            time.sleep(0.5)
    text = log.read_text()
    record: dict[str, Any] = {"preset": preset, "resident": resident, "exit_code": job.returncode,
                              "wall_s": time.perf_counter() - started, "log": str(log)}
    if job.returncode != 0:
        record["error"] = text.strip().splitlines()[-1] if text.strip() else "no output"
        return record
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]
    placement = re.search(r"\| data (.*)$", next((line for line in text.splitlines() if line.startswith("diffscale |")),
                                                 ""))
    summary = next((line for line in text.splitlines() if line.startswith("data wait: ")), "")
    workers = sorted(memory.worker_rss.values())
    record.update({
        "samples_per_s": _median_after_first(rows, "samples_per_s"),
        "data_wait_share": _median_after_first(rows, "data_wait_share"),
        "windows": max(len(rows) - 1, 0), "data": placement.group(1) if placement else "", "summary": summary,
        "rank_rss_gib": memory.rank_rss / GIB, "rank_pss_gib": memory.rank_pss / GIB,
        "loader_workers": len(workers),
        "worker_rss_gib": [w / GIB for w in workers],
        "worker_pss_gib": sorted(p / GIB for p in memory.worker_pss.values()),
    })
    return record


def describe(record: dict[str, Any]) -> str:
    head = f"{record['preset']} resident={record['resident']}:"
    if record["exit_code"] != 0:
        return f"{head} failed (exit {record['exit_code']}): {record['error']} ({record['log']})"
    sps, wait = record["samples_per_s"], record["data_wait_share"]
    rate = f"{sps:,.1f} samples/s" if sps is not None else "no window after the first"
    share = f"data wait {wait:.1%}" if wait is not None else "data wait unknown"
    workers = record["worker_rss_gib"]
    if workers:
        each = ", ".join(f"{w:.2f}" for w in workers)
        pss = ", ".join(f"{p:.2f}" for p in record["worker_pss_gib"])
        per_worker = f"{len(workers)} loader worker{'s' if len(workers) > 1 else ''} RSS [{each}] GiB, PSS [{pss}] GiB"
    else:
        per_worker = "no loader workers"
    return (f"{head} {rate}, {share} (median of {record['windows']} windows); host RSS rank "
            f"{record['rank_rss_gib']:.2f} GiB (PSS {record['rank_pss_gib']:.2f}), {per_worker}; "
            f"wall {record['wall_s']:.0f} s\n    {record['summary']}")


def compare(records: list[dict[str, Any]]) -> list[str]:
    """``medium: streamed 3,464 vs resident 3,470 samples/s (-0.2 %)`` per preset that has both."""
    lines = []
    for preset in dict.fromkeys(r["preset"] for r in records):
        by = {r["resident"]: r.get("samples_per_s") for r in records if r["preset"] == preset}
        on, off = by.get("on"), by.get("off")
        if on and off:
            lines.append(f"{preset}: streamed {off:,.1f} vs resident {on:,.1f} samples/s ({off / on - 1:+.1%})")
    return lines


def decode_once(presets: list[str], images: Path, count: int) -> None:
    """Decode the folder into the cache at each preset's resolution before the timed runs, in a
    process of its own (its pool's workers are not the runs' loader workers), and say how large
    the decoded data is and how long the decoding took."""
    from diffscale.config.presets import get_preset
    from diffscale.data.placement import size_text

    sides = {name: int(getattr(get_preset(name).model, "sample_size", 0)) for name in presets}
    if not all(sides.values()):
        raise SystemExit(f"not image presets: {', '.join(n for n, side in sides.items() if not side)}")
    for side in dict.fromkeys(sides.values()):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import sys; from diffscale.tasks.images.dataset import open_image_data; "
                        "open_image_data('imagefolder:' + sys.argv[1], int(sys.argv[2]))", str(images), str(side)],
                       check=True)
        names = ", ".join(n for n in presets if sides[n] == side)
        print(f"{names}: {count:,} images decoded at {side} px = {size_text(count * 3 * side * side)} (RGB), "
              f"in the cache after {time.perf_counter() - started:.0f} s", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", nargs="+", default=["medium", "xl"])
    parser.add_argument("--images", type=int, default=200_000, help="images in the generated folder")
    parser.add_argument("--side", type=int, default=128, help="side of the generated JPEGs, px")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--log-every", type=int, default=25)
    parser.add_argument("--resident", nargs="+", choices=("on", "off"), default=["on", "off"])
    parser.add_argument("--workers", type=int, default=None, help="data.workers (default: the run decides)")
    parser.add_argument("--gen-workers", type=int, default=0, help="processes writing the images (0: one per CPU)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/diffscale-streaming"))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="added to every run")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    os.environ.setdefault("DIFFSCALE_CACHE_DIR", str(args.work / "cache"))
    images = make_image_folder(args.work / f"imgs-{args.images}-{args.side}", args.images, side=args.side,
                               suffix="jpg", workers=args.gen_workers)
    decode_once(args.preset, images, args.images)
    records = []
    for preset in args.preset:
        for resident in args.resident:
            records.append(run_one(preset, resident, args, images))
            print(describe(records[-1]), flush=True)
    for line in compare(records):
        print(line)
    if args.json is not None:
        args.json.write_text(json.dumps({"images": args.images, "side": args.side, "steps": args.steps,
                                         "records": records}, indent=1))
    return 0 if all(r["exit_code"] == 0 for r in records) else 1


if __name__ == "__main__":
    raise SystemExit(main())
