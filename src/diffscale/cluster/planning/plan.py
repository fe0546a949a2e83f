"""plan(): from (profile, shape, workload) to everything a job needs -- pure, no I/O.

It resolves the defaults (cores per rank, memory, wall time), estimates the training
time, splits a run longer than the partition's limit into resumable segments, lays out
every rank, runs the preflight checks and builds the JobSpec the script renderers take.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from diffscale.cluster.planning import data_checks, estimates, kernel_start, preflight
from diffscale.cluster.planning.check import Check, Resolved
from diffscale.cluster.planning.shape import Shape
from diffscale.cluster.planning.workload import DiffscaleRun, UserCommand, Workload
from diffscale.cluster.profiles.types import ClusterProfile, Partition, SchedulerKind
from diffscale.cluster.scripts.jobspec import Continuation, JobSpec, RaceSpec, job_name
from diffscale.cluster.scripts.launcher import Launcher
from diffscale.cluster.scripts.timefmt import human
from diffscale.cluster.scripts.values import check_spec

SEGMENT_MARGIN_S = 600
"""Time kept free in every segment besides start-up: checkpoint, final sampling, slack."""
DEFAULT_SIGNAL_LEAD_S = 120
DEFAULT_CPUS_PER_RANK_CAP = 8
SHOWN_RANKS = 64
"""Rank rows a plan prints; a larger job shows its first and last node's."""


@dataclass(frozen=True)
class PlanOptions:
    account: str | None = None
    qos: str | None = None
    job_name: str | None = None
    max_restarts: int = 20
    signal_lead_s: int | None = None
    signal: str | None = "auto"
    """Warning signal before the time limit: ``auto`` is USR2 for a diffscale run (which
    checkpoints on it) and none for a user command; None turns it off."""
    global_batch: int | None = None
    race: RaceSpec | None = None
    chain: bool = True
    """Split a run longer than the partition's limit into a chain of segment jobs (else
    one job that requeues itself at each limit)."""
    setup: tuple[str, ...] = ()
    """Shell lines the job runs before the command, after the profile's ``setup`` (``module
    load``, ``conda activate``: one user's environment on a shared profile)."""
    python_asked: bool = False
    """True when the user chose the interpreter (--python): the job runs it, whatever ``python``
    the set-up lines put on PATH."""
    end_marker_dir: str | None = None
    """A coupled simulation's spool: its script marks the spool ended when the command ends."""
    role: str = ""
    """What this job is in a layout of several (``simulation``, ``trainer``): it names the job,
    its script and its title line. Empty: the run's only job (or one shape of a race)."""


@dataclass(frozen=True)
class RankRow:
    rank: int
    node: int
    host: str
    local_rank: int
    device: str
    started_by: str
    master: str


@dataclass(frozen=True)
class Segment:
    index: int
    time_s: int
    steps: str
    """Approximate step range this segment is expected to cover."""


