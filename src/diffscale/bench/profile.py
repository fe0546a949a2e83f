"""Where a training step's time goes: the top kernels (GPU) or operators (CPU) of a few
profiled steps, and their share per kind (convolution, matmul, attention, fused Triton
kernels, optimizer, communication, copies). ``diffscale bench --profile N`` records it."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from diffscale.runtime.device import synchronize

# First matching rule wins; names are lower-cased kernel/operator names.
KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("communication", ("nccl", "allreduce", "all_reduce", "gloo")),
    # Inductor names its kernels after the ops they fuse ("triton_poi_fused_convolution_1"): first.
    ("fused (Triton)", ("triton",)),
    ("attention", ("flash", "fmha", "attention", "attn")),
    ("convolution", ("conv", "fprop", "dgrad", "wgrad", "implicit_gemm", "cudnn", "xmma_fprop")),
    ("optimizer/EMA", ("adam", "multi_tensor", "foreach", "_amp_")),
    ("matmul", ("gemm", "cutlass", "matmul", "::mm", "addmm", "bmm", "nvjet")),
    ("normalisation", ("norm",)),
    ("copy/fill", ("memcpy", "memset", "copy", "fill", "cat", "index")),
)


def kind_of(name: str) -> str:
    lowered = name.lower()
    for kind, needles in KINDS:
        if any(n in lowered for n in needles):
            return kind
    return "other elementwise/reduction"


HOST_GAP_US = 20.0  # kernels of one queued graph follow each other within a few microseconds


def gpu_timeline_us(intervals: Iterable[tuple[float, float]]) -> tuple[float, float, float]:
    """(busy, span, host gaps): time covered by at least one interval (kernels on any stream:
    overlap counts once), the span from the first start to the last end, and the sum of the
    gaps of at least ``HOST_GAP_US``. Span minus busy is all time the GPU sat idle; the long
    gaps are the part where it waited for the host (launches, synchronisation)."""
    ordered = sorted(intervals)
    if not ordered:
        return 0.0, 0.0, 0.0
    busy, gaps, (cur_start, cur_end) = 0.0, 0.0, ordered[0]
    for start, end in ordered[1:]:
        if start > cur_end:
            busy += cur_end - cur_start
            gaps += start - cur_end if start - cur_end >= HOST_GAP_US else 0.0
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    busy += cur_end - cur_start
    return busy, max(end for _, end in ordered) - ordered[0][0], gaps


STEP_RANGE = "diffscale:profiled_step"


def _gpu_kernels(prof: torch.profiler.profile, steps: int) -> tuple[list[tuple[str, float, float]], int]:
    """(name, start, end) of the kernels of the profiled steps after the first, and how many
    steps they are. The first step only refills the queue: the caller has just synchronised,
    and until the host is a step ahead again the GPU waits for launches, which a training run
    never does. Each step's range is mirrored on the GPU timeline around its own kernels."""
    cuda = torch.autograd.DeviceType.CUDA
    events = [e for e in prof.events() if getattr(e, "device_type", None) == cuda]
    ranges = {e.name: e.time_range for e in events if getattr(e, "is_user_annotation", False)}
    first, last = ranges.get(f"{STEP_RANGE}1"), ranges.get(f"{STEP_RANGE}{steps}")
    low, high, counted = (first.start, last.end, steps) if first and last else (float("-inf"), float("inf"), steps + 1)
    # Ranges such as "nccl:all_reduce" or "DistributedDataParallel.forward" are mirrored on
    # the GPU timeline around kernels that are counted themselves: counting both doubles.
    kernels = [(e.name, float(e.time_range.start), float(e.time_range.end)) for e in events
               if not getattr(e, "is_user_annotation", False) and low <= e.time_range.start < high]
    return kernels, counted


