"""A sweep planned: its elements, each element's job (``cluster/planning/plan.py`` as for a single
run) and one array per distinct job shape. Pure apart from resolving configs and reading the
cluster profile; nothing is written here."""

from __future__ import annotations

import math
import sys
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from diffscale.errors import UserError
from diffscale.studies.definition import SweepDefinition
from diffscale.studies.expand import Element, element_configs, expand, value_probes

if TYPE_CHECKING:
    from diffscale.cluster.planning.plan import Plan
    from diffscale.cluster.profiles.types import ClusterProfile
    from diffscale.config import RunConfig
    from diffscale.studies.arrays import ArraySpec

COMPILE_CACHE = "compile-cache"
"""The sweep directory's folder of kernel caches, one per compiled graph."""


def compile_cache_dir(sweep_dir: Path, cfg: RunConfig, world_size: int) -> str:
    return str(sweep_dir.absolute() / COMPILE_CACHE / cfg.graph_key(world_size))


@dataclass(frozen=True)
class ArrayGroup:
    """Elements whose jobs ask for the same resources: one array job."""

    label: str
    plans: tuple[Plan, ...]
    elements: tuple[Element, ...]
    array: ArraySpec


@dataclass(frozen=True)
class SweepPlan:
    definition: SweepDefinition
    sweep_dir: Path
    elements: tuple[Element, ...]
    configs: tuple[RunConfig | None, ...]
    profile: ClusterProfile | None
    groups: tuple[ArrayGroup, ...]
    count: int = field(default=-1)
    """Elements of the whole sweep (more than ``elements`` when only the first were planned)."""

    def __post_init__(self) -> None:
        if self.count < 0:
            object.__setattr__(self, "count", len(self.elements))


def sweep_dir_of(definition: SweepDefinition) -> Path:
    return Path(definition.out).absolute()


def check_count(definition: SweepDefinition) -> int:
    """The number of elements, from the axes' lengths alone; more than ``max_elements`` is refused
    before a single element is built."""
    lengths = [len(a.values) for a in definition.axes] + [len(g[0].values) for g in definition.zips]
    count = math.prod(lengths)
    if count > definition.max_elements:
        raise UserError(f"the sweep has {count:,} elements ({' x '.join(map(str, lengths))}), more than max_elements "
                        f"({definition.max_elements:,})",
                        "use fewer values per axis, or raise max_elements: in the sweep file (--max-elements N) "
                        "if you mean it")
    return count


def plan_sweep(definition: SweepDefinition, *, force: bool = False, preview: int | None = None) -> SweepPlan:
    """Elements, configs (every one validated), and with a cluster the array groups. With
    ``preview`` a larger sweep plans only its first ``preview`` elements; every axis value is
    still checked against the config (once each, in the first element that has it)."""
    check_count(definition)
    sweep_dir = sweep_dir_of(definition)
    elements = expand(definition, sweep_dir)
    profile = None
    if definition.cluster is not None:
        from diffscale.cluster.profiles.loading import load_profile

        profile = load_profile(definition.cluster.name)
        _check_array_sizes(definition, profile, elements)
    planned = elements if preview is None or len(elements) <= preview else elements[:preview]
    if len(planned) < len(elements):
        element_configs(definition, value_probes(definition, elements))
    configs = element_configs(definition, planned)
    if profile is None:
        return SweepPlan(definition, sweep_dir, tuple(planned), tuple(configs), None, (), len(elements))
    plans = [_element_plan(definition, profile, e, c, sweep_dir) for e, c in zip(planned, configs, strict=True)]
    groups = _groups(definition, profile, sweep_dir, planned, plans)
    _refuse_failed(groups, force, definition)
    return SweepPlan(definition, sweep_dir, tuple(planned), tuple(configs), profile, groups, len(elements))


def _shape_label(definition: SweepDefinition, profile: ClusterProfile, element: Element) -> str:
    """``PARTITION-NxG`` of an element from its values alone (no config, no plan)."""
    section = definition.cluster
    assert section is not None
    part = profile.partition(element.partition(section.partition))
    per_node = section.gpus_per_node or section.procs_per_node or part.gpus_per_node or 1
    nodes, ranks = element.shape(section.nodes, per_node)
    return f"{part.name}-{nodes}x{ranks or 1}"


def _check_array_sizes(definition: SweepDefinition, profile: ClusterProfile, elements: list[Element]) -> None:
    """More elements of one partition and shape than one array holds: refused before any element's
    config or job is built (the arrays are at least as large as their partition and shape say)."""
    from diffscale.studies.arrays import check_size, default_max_array

    section = definition.cluster
    assert section is not None
    limit = section.max_array or profile.max_array_size or default_max_array(profile.scheduler)
    for label, count in Counter(_shape_label(definition, profile, e) for e in elements).items():
        check_size(count, limit, profile.scheduler, label)


