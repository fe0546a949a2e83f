"""The ``cluster:`` section of a sweep: where its elements run as job arrays, each key parsed
and checked with one line naming it (``cluster.mem: 2G``, ``cluster.nodes: two``, an unquoted
``cluster.time: 1:30:00`` that YAML reads as a number). Every key is documented with an example
in docs/studies.md."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from diffscale.errors import UserError, closest

CLUSTER_KEYS = ("name", "partition", "nodes", "gpus_per_node", "procs_per_node", "time", "account", "qos",
                "parallel", "max_array", "setup", "python", "cpus_per_task", "mem", "force")
"""Every key is documented with an example in docs/studies.md."""
CLUSTER_INTS = ("nodes", "gpus_per_node", "procs_per_node", "cpus_per_task", "parallel", "max_array")
DEFAULT_PARALLEL = 0
"""0: no ``%P`` throttle (every element may run at once, as the scheduler allows)."""
MEM = re.compile(r"(?P<n>\d+(?:\.\d+)?)\s*(?P<unit>[KMGT]i?B?)?", re.I)
MEM_UNITS = {"K": 1 / 2**20, "M": 1 / 2**10, "G": 1, "T": 2**10}
"""``cluster.mem`` units as the schedulers read them (``2G``, ``2048M``): binary, in GiB; no unit is GiB."""
MAX_MEM_GB = 65536
"""More host memory (GiB) than any node has (as plan's --mem)."""


def _strings(where: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise UserError(f"{where} is not a list", f"write {where}: [A, B, ...]")
    return tuple(str(v) for v in value)


@dataclass(frozen=True, kw_only=True)
class ClusterSection:
    """Where the elements run as job arrays: a profile and the shape every element asks for."""

    name: str
    """A cluster profile (`diffscale cluster list`) or a profile YAML."""
    partition: str | None = None
    nodes: int = 1
    gpus_per_node: int | None = None
    procs_per_node: int | None = None
    """CPU processes per node instead of GPUs."""
    time: str | None = None
    """Wall time of each element's job (default: estimated, or the partition's limit)."""
    account: str | None = None
    qos: str | None = None
    cpus_per_task: int | None = None
    mem: float | None = None
    """Host memory per node in GiB (``mem: 64`` or ``mem: 64G``; default: estimated)."""
    parallel: int = DEFAULT_PARALLEL
    """At most this many elements of one array run at once (SLURM ``%P``, Grid Engine ``-tc``); 0: no limit."""
    max_array: int | None = None
    """Elements one array may hold (default: the profile's ``max_array_size``, else SLURM's 1001)."""
    setup: tuple[str, ...] = ()
    python: str | None = None
    force: tuple[str, ...] = ()
    """Preflight checks to go ahead despite (their names as plan prints them, e.g. 'host RAM per
    node'): kept in the sweep directory, so ``submit --failed`` honours them too."""

    def __post_init__(self) -> None:
        for flag, value in (("cluster.nodes", self.nodes), ("cluster.gpus_per_node", self.gpus_per_node),
                            ("cluster.procs_per_node", self.procs_per_node), ("cluster.max_array", self.max_array),
                            ("cluster.cpus_per_task", self.cpus_per_task)):
            if value is not None and value < 1:
                raise UserError(f"{flag} {value} is out of range (it must be 1 or more)", f"e.g. {flag}: 1")
        if self.parallel < 0:
            raise UserError(f"cluster.parallel {self.parallel} is negative",
                            "give how many elements may run at once (0: no limit)")


def whole_number(where: str, value: Any, example: str) -> int:
    """A YAML value that must be a whole number, or one line naming the key."""
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, str) and value.strip().isdigit():
            return int(value)
        raise UserError(f"{where} {value!r} is not a whole number", f"write e.g. {where}: {example}")
    return value


def memory_gib(value: Any) -> float:
    """``cluster.mem``: a number of GiB, or ``2G`` / ``2048M`` / ``1T`` as the schedulers write it."""
    if isinstance(value, bool):
        value = None
    if isinstance(value, (int, float)):
        gib = float(value)
    else:
        match = MEM.fullmatch(str(value).strip())
        if match is None:
            raise UserError(f"cluster.mem {value!r} is not an amount of memory",
                            "write GiB per node as a number or with a unit, e.g. cluster.mem: 64 or 64G or 2048M")
        gib = float(match.group("n")) * MEM_UNITS[(match.group("unit") or "G")[0].upper()]
    if not (0 < gib <= MAX_MEM_GB) or gib != gib:
        raise UserError(f"cluster.mem {value!r} is out of range: host memory per node is more than 0 and at most "
                        f"{MAX_MEM_GB} GiB", "write e.g. cluster.mem: 64G, or leave it out for the estimate")
    return gib


def _time(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        # YAML 1.1 reads an unquoted 1:30:00 as the number 5400 (base 60)
        raise UserError(f"cluster.time {value} is a number (YAML reads an unquoted H:MM:SS as seconds)",
                        "quote it: cluster.time: '01:30:00'")
    return str(value)


def parse_cluster(raw: Any) -> ClusterSection | None:
    """The ``cluster:`` section of a sweep file (a profile name alone, or a mapping of CLUSTER_KEYS)."""
    if raw is None:
        return None
    if isinstance(raw, str):
        raw = {"name": raw}
    if not isinstance(raw, dict) or "name" not in raw:
        raise UserError("cluster has no name", "write cluster: {name: PROFILE, partition: ..., gpus_per_node: ...}")
    for key in raw:
        if key not in CLUSTER_KEYS:
            raise UserError(f"cluster.{key} is not a sweep setting{closest(str(key), CLUSTER_KEYS)}",
                            f"use {', '.join('cluster.' + k for k in CLUSTER_KEYS)}")
    fields = {k: v for k, v in raw.items() if k not in ("setup", "force") and v is not None}
    for key in ("name", "partition", "account", "qos", "python"):
        if key in fields:
            fields[key] = str(fields[key])
    for key in CLUSTER_INTS:
        if key in fields:
            fields[key] = whole_number(f"cluster.{key}", fields[key], "2")
    if "time" in fields:
        fields["time"] = _time(fields["time"])
    if "mem" in fields:
        fields["mem"] = memory_gib(fields["mem"])
    force = raw.get("force") or []
    force = [force] if isinstance(force, str) else force
    return ClusterSection(**fields, setup=_strings("cluster.setup", raw.get("setup") or []),
                          force=_strings("cluster.force", force))
