"""A sweep's definition: a base (a diffscale config or preset, or a user command with
``{placeholders}``), axes (lists varied as a product, zipped lists varied together, seeds) and
where it runs (a cluster profile with a shape and partition, which axes may vary too).

The YAML form::

    name: lr-study                 # default: the file's name
    out: sweeps/lr-study           # the sweep directory (default sweeps/NAME)
    base:
      preset: small                # or config: my.yaml; or command: python train.py --lr {lr}
      data: builtin:glyphs
      set: [train.steps=2000]
    axes:                          # every combination, in this order
      optim.lr: [1e-4, 3e-4]
      data.fraction: [0.1, 0.25, 0.5, 1.0]
    zip:                           # lists varied together (one entry: one group of equal lengths)
      - {train.batch_per_gpu: [64, 128], cluster.shape: [1x4, 2x4]}
    seeds: [0, 1, 2]               # train.seed, or {seed} in a command
    cluster: {name: purdue-gilbreth, partition: a100, nodes: 1, gpus_per_node: 4, parallel: 8}

Axis names: a config field (``optim.lr``: diffscale runs, passed as ``--set``), a placeholder of the
command (``lr`` for ``{lr}``), or ``cluster.partition`` / ``cluster.shape`` (``NODESxGPUS``).
Pure: parsing and validation only, no file is written.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from diffscale.errors import UserError, closest
from diffscale.studies.sweep_cluster import ClusterSection, parse_cluster, whole_number

PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
"""``{name}`` in a user command; ``{{`` and ``}}`` stay literal braces."""
BUILTIN_PLACEHOLDERS = ("run_dir", "index")
"""Placeholders every element fills itself: its run directory and its index in the sweep."""
CLUSTER_AXES = ("cluster.partition", "cluster.shape")
SEED_AXES = ("train.seed", "seed")
"""The axis a seed list becomes (a diffscale run's, a command's); collect averages over it."""
SHAPE = re.compile(r"(\d+)\s*[xX*]\s*(\d+)")
TOP_KEYS = ("name", "out", "base", "axes", "zip", "seeds", "cluster", "max_elements")
BASE_KEYS = ("preset", "config", "data", "set", "command")
DEFAULT_MAX_ELEMENTS = 10_000
"""Elements a sweep may have unless its file raises ``max_elements`` (checked from the axes'
lengths before any element is built: a mistyped grid of 10**6 is refused at once)."""
def value_text(value: Any) -> str:
    """An axis value as ``--set`` and a command take it: YAML's own spelling for lists and maps."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, dict)):
        return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    if value is None:
        return "null"
    return str(value)


@dataclass(frozen=True, kw_only=True)
class Axis:
    """One varied name and its values, as text."""

    name: str
    """A config field (``optim.lr``), a command placeholder (``lr``) or a cluster axis."""
    values: tuple[str, ...]
    """Each value as ``--set`` or the command receives it."""

    def __post_init__(self) -> None:
        if not self.values:
            raise UserError(f"axis {self.name} has no values", f"list at least one, e.g. {self.name}: [1, 2]")
        if len(set(self.values)) != len(self.values):
            raise UserError(f"axis {self.name} lists a value twice ({', '.join(self.values)})", "list each value once")

    @property
    def is_cluster(self) -> bool:
        return self.name in CLUSTER_AXES

    @property
    def is_config(self) -> bool:
        return "." in self.name and not self.is_cluster


