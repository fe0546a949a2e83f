"""The shape of a job: nodes x ranks per node, and what each rank gets."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from diffscale.errors import UserError

MAX_NODES = 4096
"""More nodes than a partition of any cluster diffscale plans for holds: a larger count is a typo,
and laying out its ranks would take minutes."""
MAX_GPUS_PER_NODE = 64
"""More GPUs than any node holds (8 is common, 16 the most sold)."""
MAX_PROCS_PER_NODE = 1024
"""More CPU ranks than any node has cores."""


def at_least(value: int | float | None, least: int | float, flag: str, what: str) -> None:
    if value is not None and value < least:
        raise UserError(f"{flag} {value:g} is out of range: {what}", f"pass {flag} {least:g} or more")


def at_most(value: int | float | None, most: int | float, flag: str, what: str) -> None:
    if value is not None and value > most:
        shown = value if isinstance(value, int) else f"{value:g}"  # a 20-digit count as typed, not 1e+20
        raise UserError(f"{flag} {shown} is out of range: {what} (at most {most:g})",
                        f"pass {flag} {most:g} or less")


def check_job_size(nodes: int | None, per_node: int | None, *, gpus: bool, nodes_flag: str = "--nodes",
                   per_node_flag: str | None = None) -> None:
    """Nodes and ranks per node within what any cluster has, checked before anything is laid
    out (the rank table of a billion nodes would never finish)."""
    at_least(nodes, 1, nodes_flag, "a job needs at least 1 node")
    at_most(nodes, MAX_NODES, nodes_flag, "more nodes than any partition diffscale plans for holds")
    flag = per_node_flag or ("--gpus-per-node" if gpus else "--procs-per-node")
    if gpus:
        at_least(per_node, 1, flag, "at least 1 GPU (rank) per node; leave it out for all of a node's")
        at_most(per_node, MAX_GPUS_PER_NODE, flag, "more GPUs per node than any node holds")
    else:
        at_least(per_node, 1, flag, "at least 1 process per node")
        at_most(per_node, MAX_PROCS_PER_NODE, flag, "more processes per node than any node has cores")


@dataclass(frozen=True)
class Shape:
    """How many nodes and ranks a job asks for.

    One rank per GPU on GPU partitions; on a CPU-only partition ``ranks_per_node`` is
    simply the number of processes per node (gloo).
    """

    nodes: int
    ranks_per_node: int
    partition: str | None = None
    """diffscale partition name; None: the profile's default."""
    time_s: int | None = None
    """Wall time asked for; None: the partition's maximum (or a plan-derived value)."""
    cpus_per_rank: int | None = None
    """CPU cores per rank; None: the node's cores divided evenly among its ranks (at most 8)."""
    mem_per_node_gb: float | None = None
    """Host memory asked per node; None: derived from the workload estimate."""
    use_gpus: bool = True
    """False: CPU ranks (--procs-per-node) even on a partition whose nodes have GPUs."""

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise UserError(f"--nodes {self.nodes} must be at least 1", "ask for 1 or more nodes")
        if self.ranks_per_node < 1:
            raise UserError(f"--gpus-per-node {self.ranks_per_node} must be at least 1",
                            "ask for 1 or more GPUs (processes) per node")
        if self.cpus_per_rank is not None and self.cpus_per_rank < 1:
            raise UserError(f"--cpus-per-task {self.cpus_per_rank} must be at least 1", "use 1 or more")

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def label(self) -> str:
        """``NxG`` as written on the command line (``--race 1x4,4x1``)."""
        return f"{self.nodes}x{self.ranks_per_node}"

    def with_time(self, time_s: int | None) -> Shape:
        return replace(self, time_s=time_s)


def race_count(text: str | None, *, auto: bool) -> int | None:
    """``--race N`` with ``--partition auto``: how many of the best candidates to race. None when
    --race is absent or (without auto) a list of shapes, which :func:`parse_race` reads."""
    if text is None:
        return None
    count = re.fullmatch(r"\s*([+-]?\d+)\s*", text)
    if not count:
        if auto:
            raise UserError(f"--race {text} lists shapes of one partition, but --partition auto races its best "
                            "candidates (each its own partition and shape)",
                            "pass a count with --partition auto (e.g. --race 2), or name one --partition to race "
                            "shapes of it")
        return None
    n = int(count.group(1))
    if not auto:
        raise UserError(f"--race {n} counts --partition auto's candidates, but --partition auto is not given",
                        "add --partition auto to race the candidates that finish first, or list shapes of one "
                        "partition: --race 1x4,2x2")
    if n < 2:
        raise UserError(f"--race {n} is out of range: a race needs at least 2 candidates",
                        "pass --race 2 or more, or leave --race out: plan --partition auto names the one pick")
    return n


def parse_race(text: str) -> list[tuple[int, int]]:
    """``"1x4,4x1"`` -> ``[(1, 4), (4, 1)]`` (nodes, GPUs per node), distinct, in order."""
    shapes: list[tuple[int, int]] = []
    for item in [t.strip() for t in text.split(",") if t.strip()]:
        match = re.fullmatch(r"(\d+)\s*[xX*]\s*(\d+)", item)
        if not match or int(match.group(1)) < 1 or int(match.group(2)) < 1:
            raise UserError(f"--race entry '{item}' is not NODESxGPUS",
                            "write e.g. --race 1x4,4x1 (nodes x GPUs per node)")
        pair = (int(match.group(1)), int(match.group(2)))
        if pair in shapes:
            raise UserError(f"--race lists {item} twice", "list each shape once")
        shapes.append(pair)
    if len(shapes) < 2:
        raise UserError(f"--race '{text}' needs at least two shapes", "write e.g. --race 1x4,4x1")
    return shapes