def profile_steps(step: Callable[[], object], steps: int, device: torch.device, top: int = 15,
                  trace: Path | None = None) -> dict:
    """Profile ``steps`` calls of ``step`` (after one more that is left out on a GPU);
    per-step milliseconds of the top entries and of each kind, and on a GPU how long it sat
    idle between kernels. ``trace``: also write the Chrome trace (chrome://tracing, Perfetto)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for index in range(steps + 1):
            with record_function(f"{STEP_RANGE}{index}"):
                step()
        synchronize(device)
    if trace is not None:
        trace.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(trace))
    totals: dict[str, list[float]] = {}
    timeline = {}
    if cuda:
        kernels, counted = _gpu_kernels(prof, steps)
        for name, start, end in kernels:
            entry = totals.setdefault(name, [0.0, 0])
            entry[0] += end - start
            entry[1] += 1
        # The host queues steps ahead, so the GPU's span over the counted steps is their time.
        busy, span, gaps = gpu_timeline_us((start, end) for _, start, end in kernels)
        timeline = {"busy_ms_per_step": busy / 1000 / counted, "span_ms_per_step": span / 1000 / counted,
                    "idle_ms_per_step": (span - busy) / 1000 / counted,
                    "host_gap_ms_per_step": gaps / 1000 / counted}
    else:
        counted = steps + 1
        for event in prof.key_averages():
            # Operators nest: count leaf time only (self time), and skip ranges (the profiled
            # steps' own among them) and profiler markers.
            if getattr(event, "is_user_annotation", False) or event.key.startswith("["):
                continue
            totals[event.key] = [float(event.self_cpu_time_total), event.count]
    rows = [(name, us / 1000 / counted, count // counted) for name, (us, count) in totals.items() if us > 0]
    total = sum(ms for _, ms, _ in rows) or 1.0
    kinds: dict[str, float] = {}
    for name, ms, _ in rows:
        kinds[kind_of(name)] = kinds.get(kind_of(name), 0.0) + ms
    rows.sort(key=lambda r: r[1], reverse=True)
    return {
        "unit": "GPU kernel time per step" if cuda else "CPU operator self time per step",
        "total_ms_per_step": total,
        **timeline,
        "kinds": {k: {"ms": v, "share": v / total} for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])},
        "top": [{"name": name[:160], "kind": kind_of(name), "ms": ms, "share": ms / total, "calls": calls}
                for name, ms, calls in rows[:top]],
    }


def render_profile(record: dict) -> str:
    """Plain-text report of one record's profile (for the console and the log)."""
    prof = record.get("profile")
    if not prof:
        return ""
    label = f" ({record['label']})" if record.get("label") else ""
    lines = [f"{record['preset']} {record['recipe']}{label} x{record['world_size']}: {prof['unit']} "
             f"{prof['total_ms_per_step']:.1f} ms (step {record['step_s'] * 1000:.1f} ms)"]
    if "idle_ms_per_step" in prof:
        lines.append(f"  GPU idle between kernels {prof['idle_ms_per_step']:.2f} ms of "
                     f"{prof['span_ms_per_step']:.2f} ms per profiled step, "
                     f"{prof['host_gap_ms_per_step']:.2f} ms of it in gaps of 20 us or more (waiting for the host)")
    for kind, v in prof["kinds"].items():
        lines.append(f"  {kind:<28} {v['ms']:8.2f} ms {v['share']:6.1%}")
    if prof.get("per_rank"):
        lines.append("  per rank, communication / other kernels / idle (the least communication is the transfer):")
        lines.extend(f"    rank {r['rank']}: {r['communication_ms']:7.2f} / {r['other_ms']:7.2f} / "
                     f"{r.get('idle_ms', float('nan')):6.2f} ms" for r in prof["per_rank"])
    lines.append("  top entries:")
    for row in prof["top"]:
        lines.append(f"  {row['ms']:8.2f} ms {row['share']:6.1%} x{row['calls']:<4} [{row['kind']}] {row['name'][:90]}")
    return "\n".join(lines)
