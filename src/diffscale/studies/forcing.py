"""A sweep's preflight refusals in its own words: a check's fix names the flags of ``diffscale
plan`` (``--mem 8``, ``--procs-per-node 2``), which a sweep file writes as ``cluster.`` keys; and the
checks a sweep goes ahead despite (``cluster.force``), each by its name."""

from __future__ import annotations

import re
from collections.abc import Iterable

from diffscale.errors import UserError, closest

FLAG_KEYS = {"--mem": "mem", "--time": "time", "--nodes": "nodes", "--gpus-per-node": "gpus_per_node",
             "--procs-per-node": "procs_per_node", "--cpus-per-task": "cpus_per_task", "--partition": "partition",
             "--account": "account", "--qos": "qos"}
"""plan's job flags -> the sweep file's cluster keys."""
_FLAG = re.compile(r"(?P<flag>--[a-z-]+)(?: (?P<value>[\w:.-]*\d[\w:.-]*))?")
_SET = re.compile(r"--set (?P<item>[\w.]+=[^\s,;)]+)")


def sweep_fix(fix: str, *, from_file: bool) -> str:
    """``fix`` with plan's flags as a sweep file's keys (``--mem 8`` -> ``cluster.mem: 8``,
    ``--set a.b=1`` -> ``base.set: [a.b=1]``); the short form's flags are kept as they are."""
    if not from_file:
        return fix

    def key(m: re.Match[str]) -> str:
        name = FLAG_KEYS.get(m.group("flag"))
        if name is None:
            return m.group(0)
        return f"cluster.{name}: {m.group('value')}" if m.group("value") else f"cluster.{name}"

    return _FLAG.sub(key, _SET.sub(lambda m: f"base.set: [{m.group('item')}]", fix))


def check_forced_names(forced: Iterable[str], names: set[str]) -> None:
    """Every name of ``cluster.force`` / ``--force-check`` is a check the plan makes."""
    for name in forced:
        if name.lower() not in names:
            raise UserError(f"cluster.force names '{name}', which is not a preflight check of this sweep"
                            f"{closest(name.lower(), sorted(names))}",
                            f"name checks as plan prints them: {', '.join(sorted(names))}")
