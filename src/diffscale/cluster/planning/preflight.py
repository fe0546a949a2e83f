"""Preflight checks: pure functions of (profile, partition, resolved shape, workload).

Each returns a :class:`Check` -- pass, fail (with the fix) or unknown (the profile does
not know the fact; nothing is assumed). ``plan`` refuses a job with a failed check
unless ``--force``.
"""

from __future__ import annotations

import math
from pathlib import Path

from diffscale.cluster.planning import estimates
from diffscale.cluster.planning.check import Check, Resolved, mem_limit_gib
from diffscale.cluster.planning.data_checks import data_on_device, data_path, data_placement
from diffscale.cluster.planning.shape import Shape
from diffscale.cluster.planning.usage_checks import usage_gpu_memory, usage_host_memory
from diffscale.cluster.planning.workload import DiffscaleRun, UserCommand, Workload
from diffscale.cluster.profiles.types import ClusterProfile, Fact, Partition, SchedulerKind
from diffscale.cluster.scripts.timefmt import hms, human
from diffscale.runtime import resources


def _fact_value(fact: Fact, r: Resolved) -> str | None:
    if fact is Fact.TIME:
        return hms(r.time_s) if r.time_s is not None else None
    return (r.account if fact is Fact.ACCOUNT else r.qos) or None


def required_facts(profile: ClusterProfile, r: Resolved) -> Check | None:
    """The facts the profile marks required (an account where the site charges projects):
    the scheduler would refuse the job at submission without them."""
    if not profile.required:
        return None
    missing = [req for req in profile.required if _fact_value(req.fact, r) is None]
    if missing:
        flags = " and ".join(req.fact.flag for req in missing)
        fixes = "; ".join(f"pass {req.fact.flag} {req.fact.value.upper()}" + (f" ({req.how})" if req.how else "")
                          for req in missing)
        return Check("required by the site", False, f"{profile.title} refuses jobs without {flags}", fixes)
    return Check("required by the site", True,
                 ", ".join(f"{req.fact.flag} {_fact_value(req.fact, r)}" for req in profile.required))


def gpus_per_node(part: Partition, r: Resolved) -> Check:
    name = "GPUs per node"
    if not part.has_gpus:
        return Check(name, True,
                     f"partition '{part.name}' has no GPUs: {r.ranks_per_node} CPU processes per node (gloo)")
    if not r.use_gpus:
        return Check(name, True, f"{r.ranks_per_node} CPU processes per node (--procs-per-node: no GPUs asked)")
    if part.gpus_per_node is None:
        return Check(name, None,
                     f"{r.ranks_per_node} asked; the profile does not say how many GPUs a '{part.name}' node has")
    if r.ranks_per_node > part.gpus_per_node:
        return Check(name, False,
                     f"{r.ranks_per_node} GPUs per node asked, but '{part.name}' nodes have {part.gpus_per_node}",
                     f"use --gpus-per-node {part.gpus_per_node} (or fewer) and more --nodes")
    return Check(name, True, f"{r.ranks_per_node} of {part.gpus_per_node} GPUs per node ({part.gpu_type or 'GPU'})")


def cpus_per_node(part: Partition, r: Resolved) -> Check:
    name = "CPUs per node"
    asked = r.ranks_per_node * r.cpus_per_rank
    what = f"{r.ranks_per_node} tasks x {r.cpus_per_rank} CPUs = {asked}"
    if part.cpus_per_node is None:
        return Check(name, None, f"{what}; the profile does not say how many cores a '{part.name}' node has")
    if asked > part.cpus_per_node:
        fit = part.cpus_per_node // r.ranks_per_node
        if fit >= 1:
            fix = f"use --cpus-per-task {fit} ({part.cpus_per_node} cores / {r.ranks_per_node} tasks)"
        else:
            fix = f"use at most {part.cpus_per_node} tasks per node (--gpus-per-node) with --cpus-per-task 1"
        return Check(name, False, f"{what} > {part.cpus_per_node} cores per '{part.name}' node", fix)
    return Check(name, True, f"{what} of {part.cpus_per_node} cores")