@dataclass(frozen=True)
class Plan:
    profile: ClusterProfile
    partition: Partition
    shape: Shape
    workload: Workload
    spec: JobSpec
    checks: tuple[Check, ...]
    segments: tuple[Segment, ...]
    estimate_s: int | None
    notes: tuple[str, ...] = field(default=())
    role: str = ""
    """``PlanOptions.role``: this job's part in a layout of several."""
    time_source: str = ""
    """Where a time limit neither asked (--time) nor estimated came from (a coupled trainer's:
    the simulation's wall time), for the plan's time-limit line; empty otherwise."""

    @property
    def label(self) -> str:
        """``simulation 2x128`` for a job with a role, else the shape (``1x4``)."""
        return f"{self.role} {self.shape.label}" if self.role else self.shape.label

    @property
    def ranks(self) -> tuple[RankRow, ...]:
        """Every rank: where it runs and how it finds the others."""
        return tuple(rank_rows(self.spec, range(self.spec.world_size)))

    def shown_ranks(self, most: int = SHOWN_RANKS) -> list[RankRow | None]:
        """The ranks a plan prints: all of them up to ``most``, else the first node's and the
        last node's with None (an ellipsis) between, so a large job prints in no time."""
        spec = self.spec
        if spec.world_size <= most:
            return list(rank_rows(spec, range(spec.world_size)))
        g = spec.ranks_per_node
        head = range(min(g, most // 2))
        tail = range(max(spec.world_size - min(g, most // 2), len(head)), spec.world_size)
        return [*rank_rows(spec, head), None, *rank_rows(spec, tail)]

    @property
    def job_count(self) -> int:
        """The jobs ``submit`` sends for this plan: one per segment of a chain, else one (which
        requeues itself at each limit where the run is longer than one job may be)."""
        return max(len(self.segments), 1) if self.spec.continuation is Continuation.CHAIN else 1

    @property
    def ok(self) -> bool:
        return all(c.ok is not False for c in self.checks)

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.ok is False]

    def script(self) -> str:
        from diffscale.cluster.scripts import sge, slurm

        return (slurm if self.spec.scheduler is SchedulerKind.SLURM else sge).render(self.spec)


def _round_up(seconds: float, step: int = 900) -> int:
    return int(math.ceil(seconds / step) * step)


def _default_cpus(part: Partition, ranks_per_node: int) -> int:
    if part.cpus_per_node:
        return max(1, min(part.cpus_per_node // ranks_per_node, DEFAULT_CPUS_PER_RANK_CAP))
    return 4 if part.has_gpus else 1


def _printable(text: str) -> str:
    # The title lands in a comment line of the script: no control characters (a newline
    # would end the comment and turn the rest into commands).
    return re.sub(r"[\x00-\x1f\x7f]", "?", text)


def _title(profile: ClusterProfile, part: Partition, shape: Shape, workload: Workload, role: str,
           gpu_ranks: bool) -> str:
    """The job's one-line description: the script's title comment."""
    g = shape.ranks_per_node
    return _printable(
        f"{role + ' job on ' if role else ''}{profile.name} / {part.name}: "
        f"{shape.nodes} node(s) x {g} {'GPU' if gpu_ranks else 'CPU process'}"
        f"{('s' if gpu_ranks else 'es') if g > 1 else ''} per node = {shape.world_size} ranks; {workload.title}")


def job_python(workload: Workload, setup: tuple[str, ...], asked: bool) -> str | None:
    """The note of a job whose script picks its interpreter after the set-up lines, or None where
    the plan's interpreter is the job's (--python chose it, or no set-up line runs). A set-up line
    may put another environment's ``python`` on PATH -- conda activate, a venv, a module, ``.
    useenv.sh``, ``export PATH=...`` -- whose packages the job needs; no word in the line tells
    that reliably, so the script asks the shell which ``python`` it finds before and after them."""
    if asked or not setup or workload.python == "python":
        return None
    return (f"the job runs the `python` its set-up lines put on PATH, if they change which `python` the shell finds "
            f"(conda activate, a venv, a module, export PATH=...), else this host's {workload.python}; the job "
            "checks that itself and its log names the interpreter it runs ('diffscale: python ...'); pass "
            "--python PATH to choose one")


def make_plan(profile: ClusterProfile, shape: Shape, workload: Workload, options: PlanOptions = PlanOptions()) -> Plan:
    part = profile.partition(shape.partition)
    g = shape.ranks_per_node
    gpu_ranks = part.has_gpus and shape.use_gpus
    cpus = shape.cpus_per_rank or _default_cpus(part, g)
    python_note = job_python(workload, profile.setup + options.setup, options.python_asked)
    notes: list[str] = list(workload.notes) + ([python_note] if python_note else [])
    estimate_s, mem_gb = _estimate(part, shape, workload, cpus, gpu_ranks, notes)
    time_s, lead, segments = _wall_time(part, shape, workload, options, estimate_s, notes)
    n_segments = max(1, len(segments))

    resolved = Resolved(nodes=shape.nodes, ranks_per_node=g, use_gpus=gpu_ranks, cpus_per_rank=cpus,
                        cpus_per_rank_asked=shape.cpus_per_rank is not None, mem_per_node_gb=mem_gb,
                        mem_asked=shape.mem_per_node_gb is not None,
                        time_s=time_s, time_asked=shape.time_s is not None, global_batch=options.global_batch,
                        account=options.account or profile.account, qos=options.qos or part.qos)
    checks = preflight.run_all(profile, part, resolved, workload, estimate_s, n_segments)
    signal = options.signal
    if signal == "auto":
        signal = "USR2" if isinstance(workload, DiffscaleRun) else None
    spec = JobSpec(
        scheduler=profile.scheduler,
        job_name=options.job_name or job_name(workload.run_dir,
                                              options.role or (options.race.key if options.race else "")),
        run_dir=workload.run_dir,
        nodes=shape.nodes,
        ranks_per_node=g,
        gpus_per_node=g if part.has_gpus and shape.use_gpus else 0,
        cpus_per_rank=cpus,
        mem_per_node_gb=mem_gb,
        time_s=time_s,
        partition=part.submit_name,
        account=options.account or profile.account,
        qos=options.qos or part.qos,
        constraint=part.constraint,
        gpu_request=part.gpu_request,
        gres_type=part.gres_type,
        resources=part.resources,
        setup=profile.setup + options.setup,
        env=profile.env,
        command_env=workload.job_env,
        argv=workload.argv(),
        torchrun_args=workload.torchrun_args(),
        python=workload.python,
        python_from_setup=python_note is not None,
        continuation=_continuation(workload, n_segments, options),
        script_file=script_file(profile.scheduler, f"{options.role + '-' if options.role else ''}{shape.label}"),
        max_restarts=options.max_restarts,
        signal=signal,
        signal_lead_s=lead,
        race=options.race,
        sge=profile.sge,
        title=_title(profile, part, shape, workload, options.role, gpu_ranks),
        launcher=workload.launcher if isinstance(workload, UserCommand) else Launcher.PLAIN,
        end_marker_dir=options.end_marker_dir,
    )
    check_spec(spec)
    return Plan(profile=profile, partition=part, shape=shape.with_time(time_s), workload=workload, spec=spec,
                checks=tuple(checks), segments=tuple(segments),
                estimate_s=estimate_s, notes=tuple(notes), role=options.role)


def script_file(scheduler: SchedulerKind, label: str) -> str:
    """The script's file name in the run directory: ``job-<label>.slurm.sh`` / ``.sge.sh``."""
    return f"job-{label}.{'slurm' if scheduler is SchedulerKind.SLURM else 'sge'}.sh"


def with_race(plan: Plan, race: RaceSpec) -> Plan:
    """The same job as one candidate of a race across partitions: named, scripted and claiming
    the run by the race's key (shapes alone may repeat across partitions)."""
    spec = replace(plan.spec, job_name=job_name(plan.workload.run_dir, race.key), race=race,
                   script_file=script_file(plan.spec.scheduler, race.key))
    return replace(plan, spec=spec)


def _continuation(workload: Workload, n_segments: int, options: PlanOptions) -> Continuation:
    """How a job that meets its wall time goes on: not at all, a chain of segments, or a requeue."""
    if not workload.resumable:
        return Continuation.NONE
    if n_segments > 1 and options.chain:
        return Continuation.CHAIN
    return Continuation.REQUEUE


def _estimate(part: Partition, shape: Shape, workload: Workload, cpus: int, gpu_ranks: bool,
              notes: list[str]) -> tuple[int | None, int | None]:
    """Training-time estimate (diffscale runs only) and host memory per node to ask for (GiB)."""
    estimate_s: int | None = None
    mem = shape.mem_per_node_gb
    if isinstance(workload, UserCommand) and workload.usage is not None and mem is None:
        from diffscale.cluster.planning.usage_checks import request_gib

        asked = request_gib(workload.usage, shape.ranks_per_node, part.mem_per_node_gb)
        if asked is not None:
            mem = asked[0]
            notes.append(asked[1])
    if isinstance(workload, DiffscaleRun):
        cfg = workload.config
        rate = estimates.samples_per_s_per_rank(cfg, part.gpu_type, cpus, gpu_ranks)
        estimate_s = estimates.train_seconds(cfg, shape.world_size, rate.value)
        notes.append(f"training time {rate.source}: ~{rate.value:,.0f} samples/s per rank, "
                     f"{cfg.train.steps} steps -> ~{human(estimate_s)}")
        start = kernel_start.start_note(workload, part.gpu_type, shape.world_size) if gpu_ranks else None
        notes += [start] if start else []
        if mem is None:
            data_bytes, workers = _data_in_host_memory(part, shape, workload, cpus, gpu_ranks)
            request = estimates.host_memory_request(shape.ranks_per_node, data_bytes, part.mem_per_node_gb, workers,
                                                    None if gpu_ranks else estimates.cpu_rank_bytes(cfg))
            mem = request.gib
            notes.append(request.note)
    return estimate_s, (int(math.ceil(mem)) if mem is not None else None)


def _data_in_host_memory(part: Partition, shape: Shape, workload: DiffscaleRun, cpus: int,
                         gpu_ranks: bool) -> tuple[int, int]:
    """(data bytes a rank holds in host memory, loader workers per rank) as the data check places the data."""
    r = Resolved(nodes=shape.nodes, ranks_per_node=shape.ranks_per_node, use_gpus=gpu_ranks, cpus_per_rank=cpus,
                 cpus_per_rank_asked=shape.cpus_per_rank is not None, mem_per_node_gb=None, mem_asked=False,
                 time_s=None, time_asked=False)
    placed = data_checks.data_placement(part, r, workload)
    if placed is None:
        return workload.data_bytes, 0
    return placed.host_data_bytes(workload.data_bytes), placed.workers


def _wall_time(part: Partition, shape: Shape, workload: Workload, options: PlanOptions, estimate_s: int | None,
               notes: list[str]) -> tuple[int | None, int, list[Segment]]:
    """Wall time per job, the checkpoint signal's lead, and the segments of a run longer than one job."""
    limit = part.max_time_s
    time_s = shape.time_s
    if time_s is None:
        if estimate_s is not None:
            want = _round_up(estimate_s * 1.2 + SEGMENT_MARGIN_S)
            time_s = min(want, limit) if limit is not None else want
        else:
            time_s = limit
    lead = options.signal_lead_s
    if lead is None:
        lead = DEFAULT_SIGNAL_LEAD_S if time_s is None else max(10, min(DEFAULT_SIGNAL_LEAD_S, time_s // 4))
    n_segments = 1
    if estimate_s is not None and time_s is not None and workload.resumable:
        usable = time_s - estimates.STARTUP_S - lead - (SEGMENT_MARGIN_S if time_s > 4 * SEGMENT_MARGIN_S else 0)
        need = (estimate_s - estimates.STARTUP_S) * 1.1
        if usable > 0 and need > usable:
            n_segments = math.ceil(need / usable)
    segments: list[Segment] = []
    if n_segments > 1 and isinstance(workload, DiffscaleRun):
        steps = workload.config.train.steps
        for k in range(n_segments):
            segments.append(Segment(k + 1, time_s or 0, f"~{steps * k // n_segments}..{steps * (k + 1) // n_segments}"))
        how = "a chain of dependent jobs" if options.chain else "one job requeued at each limit"
        notes.append(f"the run is longer than one job may be: {n_segments} segments of {time_s} s, {how}; "
                     "each resumes from the newest checkpoint (estimated)")
    return time_s, lead, segments


def rank_rows(spec: JobSpec, ranks: Iterable[int]) -> list[RankRow]:
    """Where each of ``ranks`` runs and how it finds the others."""
    rows = []
    g = spec.ranks_per_node
    for rank in ranks:
        node, local = divmod(rank, g)
        device = f"cuda:{local}" if spec.gpus_per_node else "cpu"
        if spec.scheduler is SchedulerKind.SLURM:
            host = f"node {node} of SLURM_JOB_NODELIST"
            started = f"srun task (SLURM_PROCID={rank}, SLURM_LOCALID={local}, SLURM_NODEID={node})"
            master = ("Lightning's SLURMEnvironment: first host of SLURM_NODELIST, port from SLURM_JOB_ID"
                      if spec.launcher is Launcher.LIGHTNING else
                      "first host of SLURM_JOB_NODELIST : 20000 + SLURM_JOB_ID % 20000 (script exports)")
        elif spec.nodes == 1:
            host = "the job's host"
            started = f"torchrun --standalone (RANK={rank}, LOCAL_RANK={local})"
            master = "localhost : free port picked by torchrun --standalone"
        else:
            host = f"host {node} of PE_HOSTFILE"
            via = "local torchrun" if node == 0 else "torchrun via qrsh -inherit"
            started = f"{via} --node_rank={node} (RANK={rank}, LOCAL_RANK={local})"
            master = "first host of PE_HOSTFILE : 20000 + JOB_ID % 20000"
        rows.append(RankRow(rank, node, host, local, device, started, master))
    return rows