def _element_plan(definition: SweepDefinition, profile: ClusterProfile, element: Element, cfg: RunConfig | None,
                  sweep_dir: Path) -> Plan:
    from diffscale.cluster.planning.plan import PlanOptions, make_plan
    from diffscale.cluster.planning.shape import Shape
    from diffscale.cluster.planning.workload import UserCommand, diffscale_run, job_config
    from diffscale.cluster.scripts.timefmt import parse_time_limit

    section = definition.cluster
    assert section is not None
    partition = element.partition(section.partition)
    per_node = section.gpus_per_node or section.procs_per_node or profile.partition(partition).gpus_per_node or 1
    nodes, ranks = element.shape(section.nodes, per_node)
    shape = Shape(nodes=nodes, ranks_per_node=ranks or 1, partition=partition,
                  time_s=parse_time_limit(section.time) if section.time else None,
                  cpus_per_rank=section.cpus_per_task, mem_per_node_gb=section.mem,
                  use_gpus=section.procs_per_node is None)
    python = section.python or sys.executable
    # an element's job requeues itself at its time limit: a chain of dependent segments would
    # make later elements of the array wait on earlier ones
    options = PlanOptions(account=section.account, qos=section.qos, chain=False, setup=section.setup)
    if cfg is None:
        workload = UserCommand(element.command(definition.command), element.run_dir, python)
        return make_plan(profile, shape, workload, options)
    plan = make_plan(profile, shape, diffscale_run(job_config(cfg), element.run_dir, python), options)
    cache = ("TORCHINDUCTOR_CACHE_DIR", compile_cache_dir(sweep_dir, cfg, shape.world_size))
    return replace(plan, spec=replace(plan.spec, command_env=(*plan.spec.command_env, cache)))


def _shape_key(plan: Plan) -> tuple[str, ...]:
    """The directives of the element's job, its name left out: elements that agree share an array."""
    from diffscale.cluster.profiles.types import SchedulerKind
    from diffscale.cluster.scripts import sge, slurm

    spec = replace(plan.spec, job_name="x")
    lines = slurm.directives(spec) if spec.scheduler is SchedulerKind.SLURM else sge.directives(spec)
    return (*lines, *spec.setup, *(f"{k}={v}" for k, v in spec.env))


def _groups(definition: SweepDefinition, profile: ClusterProfile, sweep_dir: Path, elements: list[Element],
            plans: list[Plan]) -> tuple[ArrayGroup, ...]:
    from diffscale.cluster.scripts.jobspec import job_name
    from diffscale.studies.arrays import ArraySpec, ArrayTask, check_size, default_max_array

    section = definition.cluster
    assert section is not None
    keyed: dict[tuple[str, ...], list[int]] = {}
    for i, plan in enumerate(plans):
        keyed.setdefault(_shape_key(plan), []).append(i)
    limit = section.max_array or profile.max_array_size or default_max_array(profile.scheduler)
    groups = []
    plain = [f"{plans[m[0]].partition.name}-{plans[m[0]].shape.label}" for m in keyed.values()]
    for k, members in enumerate(keyed.values()):
        first = plans[members[0]]
        label = plain[k] if plain.count(plain[k]) == 1 else f"{plain[k]}-{plain[:k].count(plain[k]) + 1}"
        check_size(len(members), limit, profile.scheduler, label)
        tasks = tuple(ArrayTask(elements[i].index, elements[i].run_dir, plans[i].spec.script_file) for i in members)
        title = (f"sweep {definition.name}: {len(members)} element(s) as one array; "
                 f"{first.spec.title.split('; ', 1)[0]}")
        array = ArraySpec(spec=first.spec, job_name=job_name(str(sweep_dir), label), tasks=tasks,
                          parallel=section.parallel, title=title)
        groups.append(ArrayGroup(label, tuple(plans[i] for i in members), tuple(elements[i] for i in members), array))
    return tuple(groups)


def _refuse_failed(groups: tuple[ArrayGroup, ...], force: bool, definition: SweepDefinition) -> None:
    """A failed preflight check refused with its fix in the sweep's own words, unless ``--force``
    (every check) or ``cluster.force`` names it."""
    from diffscale.studies.forcing import check_forced_names, sweep_fix

    section = definition.cluster
    assert section is not None
    names = {c.name.lower() for g in groups for p in g.plans for c in p.checks}
    check_forced_names(section.force, names)
    if force:
        return
    forced = {n.lower() for n in section.force}
    for group in groups:
        for plan, element in zip(group.plans, group.elements, strict=True):
            failed = [c for c in plan.failed if c.name.lower() not in forced]
            if failed:
                check, from_file = failed[0], definition.source != "the command line"
                raise UserError(f"preflight check '{check.name}' failed for {element.label}: "
                                f"{sweep_fix(check.detail, from_file=from_file)}",
                                f"{sweep_fix(check.fix, from_file=from_file)}; or "
                                f"force this check alone (cluster.force: ['{check.name}'], or --force-check "
                                f"'{check.name}'), or every check with --force")