def host_memory(part: Partition, r: Resolved, workload: Workload) -> Check:
    """Host RAM per node in GiB: the scheduler's unit (``--mem=NG``), the profile's and the model's."""
    name = "host RAM per node"
    if r.mem_asked and r.mem_per_node_gb is not None and part.mem_per_node_gb is not None \
            and r.mem_per_node_gb > part.mem_per_node_gb:
        return Check(name, False,
                     f"--mem {r.mem_per_node_gb:g} GiB > {part.mem_per_node_gb:g} GiB per '{part.name}' node",
                     f"ask at most --mem {int(part.mem_per_node_gb)}")
    if isinstance(workload, UserCommand) and workload.usage is not None:
        return usage_host_memory(part, r, workload.usage)
    if not isinstance(workload, DiffscaleRun):
        return Check(name, None, "a user command: its memory needs are not known to diffscale",
                     "measure them: diffscale probe --out RUN_DIR -- COMMAND (or state --mem-per-rank, "
                     "--workers-per-rank, --worker-mem)")
    placed = data_placement(part, r, workload)
    data_bytes = placed.host_data_bytes(workload.data_bytes) if placed else workload.data_bytes
    m = estimates.host_memory(r.ranks_per_node, data_bytes, placed.workers if placed else 0,
                              None if r.use_gpus else estimates.cpu_rank_bytes(workload.config))
    what = f"{m.describe()} (estimated)"
    limit = mem_limit_gib(part, r)
    if limit is None:
        return Check(name, None, f"{what}; the profile does not say how much memory a '{part.name}' node has")
    if m.node_bytes > limit * resources.GIB:
        return Check(name, False, f"{what} > {limit:g} GiB per node: the kernel would OOM-kill the job",
                     _host_memory_fix(part, r, m, limit))
    return Check(name, True, f"{what} of {limit:g} GiB")


def _host_memory_fix(part: Partition, r: Resolved, m: resources.HostMemory, limit_gib: float) -> str:
    """What lowers a node's need or raises its limit: fewer loader workers (a streamed run), fewer
    ranks per node, more memory, or a smaller data file (every rank reads one whole)."""
    fixes = []
    workers = m.workers_that_fit(limit_gib * resources.GIB)
    if m.workers and 1 <= workers < m.workers:  # data.workers 0 means "decide": fewer than one is no setting
        fixes.append(f"start fewer loader workers (--set data.workers={workers})")
    fit = m.ranks_that_fit(limit_gib * resources.GIB)
    flag = "--gpus-per-node" if r.use_gpus else "--procs-per-node"
    if fit >= 1:
        fixes.append(f"use at most {fit} ranks per node ({flag} {fit}) and more --nodes")
    if m.data_bytes:
        data = resources.gib(m.data_bytes)
        fixes.append(f"train on a smaller data file (every rank loads all of its ~{data:.1f} GiB)")
    asked = r.mem_per_node_gb if r.mem_asked else None
    if asked is not None and part.mem_per_node_gb and asked < part.mem_per_node_gb:
        fixes.append(f"ask for more memory (--mem up to {int(part.mem_per_node_gb)})")
    elif fit < 1:
        fixes.append("use a partition with more memory per node")
    return ", or ".join(fixes)


def wall_time(part: Partition, r: Resolved, workload: Workload, estimate_s: int | None, segments: int) -> Check:
    name = "wall time"
    limit = part.max_time_s
    if r.time_s is None:
        return Check(name, None, "no --time asked and no estimate: the scheduler's default limit applies",
                     "pass --time HH:MM:SS")
    if limit is not None and r.time_s > limit:
        if r.time_asked:
            fix = (f"ask --time {hms(limit)} or less; leave --time out and plan splits the run into resumable segments"
                   if workload.resumable
                   else f"ask --time {hms(limit)} or less and make the command resume from its checkpoints")
            return Check(name, False, f"--time {hms(r.time_s)} > the partition's maximum {hms(limit)}", fix)
    short = _shorter_than_a_checkpoint(r, workload, estimate_s)
    if short is not None:
        return short
    est = f"; training estimated at {human(estimate_s)}" if estimate_s else ""
    if segments > 1:
        most = hms(limit) if limit else "unlimited"
        return Check(name, True, f"{segments} segments of {hms(r.time_s)} (max {most}){est}")
    if limit is None:
        return Check(name, True, f"{hms(r.time_s)} (the profile documents no maximum){est}")
    return Check(name, True, f"{hms(r.time_s)} of at most {hms(limit)}{est}")


def _shorter_than_a_checkpoint(r: Resolved, workload: Workload, estimate_s: int | None) -> Check | None:
    """A diffscale run whose limit ends before start-up and one checkpoint interval: every job
    would be killed before it saves anything, so requeues and segments never advance."""
    if not isinstance(workload, DiffscaleRun) or estimate_s is None or r.time_s is None:
        return None
    need_s, step_s = estimates.first_checkpoint_s(workload.config, estimate_s)
    if r.time_s >= need_s:
        return None
    every = workload.config.train.checkpoint_every
    least = hms(int(math.ceil(need_s / 60)) * 60)
    fix = f"pass --time {least} or more"
    fit = int((r.time_s - estimates.STARTUP_S) / step_s) if step_s > 0 else 0
    if 1 <= fit < every:
        fix += f", or checkpoint more often (--set train.checkpoint_every={fit})"
    startup, steps = estimates.STARTUP_S, min(every, workload.config.train.steps)
    return Check("wall time", False,
                 f"--time {hms(r.time_s)} ends before the run's first checkpoint: start-up ~{human(startup)} + "
                 f"{steps} steps to a checkpoint ~{human(need_s - startup)} (estimated) = {human(need_s)}", fix)


