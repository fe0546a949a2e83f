"""Cluster profiles: what a cluster offers, as typed frozen dataclasses (read from and
written to YAML by ``profile_io``).

A profile holds only facts a site documents (or that ``cluster discover`` read from the
live scheduler). A fact nobody documented is ``null`` in the YAML and ``None`` here; the
preflight checks then report "unknown" instead of trusting an invented number.

The schema is documented field by field in docs/clusters.md.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from diffscale.errors import UserError, closest


class SchedulerKind(str, enum.Enum):
    SLURM = "slurm"
    SGE = "sge"


class GpuRequest(str, enum.Enum):
    """How a SLURM job asks for GPUs (sites differ; some only accept --gres)."""

    GPUS_PER_NODE = "gpus-per-node"
    """``--gpus-per-node=[type:]G``"""
    GRES = "gres"
    """``--gres=gpu[:type]:G``"""


class GpuScope(str, enum.Enum):
    """What the number in a Grid Engine ``-l gpus=N`` request counts.

    A consumable complex is charged per slot (``consumable YES``), once per job
    (``consumable JOB``) or, by site convention, per host.
    """

    SLOT = "slot"
    JOB = "job"
    HOST = "host"


class Fact(str, enum.Enum):
    """A value a site requires on every job, which the user (not the profile) supplies."""

    ACCOUNT = "account"
    """SLURM --account / Grid Engine -P project."""
    QOS = "qos"
    TIME = "time"
    """An explicit wall time (--time / -l h_rt)."""

    @property
    def flag(self) -> str:
        return f"--{self.value}"


@dataclass(frozen=True)
class Requirement:
    """A fact the site requires, and how a user finds the value to pass."""

    fact: Fact
    how: str | None = None
    """E.g. "`slist` lists the accounts you may use"; None: the site does not say."""


# Scheduler-facing names are written into #SBATCH / #$ lines unquoted (those lines are
# parsed by sbatch/qsub, not by a shell), so they are held to a safe alphabet.
SAFE_NAME = re.compile(r"^[A-Za-z0-9_.+:=/@,-]+$")


@dataclass(frozen=True)
class Partition:
    """One SLURM partition or one Grid Engine GPU class/queue of a cluster."""

    name: str
    """diffscale's name for it (``--partition NAME``)."""
    submit_name: str | None
    """Name passed to the scheduler (``--partition`` / ``-q``); None: let the scheduler route."""
    gpus_per_node: int | None
    """GPUs per node; 0 for a CPU-only partition (processes per node are then just ranks)."""
    gpu_type: str | None = None
    gpu_memory_gb: float | None = None
    cpus_per_node: int | None = None
    mem_per_node_gb: float | None = None
    max_time_s: int | None = None
    """Longest wall time a job may ask for; None: unknown or unlimited."""
    max_nodes: int | None = None
    interconnect: str | None = None
    gpu_request: GpuRequest = GpuRequest.GPUS_PER_NODE
    gres_type: str | None = None
    """SLURM GPU type name for typed requests (``--gpus-per-node=a100:4``)."""
    qos: str | None = None
    constraint: str | None = None
    resources: tuple[tuple[str, str], ...] = ()
    """Grid Engine: extra ``-l name=value`` requests (``gpu_c=7.0``, ``gpu_type=A100``)."""
    note: str | None = None
    default_time: str | None = None
    """The wall time a job gets when it asks for none, as the scheduler states it (SLURM's
    DefaultTime, or its MaxTime where DefaultTime is NONE; Grid Engine's queue h_rt): e.g.
    ``04:00:00`` or ``UNLIMITED``. None: unknown (``cluster discover`` records it)."""
    charge_per_gpu_hour: float | None = None
    """What the site charges for one GPU-hour here (service units, core-hours, ...); None: not stated."""

    @property
    def has_gpus(self) -> bool:
        return bool(self.gpu_type) or bool(self.gpus_per_node)

    def selectors(self, scheduler: SchedulerKind) -> tuple[str, ...]:
        """What in a job script picks this partition (and its GPU class) from the others:
        the partition / queue name, a node feature, a typed GPU request, resource requests."""
        if scheduler is SchedulerKind.SGE:
            queue = (f"-q {self.submit_name}",) if self.submit_name else ()
            return queue + tuple(f"-l {name}={value}" for name, value in self.resources)
        found = []
        if self.submit_name:
            found.append(f"--partition={self.submit_name}")
        if self.constraint:
            found.append(f"--constraint={self.constraint}")
        if self.gres_type:
            found.append(f"GPU type {self.gres_type}")
        return tuple(found)


@dataclass(frozen=True)
class SgeSettings:
    """Grid Engine specifics: parallel environments and how GPUs are requested."""

    pe_single_host: str | None
    """PE with allocation ``$pe_slots`` (all slots on one host), e.g. BU's ``omp``."""
    pe_multi_host: str | None = None
    """PE spanning hosts (``$fill_up``/``$round_robin``, control_slaves TRUE) for qrsh -inherit."""
    gpu_resource: str = "gpus"
    gpu_scope: GpuScope = GpuScope.JOB
    notify_s: int | None = None
    """Queue ``notify`` time: how long before the kill ``-notify`` sends SIGUSR2 (None: unknown)."""
    export_env: bool = False
    """Pass ``-V`` (export the submitting shell's environment)."""


@dataclass(frozen=True)
class ClusterProfile:
    name: str
    scheduler: SchedulerKind
    partitions: tuple[Partition, ...]
    title: str = ""
    docs: tuple[str, ...] = ()
    account: str | None = None
    """SLURM --account / Grid Engine -P project; usually the user's, so None in bundled profiles."""
    default_partition: str | None = None
    setup: tuple[str, ...] = ()
    """Shell lines run at the top of every job (``module load ...``, ``conda activate ...``)."""
    env: tuple[tuple[str, str], ...] = ()
    """Variables exported in every job (NCCL settings)."""
    sets_cuda_visible_devices: bool | None = None
    """True where the scheduler sets CUDA_VISIBLE_DEVICES (scripts then never touch it)."""
    sge: SgeSettings | None = None
    required: tuple[Requirement, ...] = ()
    """Facts every job must carry (e.g. an account on sites that charge projects); preflight
    fails with the fix when one is missing."""
    max_array_size: int | None = None
    """Elements one array job may hold (SLURM MaxArraySize, Grid Engine max_aj_tasks); None: the
    scheduler's default (1001, 75000)."""
    source: str = ""
    """Where this profile was read from (for messages)."""

    def partition(self, name: str | None) -> Partition:
        """The named partition, or the default one."""
        names = [p.name for p in self.partitions]
        if name is None:
            name = self.default_partition or (names[0] if len(names) == 1 else None)
            if name is None:
                raise UserError(
                    f"cluster '{self.name}' has several partitions and no default_partition",
                    f"pass --partition with one of: {', '.join(names)}",
                )
        for part in self.partitions:
            if part.name == name:
                return part
        raise UserError(
            f"cluster '{self.name}' has no partition '{name}'{closest(name, names)}",
            f"use one of: {', '.join(names)} (see `diffscale cluster show {self.name}`)",
        )
