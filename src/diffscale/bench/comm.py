"""All-reduce bandwidth between the ranks of a job, at gradient-bucket sizes.

``torchrun --nproc_per_node=4 -m diffscale.bench.comm [--mib 8 50 256] [--json OUT]``

Scaling efficiency depends on how fast the cards exchange gradients; this measures it on the
same host and software as ``diffscale bench``. Bus bandwidth is nccl-tests' figure,
``bytes / time * 2 (n - 1) / n``: comparable across world sizes, and on an NVLink node it
reaches a few hundred GB/s; through host memory it is tens at most.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.distributed as dist

from diffscale.config import Device
from diffscale.runtime.device import pick_device, synchronize
from diffscale.runtime.distributed import detect_launch, init_distributed


def bus_bandwidth_gbs(nbytes: int, seconds: float, world_size: int) -> float:
    """nccl-tests' bus bandwidth of one all-reduce of ``nbytes``, in GB/s."""
    return nbytes / seconds * 2 * (world_size - 1) / world_size / 1e9


def describe(row: dict) -> str:
    """One measured size as a line: what the module and ``diffscale bench --comm`` print."""
    return (f"all-reduce {row['mib']:7.1f} MiB x{row['world_size']} ({row['backend']}): "
            f"{row['ms']:8.3f} ms, bus bandwidth {row['bus_gbs']:7.1f} GB/s")


def _all_reduce(buf: torch.Tensor, times: int) -> None:
    for _ in range(times):
        dist.all_reduce(buf)
    synchronize(buf.device)


def measure(sizes_mib: list[float], repeats: int, dtype: torch.dtype) -> list[dict]:
    launch = detect_launch()
    device = pick_device(Device.AUTO, launch.local_rank)
    ctx = init_distributed(launch, device, join_timeout_s=300, collective_timeout_s=600)
    rows = []
    try:
        for mib in sizes_mib:
            count = int(mib * 2**20) // torch.tensor([], dtype=dtype).element_size()
            buf = torch.ones(count, dtype=dtype, device=device)
            _all_reduce(buf, 3)  # warm-up: NCCL sets up its channels on the first calls
            ctx.barrier()
            start = time.perf_counter()
            _all_reduce(buf, repeats)
            seconds = (time.perf_counter() - start) / repeats
            nbytes = count * buf.element_size()
            rows.append({"mib": mib, "ms": seconds * 1e3, "world_size": ctx.world_size, "backend": ctx.backend,
                         "bus_gbs": bus_bandwidth_gbs(nbytes, seconds, ctx.world_size)})
    finally:
        ctx.shutdown()
    return rows if ctx.is_main else []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m diffscale.bench.comm")
    parser.add_argument("--mib", type=float, nargs="+", default=[8, 50, 100, 256],
                        help="message sizes in MiB (gradient buckets: small 8, medium 50, xl 227 in bf16)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    rows = measure(args.mib, args.repeats, torch.bfloat16 if args.dtype == "bf16" else torch.float32)
    for r in rows:
        print(describe(r), flush=True)
    if rows and args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
