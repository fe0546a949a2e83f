"""What the sweep verbs print: the table of elements, the array scripts with the preflight of
each job shape, and the status of every element. Every cell is a rich ``Text``: values, paths
and failure reasons (gloo's ``[host]:port``) are shown as they are, never read as markup."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table
from rich.text import Text

from diffscale.io.tables import terminal_width

if TYPE_CHECKING:
    from diffscale.studies.plan import SweepPlan
    from diffscale.studies.state import ElementState

STYLE = {"pending": "yellow", "running": "cyan", "done": "green", "failed": "bold red", "stopped": "magenta",
         "missing": "bold red"}
PREVIEW = 20
"""Elements a plan of a larger sweep lists (the rest are counted)."""


def console() -> Console:
    return Console(width=terminal_width(), highlight=False, soft_wrap=True)


def _relative(path: str, base: Path) -> str:
    try:
        return str(Path(path).relative_to(base))
    except ValueError:
        return path


def print_elements(plan: SweepPlan) -> None:
    names = [a.name for a in plan.definition.all_axes]
    labels = {e.index: g.label for g in plan.groups for e in g.elements}
    table = Table(title=Text(f"sweep {plan.definition.name}: {plan.count:,} run(s) in {plan.sweep_dir}"))
    for col in ("#", *names, "run dir", *(["array"] if labels else [])):
        table.add_column(Text(col))
    for e in plan.elements[:PREVIEW] if plan.count > len(plan.elements) else plan.elements:
        table.add_row(Text(str(e.index)), *(Text(e.value(n) or "") for n in names),
                      Text(_relative(e.run_dir, plan.sweep_dir)), *([Text(labels[e.index])] if labels else []))
    out = console()
    out.print(table)
    if plan.count > len(plan.elements):
        out.print(f"the first {len(plan.elements)} of {plan.count:,} elements shown and planned; every axis value "
                  "was checked against the config; `sweep run` / `sweep submit` plan all of them", markup=False)


def print_arrays(plan: SweepPlan) -> None:
    from diffscale.cluster.tables import print_checks
    from diffscale.studies.arrays import render, script_name

    out = console()
    if plan.profile is None:
        out.print("no cluster: run the elements here with `diffscale sweep run`", markup=False)
        return
    for group in plan.groups:
        name = script_name(plan.profile.scheduler, group.label)
        out.print(f"\n# ---- {name}: {len(group.elements)} element(s), shape {group.label} ----", markup=False)
        out.print(render(group.array), markup=False, end="")
        out.print(f"# ---- the job script of each element (element {group.elements[0].index} shown) ----",
                  markup=False)
        out.print(group.plans[0].script(), markup=False, end="")
        print_checks(group.plans[0], time_asked=plan.definition.cluster is not None
                     and plan.definition.cluster.time is not None)


def print_status(sweep_dir: Path, states: list[tuple[dict[str, str], ElementState]]) -> None:
    names = list(states[0][0]) if states else []
    table = Table(title=Text(f"sweep {sweep_dir}"))
    for col in ("#", *names, "state", "why"):
        table.add_column(Text(col))
    for values, s in states:
        why = s.reason + (f" (exit {s.exit_code})" if s.exit_code not in (None, 0) and s.reason else "")
        table.add_row(Text(str(s.index)), *(Text(values.get(n, "")) for n in names),
                      Text(s.state, style=STYLE[s.state]), Text(why))
    out = console()
    out.print(table)
    counts = Counter(s.state for _, s in states)
    out.print(", ".join(f"{counts.get(k, 0)} {k}" for k in STYLE), markup=False)