def gpu_memory(part: Partition, r: Resolved, workload: Workload) -> Check:
    name = "GPU memory"
    if not r.use_gpus:
        return Check(name, True, "CPU ranks: no GPU memory to check")
    if isinstance(workload, UserCommand) and workload.usage is not None:
        return usage_gpu_memory(part, r, workload.usage)
    if not isinstance(workload, DiffscaleRun):
        return Check(name, None, "a user command: its GPU memory needs are not known to diffscale")
    cfg = workload.config
    est = estimates.gpu_memory_gb(cfg, part.gpu_type)
    what = (f"preset {cfg.preset}, batch {cfg.train.batch_per_gpu} per GPU: ~{est.value:.1f} GB ({est.source})")
    if part.gpu_memory_gb is None:
        return Check(name, None, f"{what}; the profile does not say how much memory a '{part.name}' GPU has")
    if est.value > 0.9 * part.gpu_memory_gb:
        fit = estimates.max_batch_for_gpu(cfg, part.gpu_type, part.gpu_memory_gb)
        if fit >= 1:
            accum = math.ceil(cfg.train.batch_per_gpu * cfg.train.grad_accum / fit)
            fix = (f"lower train.batch_per_gpu to {fit} and raise train.grad_accum to {accum} "
                   f"(--set train.batch_per_gpu={fit} --set train.grad_accum={accum}) to keep the effective batch")
        else:
            fix = "use a smaller preset or a partition with larger GPUs"
        return Check(name, False, f"{what} > 90 % of {part.gpu_memory_gb:g} GB per {part.gpu_type or 'GPU'}", fix)
    return Check(name, True, f"{what} of {part.gpu_memory_gb:g} GB")


def global_batch(r: Resolved, workload: Workload) -> Check:
    name = "global batch"
    world = r.nodes * r.ranks_per_node
    if not isinstance(workload, DiffscaleRun):
        if r.global_batch is not None and r.global_batch % world:
            return Check(name, False, f"global batch {r.global_batch} is not divisible by {world} ranks",
                         f"use a multiple of {world} (e.g. {_near_multiple(r.global_batch, world)})")
        return Check(name, None, "a user command sets its own batch")
    t = workload.config.train
    effective = t.batch_per_gpu * world * t.grad_accum
    if r.global_batch is not None:
        step = world * t.grad_accum
        if r.global_batch % step:
            return Check(name, False,
                         f"global batch {r.global_batch} is not divisible by {world} ranks x {t.grad_accum} "
                         "accumulation steps",
                         f"use a multiple of {step} (e.g. {_near_multiple(r.global_batch, step)}) or change the shape")
    return Check(name, True, f"{t.batch_per_gpu} per GPU x {world} ranks x {t.grad_accum} accumulation = {effective}")


def _near_multiple(value: int, step: int) -> str:
    lo = value // step * step
    hi = lo + step
    return f"{lo} or {hi}" if lo > 0 else str(hi)


def nodes_limit(part: Partition, r: Resolved) -> Check:
    """More nodes than the partition gives a job fail; where the profile does not say (max_nodes
    null), one node passes and more are unknown: the scheduler may refuse them at submission."""
    name = "nodes"
    if part.max_nodes is not None and r.nodes > part.max_nodes:
        return Check(name, False, f"{r.nodes} nodes > the partition's maximum {part.max_nodes}",
                     f"use --nodes {part.max_nodes} or fewer")
    if part.max_nodes is None and r.nodes > 1:
        return Check(name, None, f"{r.nodes} nodes asked; the profile does not say how many '{part.name}' has "
                                 "(max_nodes: null)", "set the partition's max_nodes in the profile")
    return Check(name, True, f"{r.nodes} node(s)" + (f" of at most {part.max_nodes}" if part.max_nodes else ""))


def multi_host(profile: ClusterProfile, r: Resolved) -> Check | None:
    """Grid Engine: several hosts need a PE that spans hosts (control_slaves for qrsh -inherit)."""
    if profile.scheduler is not SchedulerKind.SGE or profile.sge is None:
        return None
    name = "parallel environment"
    if r.nodes > 1:
        if not profile.sge.pe_multi_host:
            return Check(name, False, f"{r.nodes} hosts asked, but the profile names no multi-host PE",
                         "use --nodes 1, or set sge.pe_multi_host to a PE with control_slaves TRUE")
        return Check(name, True, f"{profile.sge.pe_multi_host} across {r.nodes} hosts (qrsh -inherit)")
    pe = profile.sge.pe_single_host or profile.sge.pe_multi_host
    return Check(name, True, f"{pe} on one host")