@dataclass(frozen=True, kw_only=True)
class SweepDefinition:
    """A whole sweep, validated: what :func:`diffscale.studies.expand.expand` turns into elements."""

    name: str
    out: str
    """The sweep directory."""
    preset: str | None = None
    config: str | None = None
    data: str | None = None
    overrides: tuple[str, ...] = ()
    """``--set KEY=VALUE`` items every element of a diffscale sweep gets first."""
    command: tuple[str, ...] = ()
    """A user command with ``{placeholders}`` (empty: a diffscale training sweep)."""
    axes: tuple[Axis, ...] = ()
    """Varied as a product, first axis slowest."""
    zips: tuple[tuple[Axis, ...], ...] = ()
    """Groups of axes varied together (equal lengths), each group one dimension of the product."""
    cluster: ClusterSection | None = None
    max_elements: int = DEFAULT_MAX_ELEMENTS
    """More elements than this are refused, counted from the axes before any is built."""
    source: str = ""
    """Where the definition came from (a file, or the command line), for messages."""
    raw: dict[str, Any] = field(default_factory=dict, compare=False)
    """The mapping it was read from: the sweep directory keeps it as sweep.yaml."""

    def __post_init__(self) -> None:
        if self.command and (self.preset or self.config or self.data or self.overrides):
            raise UserError("a sweep has both a user command and a diffscale base (preset/config/data/set)",
                            "sweep a command (base.command with {placeholders}) or a diffscale config, not both")
        for group in self.zips:
            lengths = {a.name: len(a.values) for a in group}
            if len(set(lengths.values())) > 1:
                said = ", ".join(f"{k} has {v}" for k, v in lengths.items())
                raise UserError(f"zipped axes have different lengths ({said})",
                                "give every axis of one zip group the same number of values, or make them "
                                "separate axes (every combination)")
        names = [a.name for a in self.all_axes]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise UserError(f"axis {twice[0]} is given twice", "vary each name in one place (axes, zip or seeds)")
        self._check_names()

    @property
    def all_axes(self) -> tuple[Axis, ...]:
        return self.axes + tuple(a for group in self.zips for a in group)

    def _check_names(self) -> None:
        used = set(PLACEHOLDER.findall(" ".join(self.command).replace("{{", "").replace("}}", "")))
        for axis in self.all_axes:
            if axis.is_cluster:
                if self.cluster is None:
                    raise UserError(f"axis {axis.name} varies the cluster job, but the sweep names no cluster",
                                    "add cluster: {name: PROFILE, ...}, or drop the axis")
                continue
            if self.command:
                if axis.name not in used:
                    raise UserError(f"axis {axis.name} is not a placeholder of the command{closest(axis.name, used)}",
                                    f"write {{{axis.name}}} where the command takes it, or drop the axis")
            elif not axis.is_config:
                raise UserError(f"axis {axis.name} is neither a config field (section.field) nor a cluster axis",
                                "name a config field such as optim.lr, or sweep a command with {placeholders}")
        given = {a.name for a in self.all_axes} | set(BUILTIN_PLACEHOLDERS)
        missing = sorted(used - given)
        if missing:
            raise UserError(f"placeholder {{{missing[0]}}} of the command has no value",
                            f"add an axis {missing[0]}: [...] (or --axis {missing[0]}=A,B), or write the value "
                            "into the command")


