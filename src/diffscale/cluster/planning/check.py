"""What a preflight check answers (:class:`Check`) and the job it inspects (:class:`Resolved`):
the types every check module of planning shares."""

from __future__ import annotations

from dataclasses import dataclass

from diffscale.cluster.profiles.types import Partition


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool | None
    """True: passes; False: fails (the scheduler would refuse it, or it would break at run
    time); None: unknown -- the profile does not document the fact needed."""
    detail: str
    fix: str = ""
    warn: bool = False
    """With ``ok`` True: the job runs, but not as well as it could (the fix says how)."""

    @property
    def status(self) -> str:
        if self.ok and self.warn:
            return "WARN"
        return {True: "pass", False: "FAIL", None: "unknown"}[self.ok]


@dataclass(frozen=True)
class Resolved:
    """The job as plan resolved it (defaults filled in), which the checks inspect."""

    nodes: int
    ranks_per_node: int
    use_gpus: bool
    """False: CPU ranks (a CPU partition, or --procs-per-node)."""
    cpus_per_rank: int
    cpus_per_rank_asked: bool
    """True when the user chose --cpus-per-task (the fix then names that flag)."""
    mem_per_node_gb: int | None
    mem_asked: bool
    """True when the user chose --mem (then it is the limit; a derived value is not)."""
    time_s: int | None
    time_asked: bool
    global_batch: int | None = None
    """Requested global batch (--global-batch), checked for divisibility."""
    account: str | None = None
    """Account / project the job is charged to (--account or the profile's)."""
    qos: str | None = None


def mem_limit_gib(part: Partition, r: Resolved) -> float | None:
    """Host memory per node the job may use, in GiB: the node's, or less where --mem asks less."""
    limit = part.mem_per_node_gb
    if r.mem_asked and r.mem_per_node_gb is not None:
        limit = min(limit, r.mem_per_node_gb) if limit is not None else r.mem_per_node_gb
    return limit
