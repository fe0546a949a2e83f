"""Preflight checks of a diffscale run's data: the path exists where the job runs, and where the
data lives (resident on the device or streamed with loader workers) fits the partition."""

from __future__ import annotations

from diffscale.cluster.planning import data_check, estimates
from diffscale.cluster.planning.check import Check, Resolved, mem_limit_gib
from diffscale.cluster.planning.workload import DiffscaleRun, Workload
from diffscale.cluster.profiles.types import Partition


def data_path(workload: Workload) -> Check | None:
    """A diffscale run's data path as the job will read it (absolute): found on this host, or
    not, in which case it may still exist on the cluster's own file system (nothing assumed)."""
    if not isinstance(workload, DiffscaleRun) or workload.data_found is None:
        return None
    source = workload.config.data.source
    if workload.data_found:
        return Check("data", True, f"{source} (found here; the job reads this absolute path)")
    return Check("data", None, f"{source} does not exist on this host",
                 "make sure it exists on the cluster's file system, where the job reads it, or pass --data with "
                 "a path that does")


def data_placement(part: Partition, r: Resolved, workload: Workload) -> data_check.DataPlacement | None:
    """Where an image run's data will live on ``part`` (None: not an image run whose data size is
    known here, or the device's memory is not known)."""
    if not isinstance(workload, DiffscaleRun) or workload.data_size is None:
        return None
    data = workload.config.data
    return data_check.placement(workload.data_size, data.resident.value, data.workers, part,
                                ranks_per_node=r.ranks_per_node, cpus_per_rank=r.cpus_per_rank,
                                use_gpus=r.use_gpus, mem_limit_gib=mem_limit_gib(part, r))


def data_on_device(part: Partition, r: Resolved, workload: Workload) -> Check | None:
    """An image run's data: resident on the device beside the model, or streamed from the decoded
    cache by loader workers (then budgeted by the host-memory model, like the run does)."""
    if not isinstance(workload, DiffscaleRun) or workload.data_size is None:
        return None
    name, size = "data on the device", workload.data_size
    placed = data_placement(part, r, workload)
    if placed is None:
        what = "GPU" if r.use_gpus else "node"
        return Check(name, None, f"{size.describe()}; the profile does not say how much memory a '{part.name}' "
                                 f"{what} has: the job decides as it starts (data.resident auto)")
    if not placed.resident:
        return _streamed(name, placed, r)
    if not r.use_gpus:
        return Check(name, True, f"{size.describe()}: {placed.why}")
    cfg = workload.config
    model = estimates.gpu_memory_gb(cfg, part.gpu_type)
    need = model.value + size.nbytes / 1e9
    what = (f"{size.describe()}: {placed.why}; with the model (~{model.value:.1f} GB, {model.source}) "
            f"~{need:.1f} GB")
    gpu = part.gpu_memory_gb
    if gpu is None:
        return Check(name, None, f"{what}; the profile does not say how much memory a '{part.name}' GPU has")
    usable = data_check.GPU_SHARE * gpu
    if need <= usable:
        return Check(name, True, f"{what} of {gpu:g} GB per {part.gpu_type or 'GPU'}")
    fits = int((usable - model.value) * 1e9 // max(size.nbytes // max(size.items, 1), 1))
    stream = ("stream it from the decoded cache: --set data.resident=auto" if cfg.data.resident.value == "on"
              else "stream it from the decoded cache: --set data.resident=off")
    fewer = f", or train on fewer items (--set data.max_items={fits})" if fits >= 1 else ""
    return Check(name, False, f"{what} > {data_check.GPU_SHARE:.0%} of {gpu:g} GB per {part.gpu_type or 'GPU'}",
                 stream + fewer)


def _streamed(name: str, placed: data_check.DataPlacement, r: Resolved) -> Check:
    workers = f"{placed.workers} loader worker{'s' if placed.workers != 1 else ''} per rank"
    what = f"{placed.size.describe()}: {placed.why}; {workers} ({placed.workers_why}), counted in the host RAM row"
    if placed.workers < placed.wanted:
        flag = "--gpus-per-node" if r.use_gpus else "--procs-per-node"
        return Check(name, True, what, f"ask for more host memory (--mem), or fewer ranks per node ({flag}), for "
                                       f"{placed.wanted} workers", warn=True)
    if placed.workers == 0:
        return Check(name, True, what, "give each rank a CPU for a loader worker (--cpus-per-task 2 or more): without "
                                       "one the training process reads its own batches and waits for them", warn=True)
    return Check(name, True, what)
