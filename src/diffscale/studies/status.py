"""Every element's state: its run directory, its latest job's scheduler state (elements submitted
as array tasks) and what ``sweep run`` recorded; the result is written back to state.json."""

from __future__ import annotations

from pathlib import Path

from diffscale.studies.standing import element_state
from diffscale.studies.state import ElementState, read_elements, read_states, record_judged


def _job_states(run_dirs: list[Path]) -> dict[Path, tuple[str, bool]]:
    """(state, active) of the latest job of every run directory with a jobs.json, asked of its scheduler."""
    from diffscale.cluster.jobs import records as jobs
    from diffscale.cluster.jobs.scheduler import for_kind
    from diffscale.cluster.profiles.types import SchedulerKind

    wanted: dict[str, dict[str, Path]] = {}
    for run_dir in run_dirs:
        if jobs.path(run_dir).is_file():
            sub = jobs.latest(str(run_dir))
            newest = continued(run_dir, sub.scheduler) or (sub.jobs[-1].job_id if sub.jobs else None)
            if newest is not None:
                wanted.setdefault(sub.scheduler, {})[newest] = run_dir
    found: dict[Path, tuple[str, bool]] = {}
    for kind, ids in wanted.items():
        for state in for_kind(SchedulerKind(kind)).states(list(ids)):
            found[ids[state.job_id]] = (state.state, state.active)
    return found


def continued(run_dir: Path, scheduler: str) -> str | None:
    """The newest job a Grid Engine element's script submitted to continue it after its time limit
    (its continuations.tsv names the array as parent, without the task: jobs.json's reading of the
    file does not link it to the array task)."""
    from diffscale.cluster.jobs.records import CONTINUATIONS, is_job_id

    file = run_dir / CONTINUATIONS
    if not file.is_file():
        return None
    ids = [line.split("\t")[0] for line in file.read_text().splitlines() if line.count("\t") == 2]
    ids = [i for i in ids if is_job_id(scheduler, i)]
    return ids[-1] if ids else None


def sweep_states(sweep_dir: Path) -> list[tuple[dict[str, str], ElementState]]:
    """(values, state) of every element, in order; state.json updated (an element another writer
    changed meanwhile keeps its newer record)."""
    rows = read_elements(sweep_dir)
    recorded = read_states(sweep_dir, repair=True)
    jobs = _job_states([Path(r.run_dir) for r in rows if Path(r.run_dir).is_dir()])
    states = {}
    for row in rows:
        job = jobs.get(Path(row.run_dir))
        states[row.index] = element_state(row, recorded.get(row.index), job[0] if job else None,
                                          job[1] if job else False)
    record_judged(sweep_dir, recorded, states)
    return [(row.values, states[row.index]) for row in rows]