def run_directory(profile: ClusterProfile, workload: Workload) -> Check | None:
    """Grid Engine expands $HOME-style pseudo variables in a job's working directory and
    cannot enter one with a newline (measured on SoGE 8.1.9: failed 28, "changing into
    working directory"). Spaces and quotes are fine; SLURM takes any path."""
    if profile.scheduler is not SchedulerKind.SGE:
        return None
    bad = [name for ch, name in (("$", "'$'"), ("\n", "a newline")) if ch in workload.run_dir]
    if bad:
        return Check("run directory", False,
                     f"Grid Engine cannot run a job in a directory whose path contains {' or '.join(bad)}",
                     "choose a --out path without '$' and newlines")
    return Check("run directory", True, "a path Grid Engine can enter")


def task_executable(profile: ClusterProfile, workload: Workload) -> Check | None:
    """SLURM 22.05 never delivers step signals (srun forwarding or scancel --signal) to a
    task whose executable path contains a space (measured: the warning is lost, so the
    run cannot checkpoint before the limit). Arguments with spaces are fine."""
    if profile.scheduler is not SchedulerKind.SLURM:
        return None
    exe = workload.argv()[0]
    if any(ch.isspace() for ch in exe):
        return Check("task executable", False,
                     f"SLURM does not deliver signals to a task whose executable path has a space: {exe!r}",
                     "use an interpreter/command path without spaces (--python, or a symlink to it)")
    return None


def command_paths(workload: Workload) -> Check | None:
    """A user command's relative paths that exist here but not in the run directory, where the
    job runs it (``cd "$RUN_DIR"``): ``python train.py`` would find no train.py there."""
    if not isinstance(workload, UserCommand):
        return None
    run_dir = Path(workload.run_dir)
    lost = []
    for arg in workload.argv():
        path = arg.partition("=")[2] if arg.startswith("-") else arg  # --config=conf.yaml too
        if not path or "$" in path or Path(path).expanduser().is_absolute():
            continue
        if Path(path).exists() and not (run_dir / path).exists():
            lost.append(path)
    if not lost:
        return None
    return Check("command paths", False,
                 f"the job runs the command in its run directory {run_dir}, where {', '.join(map(repr, lost))} "
                 f"(relative, found here in {Path.cwd()}) does not exist",
                 f"give absolute paths, e.g. {Path(lost[0]).absolute()}")


def shape_checks(part: Partition, shape: Shape) -> list[Check]:
    """The checks of a shape against the nodes the profile knows (GPUs and cores per node, nodes
    per partition): cheap, so plan makes them before it lays out a single rank."""
    r = Resolved(nodes=shape.nodes, ranks_per_node=shape.ranks_per_node, use_gpus=part.has_gpus and shape.use_gpus,
                 cpus_per_rank=shape.cpus_per_rank or 1, cpus_per_rank_asked=shape.cpus_per_rank is not None,
                 mem_per_node_gb=None, mem_asked=False, time_s=None, time_asked=False)
    return [gpus_per_node(part, r), cpus_per_node(part, r), nodes_limit(part, r)]


def run_all(profile: ClusterProfile, part: Partition, r: Resolved, workload: Workload,
            estimate_s: int | None, segments: int) -> list[Check]:
    checks = [c for c in (required_facts(profile, r),) if c is not None]
    checks += [
        gpus_per_node(part, r),
        cpus_per_node(part, r),
        host_memory(part, r, workload),
        wall_time(part, r, workload, estimate_s, segments),
        gpu_memory(part, r, workload),
        global_batch(r, workload),
        nodes_limit(part, r),
    ]
    for extra in (multi_host(profile, r), data_path(workload), data_on_device(part, r, workload),
                  command_paths(workload), run_directory(profile, workload), task_executable(profile, workload)):
        if extra is not None:
            checks.append(extra)
    return checks


# Checks of a user's command from what one rank uses (a probe or the user's statement).
# Preflight checks of a user's command from what one rank uses (a probe or the user's statement).
#
# "4 ranks x (1 rank ~5.1 GiB + 8 loader workers x ~7.3 GiB) = 254 GiB of 256 GiB per node -> FAIL":
# the node's need comes from the one host-memory model (runtime/resources.py), and it must stay
# within MEASURED_SHARE of the node (or of --mem).

