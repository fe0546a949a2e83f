"""A planned sweep's directory: its definition, its table of elements and each element's run
directory with its resolved config, written before anything runs or is submitted."""

from __future__ import annotations

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


def write_sweep(plan: SweepPlan) -> None:
    """The sweep directory of ``plan``; one holding another sweep is refused, not overwritten."""
    sweep_dir = plan.sweep_dir
    labels = {e.index: g.label for g in plan.groups for e in g.elements}
    rows = [ElementRecord(e.index, dict(e.values), e.run_dir, labels.get(e.index, "")) for e in plan.elements]
    if is_sweep_dir(sweep_dir):
        old = read_definition(sweep_dir)
        same = {k: v for k, v in old.items() if k != "out"} == {k: v for k, v in plan.definition.raw.items()
                                                                 if k != "out"}
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

    for element, cfg in zip(plan.elements, plan.configs, strict=True):
        run_dir = Path(element.run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        if cfg is not None and not (run_dir / "config.yaml").is_file():
            write_text(run_dir / "config.yaml", job_config(cfg).to_yaml())