def _list(where: str, value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise UserError(f"{where} is not a list", f"write {where}: [A, B, ...]")
    return value


def _axes(where: str, mapping: Any) -> tuple[Axis, ...]:
    if mapping is None:
        return ()
    if not isinstance(mapping, dict):
        raise UserError(f"{where} is not a mapping of names to lists", f"write {where}: {{optim.lr: [1e-4, 3e-4]}}")
    return tuple(Axis(name=str(k), values=tuple(value_text(v) for v in _list(f"{where}.{k}", vs)))
                 for k, vs in mapping.items())


def _known(where: str, mapping: dict[str, Any], keys: tuple[str, ...]) -> None:
    for key in mapping:
        if key not in keys:
            raise UserError(f"{where}{key} is not a sweep setting{closest(str(key), keys)}",
                            f"use {', '.join(where + k for k in keys)}")


def _command(raw: Any) -> tuple[str, ...]:
    if raw is None:
        return ()
    if isinstance(raw, str):
        return tuple(shlex.split(raw))
    return tuple(str(a) for a in _list("base.command", raw))


def from_dict(raw: Any, *, name: str, source: str) -> SweepDefinition:
    """A definition from the YAML's mapping (``name``: the default name)."""
    if not isinstance(raw, dict):
        raise UserError(f"{source} does not hold a sweep (a mapping with base: and axes:)",
                        "see docs/studies.md for an example")
    _known("", raw, TOP_KEYS)
    base = raw.get("base") or {}
    if not isinstance(base, dict):
        raise UserError("base is not a mapping", "write base: {preset: small} or base: {command: ...}")
    _known("base.", base, BASE_KEYS)
    command = _command(base.get("command"))
    zips = tuple(_axes(f"zip[{i}]", group) for i, group in enumerate(_list("zip", raw.get("zip") or [])))
    axes = _axes("axes", raw.get("axes"))
    seeds = raw.get("seeds")
    if seeds is not None:
        axes += (Axis(name=SEED_AXES[1] if command else SEED_AXES[0],
                      values=tuple(value_text(s) for s in _list("seeds", seeds))),)
    sweep_name = str(raw.get("name") or name)
    return SweepDefinition(
        name=sweep_name, out=str(raw.get("out") or Path("sweeps") / sweep_name),
        preset=base.get("preset"), config=base.get("config"), data=base.get("data"),
        overrides=tuple(str(s) for s in _list("base.set", base.get("set") or [])), command=command,
        axes=axes, zips=tuple(z for z in zips if z), cluster=parse_cluster(raw.get("cluster")), source=source,
        max_elements=_max_elements(raw.get("max_elements")), raw={**raw, "name": sweep_name})


def _max_elements(value: Any) -> int:
    if value is None:
        return DEFAULT_MAX_ELEMENTS
    count = whole_number("max_elements", value, "20000")
    if count < 1:
        raise UserError(f"max_elements {count} is out of range (it must be 1 or more)",
                        "write e.g. max_elements: 20000")
    return count


def read_file(path: str | Path) -> Any:
    """The mapping a sweep YAML file holds (checked by :func:`from_dict`)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"sweep file '{path}' does not exist", "pass a sweep YAML (see docs/studies.md) or a sweep dir")
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise UserError(f"{path} is not valid YAML ({str(exc).splitlines()[0]})", "fix the YAML syntax") from exc
    except UnicodeDecodeError as exc:
        raise UserError(f"{path} is not UTF-8 text", "save the sweep file as UTF-8") from exc


def load(path: str | Path) -> SweepDefinition:
    """The definition in a YAML file."""
    return from_dict(read_file(path), name=Path(path).stem, source=str(path))


def parse_axis_flag(text: str) -> tuple[str, list[str]]:
    """``--axis optim.lr=1e-4,3e-4`` -> ``("optim.lr", ["1e-4", "3e-4"])``; a value holding commas is
    written as a YAML list: ``--axis 'model.block_out_channels=[[8,16],[16,32]]'``."""
    name, sep, values = text.partition("=")
    if not sep or not name.strip() or not values.strip():
        raise UserError(f"--axis '{text}' is not NAME=V1,V2,...", "write e.g. --axis optim.lr=1e-4,3e-4")
    if values.strip().startswith("["):
        try:
            parsed = yaml.safe_load(values)
        except yaml.YAMLError as exc:
            raise UserError(f"--axis {name}: '{values}' is not a YAML list", "write e.g. [[8,16],[16,32]]") from exc
        return name.strip(), [value_text(v) for v in _list(f"--axis {name}", parsed)]
    return name.strip(), [v.strip() for v in values.split(",")]


def shape_of(text: str) -> tuple[int, int]:
    """``cluster.shape`` value ``2x4`` -> (nodes, GPUs or processes per node)."""
    match = SHAPE.fullmatch(text.strip())
    if not match or int(match.group(1)) < 1 or int(match.group(2)) < 1:
        raise UserError(f"cluster.shape '{text}' is not NODESxGPUS", "write e.g. cluster.shape: [1x4, 2x4]")
    return int(match.group(1)), int(match.group(2))


@dataclass(frozen=True, kw_only=True)
class ShortForm:
    """The flags of ``diffscale sweep plan|submit|run --preset ... --axis ...`` (no file)."""

    name: str
    out: str | None = None
    preset: str | None = None
    config: str | None = None
    data: str | None = None
    overrides: list[str] = field(default_factory=list)
    axes: list[str] = field(default_factory=list)
    zipped: list[str] = field(default_factory=list)
    command: list[str] = field(default_factory=list)
    cluster: dict[str, Any] | None = None
    max_elements: int | None = None


def from_flags(short: ShortForm) -> SweepDefinition:
    """The definition the short form spells (``--axis`` product, one ``--zip`` group)."""
    if not short.axes and not short.zipped:
        raise UserError("a sweep without a file needs at least one --axis",
                        "e.g. diffscale sweep plan --preset small --axis optim.lr=1e-4,3e-4")
    raw: dict[str, Any] = {"name": short.name, "out": short.out,
                           "axes": dict(parse_axis_flag(a) for a in short.axes),
                           "zip": [dict(parse_axis_flag(a) for a in short.zipped)] if short.zipped else [],
                           "base": {"preset": short.preset, "config": short.config, "data": short.data,
                                    "set": list(short.overrides), "command": list(short.command) or None},
                           "cluster": short.cluster, "max_elements": short.max_elements}
    if len(raw["axes"]) != len(short.axes):
        raise UserError("--axis names an axis twice", "give each name one --axis with all its values")
    return from_dict(raw, name=short.name, source="the command line")
