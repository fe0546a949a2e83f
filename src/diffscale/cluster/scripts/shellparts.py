"""Shell fragments shared by the SLURM and Grid Engine job scripts.

Every user-controlled value reaches the script through :func:`q` (shlex.quote): paths
with spaces, quotes, ``$``, backticks or newlines stay one literal word. Values that go
into ``#SBATCH`` / ``#$`` lines (parsed by sbatch/qsub, not by a shell) are never paths:
names are validated to a safe alphabet and logs are written relative to the run
directory, which the job runs in.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterable

from diffscale.cluster.scripts.jobspec import RaceSpec
from diffscale.data.locations import SPOOL_END_NAME
from diffscale.runtime.signals import EXIT_REQUEUE
from diffscale.version import __version__

q = shlex.quote


def words(argv: Iterable[str]) -> str:
    return " ".join(q(a) for a in argv)


def header(title: str, directive_note: str) -> list[str]:
    title = "".join(c if c.isprintable() else "?" for c in title)
    return [
        "#!/bin/bash",
        f"# Job script written by diffscale {__version__}: regenerate it with `diffscale plan` rather than edit it.",
        f"# {title}",
        f"# {directive_note}",
    ]


def exports(env: Iterable[tuple[str, str]]) -> list[str]:
    return [f"export {name}={q(value)}" for name, value in env]


def wait_for(pid_var: str, rc_var: str) -> list[str]:
    """Wait for a background process, riding out trapped signals.

    ``wait`` returns early (status > 128) when a trapped signal arrives while the child
    still runs; wait again then. A last ``wait`` fetches the status bash remembered if
    the child ended just as the trap ran (it answers 127 when nothing is left to fetch).
    """
    return [
        f"wait \"${pid_var}\"; {rc_var}=$?",
        f"while [ \"${rc_var}\" -gt 128 ] && kill -0 \"${pid_var}\" 2>/dev/null; "
        f"do wait \"${pid_var}\"; {rc_var}=$?; done",
        f"if [ \"${rc_var}\" -gt 128 ]; then wait \"${pid_var}\" 2>/dev/null; _last=$?; "
        f"[ \"$_last\" -ne 127 ] && {rc_var}=$_last; fi",
    ]


def site_setup(setup: Iterable[str], env: Iterable[tuple[str, str]]) -> list[str]:
    lines = list(setup)
    out = []
    if lines:
        out.append("# Set-up: the cluster profile's lines, then --setup's (module load, conda activate, ...)")
        out.extend(lines)
    env_lines = exports(env)
    if env_lines:
        out.append("# Variables from the cluster profile (NCCL settings)")
        out.extend(env_lines)
    return out


REQUEUE_NOTE = (f"# Exit {EXIT_REQUEUE}: diffscale checkpointed on the warning signal and is not finished.")


def command_exports(command_env: Iterable[tuple[str, str]]) -> list[str]:
    env = list(command_env)
    unbuffered = [(k, v) for k, v in env if k == "PYTHONUNBUFFERED"]
    kernels = [(k, v) for k, v in env if k == "TORCHINDUCTOR_CACHE_DIR"]
    cache = [(k, v) for k, v in env if k == "DIFFSCALE_CACHE_DIR"]
    own = [(k, v) for k, v in env if k not in ("PYTHONUNBUFFERED", "TORCHINDUCTOR_CACHE_DIR", "DIFFSCALE_CACHE_DIR")]
    lines = []
    if unbuffered:
        lines += ["# For the command: a job log is a file, which Python block-buffers; unbuffered, what it",
                  "# prints appears in the log as it happens.", *exports(unbuffered)]
    if cache:
        lines += ["# For the command: diffscale's cache, where `diffscale plan` looked. Compiled kernels live in its",
                  "# kernels/GPU-KIND-torch-VERSION/GRAPH-KEY/: the next job on any node that mounts it starts warm.",
                  *exports(cache)]
    if kernels:
        lines += ["# For the command: the sweep's kernel cache, shared by its runs that compile the same graph.",
                  *exports(kernels)]
    if own:
        lines += ["# For the command: where it hands its output to the coupled trainer (the spool directory).",
                  *exports(own)]
    return lines


PYTHON_VAR = "job_python"
"""The script variable holding the interpreter a job picked after its set-up (``python_choice``)."""
_WHICH_PYTHON = "$(command -v python 2>/dev/null || command -v python3 2>/dev/null || true)"


def python_choice(planned: str | None, setup: Iterable[str]) -> list[str]:
    """The set-up lines, around them the shell asked which ``python`` it finds, and ``$job_python``
    set to the one the lines put on PATH if they changed it (conda activate, a venv, a module,
    export PATH=...), else to ``planned``; the log names it. Without ``planned``: the lines alone."""
    lines = list(setup)
    if planned is None:
        return lines
    return [
        f"python_before=\"{_WHICH_PYTHON}\"",
        *lines,
        "# The interpreter: the `python` the set-up lines above put on PATH if they changed it, else the",
        "# one the job was planned with.",
        f"{PYTHON_VAR}={q(planned)}",
        f"python_now=\"{_WHICH_PYTHON}\"",
        "if [ -n \"$python_now\" ] && [ \"$python_now\" != \"$python_before\" ]; then",
        f"    {PYTHON_VAR}=\"$python_now\"",
        "fi",
        f"echo \"diffscale: python ${PYTHON_VAR}\"",
    ]


def python_word(spec_python: str, chosen: bool) -> str:
    """How a script names the interpreter: ``"$job_python"`` where it picks one, else the path quoted."""
    return f"\"${PYTHON_VAR}\"" if chosen else q(spec_python)


def preamble(run_dir: str, greeting: str, race: RaceSpec | None, cancel_command: str, setup: Iterable[str],
             env: Iterable[tuple[str, str]], claim: Callable[[str, tuple[str, ...], str], str],
             command_env: Iterable[tuple[str, str]] = (), python: str | None = None) -> list[str]:
    """The lines every job script starts with after its directives: strict mode, the run
    directory, a greeting, the race claim (when racing), the command's variables and the
    site set-up (whose env may override them). ``python``: the planned interpreter, where the
    script picks the one its set-up puts on PATH (``python_choice``)."""
    lines = [
        "",
        "# No `set -e`: the script inspects the training's exit code itself.",
        "set -uo pipefail",
        f"RUN_DIR={q(run_dir)}",
        "cd \"$RUN_DIR\" || exit 2",
        greeting,
    ]
    if race:
        lines += ["", claim(race.key, race.rivals, cancel_command)]
    own = command_exports(command_env)
    if own:
        lines += [""] + own
    site = site_setup(python_choice(python, setup), env)
    if site:
        lines += [""] + site
    return lines


def outside_stop(directory: str | None) -> list[str]:
    """Before a coupled simulation's command starts: note a stop from outside, so the end marker
    says only how the command ended by itself."""
    if directory is None:
        return []
    return [
        "# A stop from outside (scancel, the time limit: SIGTERM) is the scheduler's to tell: the trainer",
        "# asks it how this job ended (job.json in the spool names the job). The end marker below says",
        "# only how the command ended by itself.",
        "stopped=0",
        "trap 'stopped=1' TERM",
    ]


def end_marker(directory: str | None) -> list[str]:
    """Lines that write a spool's end marker (tasks/fields/spool.py, ``ended.json``) with the
    command's exit status ``$rc``, atomically, unless the job was stopped from outside
    (``outside_stop``'s trap, or the command itself ended by SIGTERM, 143: SLURM signals the step
    and the batch shell apart, so the step can end before the shell's trap has run): the trainer
    following the spool then ends once it has read the files before it."""
    if directory is None:
        return []
    final = q(f"{directory.rstrip('/')}/{SPOOL_END_NAME}")
    tmp = q(f"{directory.rstrip('/')}/.{SPOOL_END_NAME}.tmp")
    return [
        "# The simulation has ended: its end marker tells the trainer following the spool to finish",
        "# with what it has read (or, after a failure, to stop with this status).",
        "if [ \"$stopped\" -eq 0 ] && [ \"$rc\" -ne 143 ]; then  # 143: SIGTERM, a stop from outside",
        f"    printf '{{\"exit_status\": %d}}\\n' \"$rc\" > {tmp} && mv -f {tmp} {final} ||",
        "        echo \"diffscale: could not write the spool's end marker: the trainer will wait\" >&2",
        "fi",
        "",
    ]
