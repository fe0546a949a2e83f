"""The table of a sweep's elements: every combination of its axes, each with its values and its
own run directory under the sweep directory (``runs/000``, ``runs/001``, ...). Pure apart from
resolving each element's config, which is how a value that fails validation is found before
anything is written or submitted."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from diffscale.errors import UserError
from diffscale.studies.definition import PLACEHOLDER, SEED_AXES, SweepDefinition, shape_of
from diffscale.studies.state import RUNS

if TYPE_CHECKING:
    from diffscale.config import RunConfig


@dataclass(frozen=True, kw_only=True)
class Element:
    """One run of the sweep."""

    index: int
    values: tuple[tuple[str, str], ...]
    """(axis name, value) of every axis, in the definition's order."""
    run_dir: str
    """Absolute path of its run directory (elements.json keeps it relative to the sweep directory)."""

    @property
    def label(self) -> str:
        """``element 3 (optim.lr=3e-4, train.seed=1)``, for messages."""
        return f"element {self.index} ({', '.join(f'{k}={v}' for k, v in self.values)})"

    def value(self, name: str) -> str | None:
        return dict(self.values).get(name)

    @property
    def overrides(self) -> tuple[str, ...]:
        """The element's config fields as ``--set`` items (cluster and placeholder axes left out)."""
        return tuple(f"{k}={v}" for k, v in self.values if "." in k and not k.startswith("cluster."))

    @property
    def seed(self) -> str | None:
        return next((v for k, v in self.values if k in SEED_AXES), None)

    def shape(self, nodes: int, per_node: int | None) -> tuple[int, int | None]:
        """(nodes, ranks per node): the sweep's, unless a ``cluster.shape`` axis sets them."""
        text = self.value("cluster.shape")
        return shape_of(text) if text is not None else (nodes, per_node)

    def partition(self, default: str | None) -> str | None:
        return self.value("cluster.partition") or default

    def command(self, argv: tuple[str, ...]) -> tuple[str, ...]:
        """``argv`` with every ``{placeholder}`` filled; ``{{``/``}}`` become literal braces."""
        fill = dict(self.values) | {"run_dir": self.run_dir, "index": str(self.index)}

        def one(arg: str) -> str:
            parts = arg.split("{{")
            return "{".join(PLACEHOLDER.sub(lambda m: fill[m.group(1)], p).replace("}}", "}") for p in parts)

        return tuple(one(a) for a in argv)


def run_dir_name(index: int, count: int) -> str:
    return f"{index:0{max(3, len(str(count - 1)))}d}"


def expand(definition: SweepDefinition, sweep_dir: Path) -> list[Element]:
    """Every element: the product of the axes (first slowest), each zip group one dimension."""
    dims: list[list[tuple[tuple[str, str], ...]]] = [[((a.name, v),) for v in a.values] for a in definition.axes]
    for group in definition.zips:
        dims.append([tuple((a.name, a.values[i]) for a in group) for i in range(len(group[0].values))])
    combos = list(itertools.product(*dims)) if dims else [()]
    order = [a.name for a in definition.all_axes]
    elements = []
    for index, combo in enumerate(combos):
        values = dict(pair for part in combo for pair in part)
        elements.append(Element(index=index, values=tuple((n, values[n]) for n in order if n in values),
                                run_dir=str(sweep_dir.absolute() / RUNS / run_dir_name(index, len(combos)))))
    return elements


def value_probes(definition: SweepDefinition, elements: list[Element]) -> list[Element]:
    """The first element holding each value of each axis: checking their configs checks every
    value once (a sum of the axes' lengths, not their product)."""
    seen: set[tuple[str, str]] = set()
    probes = []
    for element in elements:
        new = set(element.values) - seen
        if new:
            seen |= new
            probes.append(element)
    return probes


def element_config(definition: SweepDefinition, element: Element) -> RunConfig:
    """The element's resolved config; a value that fails validation names its element."""
    from diffscale.config import ConfigSources, resolve_config

    try:
        return resolve_config(ConfigSources(preset=definition.preset, config_file=definition.config,
                                            data=definition.data,
                                            overrides=[*definition.overrides, *element.overrides]))
    except UserError as exc:
        raise UserError(f"{element.label}: {exc.cause}", exc.fix) from exc


def element_configs(definition: SweepDefinition, elements: list[Element]) -> list[RunConfig | None]:
    """Every element's config (None for a command sweep), all validated before any is used."""
    if definition.command:
        return [None] * len(elements)
    return [element_config(definition, e) for e in elements]
