"""The measured figures the planner prefers over its formulas, read from ``measured.yaml``
(shipped with the package) and validated: every figure names a source that gives the card,
the date, the commit, the command and the docs/benchmarks.md section of its run.
"""

from __future__ import annotations

import datetime
import functools
from dataclasses import dataclass
from importlib import resources
from typing import Any

import yaml

PROVENANCE_FIELDS = ("card", "date", "commit", "command", "section")


class MeasuredDataError(ValueError):
    """measured.yaml is malformed: a packaging error, not something a user's input causes."""


@dataclass(frozen=True)
class Provenance:
    card: str
    date: datetime.date
    commit: str
    command: str
    section: str
    """Where docs/benchmarks.md records the run (starts with ``docs/benchmarks.md``)."""
    note: str = ""


@dataclass(frozen=True)
class Throughput:
    preset: str
    gpu: str
    """GPU key as ``estimates.gpu_key`` returns it (``H100``)."""
    samples_per_s: float
    """Training samples/s of one GPU."""
    provenance: Provenance


@dataclass(frozen=True)
class PeakMemory:
    preset: str
    batch_per_gpu: int
    reserved_gib: float
    """``torch.cuda.max_memory_reserved`` of one rank, GiB."""
    gpus: tuple[str, ...]
    """GPU keys the figure stands for."""
    provenance: Provenance


@dataclass(frozen=True)
class Measured:
    throughput: tuple[Throughput, ...]
    peak_gpu_memory: tuple[PeakMemory, ...]

    def samples_per_s(self, preset: str, gpu: str | None) -> Throughput | None:
        return next((t for t in self.throughput if (t.preset, t.gpu) == (preset, gpu)), None)

    def peak_memory(self, preset: str, batch_per_gpu: int, gpu: str | None) -> PeakMemory | None:
        return next((m for m in self.peak_gpu_memory
                     if (m.preset, m.batch_per_gpu) == (preset, batch_per_gpu) and gpu in m.gpus), None)


def _need(entry: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    value = entry.get(key)
    if not isinstance(value, kind) or isinstance(value, bool) or value == "":
        raise MeasuredDataError(f"{where}: '{key}' is missing or not a {getattr(kind, '__name__', kind)}: {value!r}")
    return value


def _provenance(name: str, raw: Any) -> Provenance:
    where = f"sources.{name}"
    if not isinstance(raw, dict):
        raise MeasuredDataError(f"{where}: not a mapping")
    unknown = set(raw) - set(PROVENANCE_FIELDS) - {"note"}
    if unknown:
        raise MeasuredDataError(f"{where}: unknown keys {sorted(unknown)}")
    date = _need(raw, "date", datetime.date, where)
    section = _need(raw, "section", str, where)
    if not section.startswith("docs/benchmarks.md"):
        raise MeasuredDataError(f"{where}: 'section' must name a docs/benchmarks.md section: {section!r}")
    return Provenance(card=_need(raw, "card", str, where), date=date,
                      commit=str(_need(raw, "commit", (str, int), where)), command=_need(raw, "command", str, where),
                      section=section, note=str(raw.get("note", "")))


def _source(entry: dict[str, Any], sources: dict[str, Provenance], where: str) -> Provenance:
    name = _need(entry, "source", str, where)
    if name not in sources:
        raise MeasuredDataError(f"{where}: source '{name}' is not among sources ({', '.join(sorted(sources))})")
    return sources[name]


def _entries(data: dict[str, Any], key: str) -> list[tuple[str, dict[str, Any]]]:
    items = data.get(key)
    if not isinstance(items, list) or not all(isinstance(e, dict) for e in items):
        raise MeasuredDataError(f"'{key}' must be a list of mappings")
    return [(f"{key}[{i}]", e) for i, e in enumerate(items)]


def parse(data: Any) -> Measured:
    """Validate the YAML document's content -> :class:`Measured`."""
    if not isinstance(data, dict) or data.get("version") != 1:
        raise MeasuredDataError("not a version 1 measured-figures document")
    raw_sources = data.get("sources")
    if not isinstance(raw_sources, dict) or not raw_sources:
        raise MeasuredDataError("'sources' must map names to provenance")
    sources = {name: _provenance(name, raw) for name, raw in raw_sources.items()}
    throughput = tuple(
        Throughput(preset=_need(e, "preset", str, w), gpu=_need(e, "gpu", str, w),
                   samples_per_s=float(_need(e, "samples_per_s", (int, float), w)), provenance=_source(e, sources, w))
        for w, e in _entries(data, "throughput"))
    memory = []
    for w, e in _entries(data, "peak_gpu_memory"):
        gpus = _need(e, "gpus", list, w)
        if not gpus or not all(isinstance(g, str) for g in gpus):
            raise MeasuredDataError(f"{w}: 'gpus' must list GPU keys")
        memory.append(PeakMemory(preset=_need(e, "preset", str, w), batch_per_gpu=_need(e, "batch_per_gpu", int, w),
                                 reserved_gib=float(_need(e, "reserved_gib", (int, float), w)), gpus=tuple(gpus),
                                 provenance=_source(e, sources, w)))
    return Measured(throughput=throughput, peak_gpu_memory=tuple(memory))


@functools.lru_cache(maxsize=1)
def load() -> Measured:
    """The figures shipped with this diffscale (read once)."""
    text = (resources.files("diffscale.cluster.planning") / "measured.yaml").read_text()
    return parse(yaml.safe_load(text))
