"""A planned sweep's directory: its definition, its table of elements and each element's run
directory with its resolved config, written before anything runs or is submitted."""

from __future__ import annotations

from typing import Any

from diffscale.errors import UserError
from diffscale.io.atomic import write_text
from diffscale.studies.plan import SweepPlan
from diffscale.studies.state import (
    DEFINITION,
    ElementRecord,
    is_sweep_dir,
    read_definition,
    read_elements,
    write_definition,
    write_elements,
)


def _what_runs(raw: dict[str, Any]) -> dict[str, Any]:
    """A definition less what may change between calls on one sweep: where it is, its element limit,
    the preflight checks it goes ahead despite."""
    cluster = raw.get("cluster")
    if isinstance(cluster, dict):
        raw = {**raw, "cluster": {k: v for k, v in cluster.items() if k != "force"}}
    return {k: v for k, v in raw.items() if k not in ("out", "max_elements")}


def write_sweep(plan: SweepPlan) -> list[int]:
    """The sweep directory of ``plan``; one holding another sweep is refused, not overwritten.
    Returns the elements whose run directory was gone and is made again (they run again)."""
    sweep_dir = plan.sweep_dir
    labels = {e.index: g.label for g in plan.groups for e in g.elements}
    rows = [ElementRecord(e.index, dict(e.values), e.run_dir, labels.get(e.index, "")) for e in plan.elements]
    existed = is_sweep_dir(sweep_dir)
    if existed:
        same = _what_runs(read_definition(sweep_dir)) == _what_runs(plan.definition.raw)
        if not same or [(r.index, r.values) for r in read_elements(sweep_dir)] != [(r.index, r.values) for r in rows]:
            raise UserError(f"{sweep_dir} holds another sweep (its {DEFINITION} differs)",
                            f"continue that one with `diffscale sweep ... {sweep_dir}`, or give this one a new out:")
    elif sweep_dir.exists() and any(sweep_dir.iterdir()):
        raise UserError(f"{sweep_dir} exists and is not a sweep directory", "give the sweep a new or empty out:")
    sweep_dir.mkdir(parents=True, exist_ok=True)
    write_definition(sweep_dir, plan.definition.raw)
    write_elements(sweep_dir, rows)
    from pathlib import Path

    from diffscale.cluster.planning.workload import job_config

    remade = []
    for element, cfg in zip(plan.elements, plan.configs, strict=True):
        run_dir = Path(element.run_dir)
        if existed and not run_dir.is_dir():
            remade.append(element.index)
        run_dir.mkdir(parents=True, exist_ok=True)
        if cfg is not None and not (run_dir / "config.yaml").is_file():
            write_text(run_dir / "config.yaml", job_config(cfg).to_yaml())
    return remade
