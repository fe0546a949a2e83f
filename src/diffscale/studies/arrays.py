"""Array job scripts: one per distinct job shape of a sweep, a pure function of typed inputs.

Every element is a normal run directory with its own job script, rendered by
``cluster/scripts/slurm.py`` / ``sge.py`` exactly as ``diffscale submit`` writes one (requeue on the
warning signal, the max-restarts guard, Grid Engine's continuation jobs). The array script holds the
directives of the shape (``#SBATCH --array=0-N%P`` / ``#$ -t 1-N -tc P``), picks the element of its
array task, sends the task's output to the element's own ``logs/`` and ``exec``s the element's
script in its run directory: the batch shell stays the one process, so the time-limit signal reaches
the element script's trap, and a requeued task (``scontrol requeue`` of the task's own job id) runs
the same element again, resuming from its newest checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from diffscale.cluster.profiles.types import SchedulerKind
from diffscale.cluster.scripts import sge, slurm
from diffscale.cluster.scripts.jobspec import JobSpec
from diffscale.cluster.scripts.shellparts import header, q
from diffscale.cluster.scripts.values import check_job_value
from diffscale.errors import UserError

SLURM_MAX_ARRAY = 1001
"""SLURM's default MaxArraySize: array indices 0..1000."""
SGE_MAX_ARRAY = 75000
"""Grid Engine's default max_aj_tasks."""


def default_max_array(scheduler: SchedulerKind) -> int:
    return SLURM_MAX_ARRAY if scheduler is SchedulerKind.SLURM else SGE_MAX_ARRAY


@dataclass(frozen=True)
class ArrayTask:
    """One element of an array: where its run directory is and which script runs it there."""

    element: int
    run_dir: str
    script_file: str
    """The element's own job script, a file in its run directory."""


@dataclass(frozen=True)
class ArraySpec:
    """One array job: the shape's directives (those of its first element's JobSpec) and its elements."""

    spec: JobSpec
    job_name: str
    tasks: tuple[ArrayTask, ...]
    parallel: int = 0
    """At most this many tasks at once; 0: no limit."""
    title: str = ""


def first_task(scheduler: SchedulerKind) -> int:
    """SLURM numbers array tasks from 0, Grid Engine from 1."""
    return 0 if scheduler is SchedulerKind.SLURM else 1


def task_job_id(scheduler: SchedulerKind, array_id: str, position: int) -> str:
    """The id of the array's ``position``-th task (0-based) as the scheduler names it."""
    task = first_task(scheduler) + position
    return f"{array_id}_{task}" if scheduler is SchedulerKind.SLURM else f"{array_id}.{task}"


def task_log(scheduler: SchedulerKind, job_name: str, array_id: str, position: int) -> str:
    """The element's log of its array task, relative to its run directory."""
    job_id = task_job_id(scheduler, array_id, position)
    return (slurm if scheduler is SchedulerKind.SLURM else sge).log_path(job_name, job_id)


def check_array(array: ArraySpec) -> None:
    """Every value the array script carries, through the one check job scripts use."""
    check_job_value("job name", array.job_name, token=True, fix="name the sweep with letters, digits and -")
    for task in array.tasks:
        check_job_value(f"run dir of element {task.element}", task.run_dir, fix="choose a sweep dir without one")
        check_job_value(f"script of element {task.element}", task.script_file, fix="")
    if array.parallel < 0:
        raise UserError(f"cluster.parallel {array.parallel} is negative", "give 0 (no limit) or more")


def _choose(var: str, array: ArraySpec) -> list[str]:
    first = first_task(array.spec.scheduler)
    lines = [f"case \"${var}\" in"]
    for position, task in enumerate(array.tasks):
        lines.append(f"    {first + position}) ELEMENT_DIR={q(task.run_dir)}; ELEMENT_SCRIPT={q(task.script_file)} ;;")
    lines += [f"    *) echo \"diffscale: array task ${var} is not an element of this sweep\" >&2; exit 2 ;;", "esac"]
    return lines


def _body(array: ArraySpec, task_var: str, log: str) -> list[str]:
    return [
        "",
        "set -uo pipefail",
        "# Which element this array task runs: its run directory and its own job script there.",
        *_choose(task_var, array),
        "mkdir -p \"$ELEMENT_DIR/logs\" || exit 2",
        f"echo \"diffscale: array task ${task_var} runs $ELEMENT_DIR (log: $ELEMENT_DIR/{log})\"",
        "# The element's output goes to its own log; exec keeps this shell's process, so the warning",
        "# signal reaches the element script's trap and its requeue acts on this task alone.",
        f"exec >>\"$ELEMENT_DIR/{log}\" 2>&1",
        "cd \"$ELEMENT_DIR\" || exit 2",
        "exec /bin/bash \"./$ELEMENT_SCRIPT\"",
    ]


def render_slurm(array: ArraySpec) -> str:
    """``#SBATCH --array=0-(N-1)[%P]`` with the shape's directives; the sweep's log per task in logs/."""
    check_array(array)
    spec = replace(array.spec, job_name=array.job_name)
    n = len(array.tasks)
    throttle = f"%{array.parallel}" if array.parallel else ""
    directives = [d if not d.startswith("#SBATCH --output=") else "#SBATCH --output=logs/%x-%A_%a.out"
                  for d in slurm.directives(spec)]
    lines = header(array.title or spec.title, "Submit it from the sweep directory (diffscale sweep submit does).")
    lines += [*directives, f"#SBATCH --array=0-{n - 1}{throttle}"]
    log = slurm.log_path(array.job_name, "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}")
    return "\n".join(lines + _body(array, "SLURM_ARRAY_TASK_ID", log)) + "\n"


def render_sge(array: ArraySpec) -> str:
    """``#$ -t 1-N [-tc P]`` with the shape's directives."""
    check_array(array)
    spec = replace(array.spec, job_name=array.job_name)
    lines = header(array.title or spec.title, "Submit it from the sweep directory (diffscale sweep submit does).")
    lines += [*sge.directives(spec), f"#$ -t 1-{len(array.tasks)}"]
    if array.parallel:
        lines.append(f"#$ -tc {array.parallel}")
    log = sge.log_path(array.job_name, "${JOB_ID}.${SGE_TASK_ID}")
    return "\n".join(lines + _body(array, "SGE_TASK_ID", log)) + "\n"


def render(array: ArraySpec) -> str:
    return (render_slurm if array.spec.scheduler is SchedulerKind.SLURM else render_sge)(array)


def script_name(scheduler: SchedulerKind, label: str) -> str:
    """``array-<label>.slurm.sh`` / ``.sge.sh`` in the sweep directory."""
    return f"array-{label}.{'slurm' if scheduler is SchedulerKind.SLURM else 'sge'}.sh"


def check_size(count: int, limit: int, scheduler: SchedulerKind, label: str) -> None:
    """More elements in one array than the scheduler takes: refused with the fix, before submitting."""
    if count > limit:
        where = "MaxArraySize in slurm.conf" if scheduler is SchedulerKind.SLURM else "max_aj_tasks (qconf -sconf)"
        raise UserError(f"job shape {label} has {count} elements, more than one array may hold ({limit}, {where})",
                        "split the sweep (fewer values per axis, or one sweep file per part), or set "
                        "cluster.max_array to the cluster's limit if it is higher")
