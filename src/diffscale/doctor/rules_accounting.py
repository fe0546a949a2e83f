"""The scheduler's own accounting: which limit a job hit, and by how much.

``sacct -P -o JobID,State,ExitCode,MaxRSS,ReqMem,Elapsed,Timelimit`` (the sources wrap each
line in ``|``) and ``qacct -j`` records (``failed``, ``exit_status``, ``maxvmem``,
``ru_wallclock``, and the job's ``-l`` requests in ``category``). sacct's MaxRSS is the
largest task of a step, not the node's sum: the figure says so.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from diffscale.doctor.rules import TextRule

_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def size_bytes(text: str) -> int | None:
    """``251.30G``, ``4000M``, ``256Gn`` (per node), ``4Gc`` (per CPU), ``1.1M``, and qacct's
    ``291.723MB`` / ``0.000B`` -> bytes."""
    m = re.fullmatch(r"([\d.]+)([KMGT]?)(?:i?B)?[nc]?", text.strip(), re.I)
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()]) if m else None


def seconds(text: str) -> int | None:
    """``2-00:00:12``, ``05:13``, ``00:05:13``, ``172802s``, ``172802.0`` -> seconds."""
    text = text.strip().removesuffix("s")
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return int(float(text))
    m = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", text)
    if not m:
        return None
    d, h, mi, s = (int(x) if x else 0 for x in m.groups())
    return ((d * 24 + h) * 60 + mi) * 60 + s


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def _sacct(values: Mapping[str, str], lines: Sequence[str], index: int) -> Mapping[str, str] | None:
    rows = [ln.strip()[1:-1].split("|") for ln in lines if ln.strip().startswith("|")]
    rows = [r for r in rows if len(r) >= 7]
    job = next((r for r in rows if "." not in r[0]), rows[0] if rows else None)
    if job is None:
        return None
    state = job[1].split()[0]
    if state in ("OUT_OF_MEMORY",) or any(r[1].startswith("OUT_OF_MEMORY") for r in rows):
        asked = size_bytes(job[4])
        peaks = [(size_bytes(r[3]) or 0, r[0]) for r in rows if r[3]]
        peak, step = max(peaks, default=(0, "?"))
        share = f" = {peak / asked:.0%} of it" if asked and peak else ""
        asked_text = _gib(asked) if asked else "unknown"
        return {"what": f"the memory limit: ReqMem {asked_text} ({job[4]}), largest task MaxRSS {_gib(peak)} "
                        f"(step {step}){share}; a step's MaxRSS is its largest task, and the tasks of a node "
                        "share the limit",
                "advice": "ask for more memory (--mem) or use less per node: fewer ranks or loader workers per "
                          "node (`diffscale probe` measures one rank; plan checks ranks x workers against --mem)"}
    if state == "TIMEOUT":
        used, limit = seconds(job[5]), seconds(job[6])
        over = f", {used - limit} s past it" if used is not None and limit is not None and used >= limit else ""
        return {"what": f"the time limit: Elapsed {job[5]} of Timelimit {job[6]}{over}",
                "advice": "checkpoint on a warning signal and continue in the next job (diffscale submit does), "
                          "or ask for more --time"}
    return None


def _qacct(values: Mapping[str, str], lines: Sequence[str], index: int) -> Mapping[str, str] | None:
    f: dict[str, str] = {}
    for ln in lines:
        parts = ln.split(None, 1)
        if len(parts) == 2:
            f[parts[0]] = parts[1].strip()
    failed = f.get("failed", "0").split()[0]
    code = f.get("exit_status", "0").split()[0]
    if failed == "0" and code == "0":
        return None
    asked = dict(re.findall(r"(h_vmem|h_rt|s_rt|mem_free)=([^,\s]+)", f.get("category", "")))
    peak, vlimit = size_bytes(f.get("maxvmem", "")), size_bytes(asked.get("h_vmem", ""))
    wall, tlimit = seconds(f.get("ru_wallclock", "")), seconds(asked.get("h_rt", ""))
    said = [f"failed {f.get('failed', '?')}", f"exit_status {code}"]
    if peak is not None:
        said.append(f"maxvmem {_gib(peak)}" + (f" of h_vmem {_gib(vlimit)} ({peak / vlimit:.0%})" if vlimit else ""))
    if wall is not None:
        said.append(f"ran {wall} s" + (f" of h_rt {tlimit} s" if tlimit else ""))
    if vlimit and peak is not None and peak >= 0.95 * vlimit:
        what = "the memory limit (h_vmem)"
        advice = "ask for a larger -l h_vmem (per slot) or use less memory: fewer loader workers or ranks per host"
    elif (tlimit and wall is not None and wall >= tlimit) or (failed == "37" and not vlimit):
        what = "the time limit (h_rt)"
        advice = "ask for a longer -l h_rt, or checkpoint on the s_rt warning and continue (diffscale submit does)"
    elif code == "137":
        what = "a SIGKILL without a scheduler limit reached: most often the kernel's OOM killer"
        advice = ("ask for more memory (-l h_vmem / mem_free) or use less: fewer loader workers or ranks per host "
                  "(`diffscale probe` measures one rank)")
    else:
        what = "no limit of the scheduler's: the command itself failed"
        advice = "read the job's log for the command's own error (diffscale doctor RUN_DIR)"
    return {"what": f"{what} -- {', '.join(said)}", "advice": advice}


TEXT_RULES: tuple[TextRule, ...] = (
    TextRule(
        "sacct-limit", "the scheduler's accounting: a limit was hit",
        (r"^\|[\d_]+\|(?:OUT_OF_MEMORY|TIMEOUT)",),
        "SLURM's accounting (sacct) shows which limit ended the job: {what}",
        "{advice}",
        derive=_sacct,
    ),
    TextRule(
        "qacct-limit", "Grid Engine's accounting of the job",
        (r"^exit_status\s+\d+",),
        "Grid Engine's accounting (qacct) shows {what}",
        "{advice}",
        requires=(r"^failed\s+\d+",),
        derive=_qacct,
    ),
)
