"""Preflight checks from a command's measured usage (``diffscale probe``'s RUN_DIR/probe.json, or
--mem-per-rank / --workers-per-rank / --worker-mem): host and GPU memory per node, and the
memory request that covers it."""

from __future__ import annotations

import math

from diffscale.cluster.planning import estimates
from diffscale.cluster.planning.check import Check, Resolved
from diffscale.cluster.planning.usage import MEASURED_SHARE, RankUsage
from diffscale.cluster.profiles.types import Partition
from diffscale.runtime import resources


def usage_host_memory(part: Partition, r: Resolved, usage: RankUsage) -> Check:
    name = "host RAM per node"
    m = usage.host_memory(r.ranks_per_node)
    if m is None:
        return Check(name, None, f"the rank's own memory is not known ({usage.source})",
                     "pass --mem-per-rank GB, or measure it: diffscale probe --out RUN_DIR -- COMMAND")
    limit = part.mem_per_node_gb
    if r.mem_asked and r.mem_per_node_gb is not None:
        limit = min(limit, r.mem_per_node_gb) if limit is not None else r.mem_per_node_gb
    what = f"{m.describe()} ({usage.source})"
    if limit is None:
        return Check(name, None, f"{what}; the profile does not say how much memory a '{part.name}' node has",
                     "add mem_per_node_gb to the profile (`diffscale cluster discover` reads it from the scheduler)")
    usable = limit * MEASURED_SHARE
    if m.node_bytes > usable * resources.GIB:
        return Check(name, False, f"{what} of {limit:g} GiB per node ({MEASURED_SHARE:.0%} usable: {usable:.0f} GiB)",
                     _usage_fix(part, r, m, usable))
    return Check(name, True, f"{what} of {limit:g} GiB ({MEASURED_SHARE:.0%} usable)")


def _usage_fix(part: Partition, r: Resolved, m: resources.HostMemory, usable_gib: float) -> str:
    fixes = []
    fit = m.workers_that_fit(usable_gib * resources.GIB)
    if m.workers and 0 <= fit < m.workers:
        fixes.append(f"num_workers <= {fit} per rank (your DataLoader; --workers-per-rank {fit} to re-check)")
    need_gib = math.ceil(resources.gib(m.node_bytes) / MEASURED_SHARE)
    if part.mem_per_node_gb is None or need_gib <= part.mem_per_node_gb:
        fixes.append(f"--mem {need_gib}")
    ranks = m.ranks_that_fit(usable_gib * resources.GIB)
    if 1 <= ranks < r.ranks_per_node:
        flag = "--gpus-per-node" if r.use_gpus else "--procs-per-node"
        fixes.append(f"{flag} {ranks} and more --nodes")
    if not fixes:
        fixes.append("a partition with more memory per node")
    return ", or ".join(fixes)


def usage_gpu_memory(part: Partition, r: Resolved, usage: RankUsage) -> Check:
    name = "GPU memory"
    if usage.gpu_bytes is None:
        return Check(name, None, f"the probe measured no GPU memory ({usage.source})")
    used = usage.gpu_bytes / 1e9
    what = f"~{used:.1f} GB per rank ({usage.source})"
    if part.gpu_memory_gb is None:
        return Check(name, None, f"{what}; the profile does not say how much memory a '{part.name}' GPU has")
    if used > 0.9 * part.gpu_memory_gb:
        return Check(name, False, f"{what} > 90 % of {part.gpu_memory_gb:g} GB per {part.gpu_type or 'GPU'}",
                     "lower the batch per GPU (and accumulate gradients), or use a partition with larger GPUs")
    return Check(name, True, f"{what} of {part.gpu_memory_gb:g} GB")


def request_gib(usage: RankUsage, ranks_per_node: int, node_limit_gb: float | None) -> tuple[int, str] | None:
    """Host memory to ask per node for a command whose ranks' needs are known, and the note."""

    m = usage.host_memory(ranks_per_node)
    if m is None:
        return None
    gib = math.ceil(resources.gib(m.node_bytes) * estimates.HOST_MEMORY_HEADROOM)
    cap = ""
    if node_limit_gb is not None and gib > node_limit_gb:
        gib, cap = int(node_limit_gb), f", capped at the node's {node_limit_gb:g} GiB"
    return gib, f"host memory {gib} GiB per node: {m.describe()} ({usage.source}), plus a quarter for headroom{cap}"
