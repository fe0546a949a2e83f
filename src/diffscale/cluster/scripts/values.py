"""The one check of every value a job script carries, before a script is written.

Values in ``#SBATCH`` / ``#$`` lines are read by sbatch/qsub, not by a shell, and shlex
quoting does not help there: a line break ends the header (the lines after it run as
commands, and later directives such as ``--output`` or ``--requeue`` are dropped). So no
value of a script may hold a line break, carriage return or NUL, and names the scheduler
reads as one token (account, QOS, partition, job name) keep to :data:`TOKEN_CHARS`.
Free text outside the header (the run directory, the command and its arguments) is quoted by
the renderers and may hold anything, a line break included: it stays one literal word.
"""

from __future__ import annotations

import argparse

from diffscale.cluster.profiles.types import SAFE_NAME
from diffscale.cluster.scripts.jobspec import JobSpec
from diffscale.errors import UserError

LINE_BREAKS = "\n\r\0"
TOKEN_CHARS = "letters, digits and _ . + : = / @ , -"
"""What SAFE_NAME lets through, in words."""

JOB_FLAGS: tuple[tuple[str, str, bool, str], ...] = (
    ("account", "--account", True, "pass the account name alone"),
    ("qos", "--qos", True, "pass the QOS name alone"),
    ("partition", "--partition", True, "pass a partition name of the profile alone"),
    ("sim_partition", "--sim-partition", True, "pass a partition name of the profile alone"),
    ("setup", "--setup", False, "pass each line as its own --setup"),
    ("python", "--python", False, "pass the interpreter's path alone"),
)
"""(argument, flag, read as a token, fix) of each job flag whose value reaches a job script."""


def check_job_value(flag: str, value: str | None, *, token: bool = False, fix: str = "") -> None:
    """Refuse ``value`` of ``flag`` if a job script cannot carry it: a line break anywhere,
    or (``token``) a character outside TOKEN_CHARS in a name the scheduler reads as one word."""
    if value is None:
        return
    if any(c in value for c in LINE_BREAKS):
        raise UserError(f"{flag} {value!r} holds a line break", f"a job-script value is one line; {fix}")
    if token and not SAFE_NAME.match(value):
        raise UserError(f"{flag} {value!r} has characters a scheduler option cannot carry",
                        f"use {TOKEN_CHARS} only; {fix}")


def check_job_flags(args: argparse.Namespace) -> None:
    """Every job flag of plan, submit and probe (and their --couple / --partition auto forms)
    that reaches a script, checked before a profile is read or anything is written."""
    for name, flag, token, fix in JOB_FLAGS:
        value = getattr(args, name, None)
        for one in value if isinstance(value, list) else [value]:
            check_job_value(flag, one, token=token, fix=fix)


def check_spec(spec: JobSpec) -> None:
    """The same check on what a renderer takes, whatever built it (the CLI, the Python API,
    a profile): names as tokens, every other text of the header and set-up as one line."""
    fix = "fix the value in the cluster profile or the flag that set it"
    for field, value in (("account", spec.account), ("qos", spec.qos), ("partition", spec.partition),
                         ("job name", spec.job_name)):
        check_job_value(field, value, token=True, fix=fix)
    texts = [("python", spec.python), ("constraint", spec.constraint),
             ("gres type", spec.gres_type), ("script file", spec.script_file)]
    texts += [("set-up line", line) for line in spec.setup]
    texts += [(f"resource {name}", f"{name}={value}") for name, value in spec.resources]
    for field, text in texts:
        check_job_value(field, text, fix=fix)
