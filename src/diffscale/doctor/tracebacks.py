"""Python tracebacks and last errors in a log: what the doctor says when no signature of a
known cluster or training failure matches.

Logs of multi-rank jobs interleave the ranks' lines; each rank's lines (by their launcher
prefix, ``[rank3]:`` or ``3: ``) are read as a stream of their own. The traceback reported is
the last one in the log that is not a launcher's summary of a worker's failure (torchrun's
ChildFailedError comes after the worker's own traceback, which holds the cause).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from diffscale.doctor.rules import RANK_PREFIX, Finding

PYTHON_TRACEBACK = "python-traceback"

_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')
_EXCEPTION = re.compile(r"^(?P<type>[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning|Failure)|"
                        r"[A-Za-z_][\w.]*\.[A-Z]\w*)(?::\s?(?P<message>.*))?$")
_LAST_ERROR = re.compile(r"^(?:[A-Za-z_][\w.]*(?:Error|Exception)\b:?|(?:[\w.-]+: )?error: |FATAL|Fatal error)")
# The launcher's echo of a rank's exit, not the rank's own error.
_LAUNCHER_NOISE = re.compile(r"^(?:srun: error: \S+: tasks? [\d,-]+: (?:Exited|Killed)|srun: (?:Terminating|"
                             r"error: Timed out waiting)|slurmstepd: error: \*\*\* STEP)")
_WRAPPERS = ("ChildFailedError",)  # launchers' summaries of a worker's failure, not the failure
_LIBRARY = ("site-packages", "dist-packages", "/lib/python", "<frozen", "<string>")


@dataclass(frozen=True)
class Frame:
    path: str
    line: int
    func: str


@dataclass(frozen=True)
class Traceback:
    frames: tuple[Frame, ...]
    type: str
    message: str
    end: int
    """Index (in the whole text) of the exception's line."""
    evidence: str

    @property
    def raised_in(self) -> Frame | None:
        return self.frames[-1] if self.frames else None

    @property
    def user_frame(self) -> Frame | None:
        """The innermost frame of the program's own code (not a library's)."""
        return next((f for f in reversed(self.frames) if not any(part in f.path for part in _LIBRARY)), None)

    def summary(self) -> str:
        text = f"{self.type}: {self.message}" if self.message else self.type
        raised, mine = self.raised_in, self.user_frame
        if raised is not None:
            text += f" (raised in {raised.func}, {raised.path}:{raised.line}"
            if mine is not None and mine != raised:
                text += f"; last line of the program's own code: {mine.path}:{mine.line}, in {mine.func}"
            text += ")"
        return text


def _streams(lines: Sequence[str]) -> dict[str, list[tuple[int, str]]]:
    """Lines grouped by launcher prefix, each with its index in the whole text."""
    streams: dict[str, list[tuple[int, str]]] = {}
    for index, line in enumerate(lines):
        m = RANK_PREFIX.match(line)
        key = m.group(0).strip() if m else ""
        streams.setdefault(key, []).append((index, line[m.end():] if m else line))
    return streams


def _parse_stream(stream: list[tuple[int, str]]) -> list[Traceback]:
    found: list[Traceback] = []
    i = 0
    while i < len(stream):
        if not stream[i][1].startswith("Traceback (most recent call last):"):
            i += 1
            continue
        frames: list[Frame] = []
        j = i + 1
        while j < len(stream) and (stream[j][1].startswith(" ") or not stream[j][1].strip()):
            m = _FRAME.match(stream[j][1])
            if m:
                frames.append(Frame(m.group("path"), int(m.group("line")), m.group("func")))
            j += 1
        if j < len(stream) and (m := _EXCEPTION.match(stream[j][1].strip())):
            found.append(Traceback(tuple(frames), m.group("type"), (m.group("message") or "").strip()[:300],
                                   stream[j][0], stream[j][1].strip()[:300]))
        i = j
    return found


def tracebacks(text: str) -> list[Traceback]:
    """Every complete traceback of the text, in the order their exceptions appear."""
    lines = text.splitlines()
    found = [tb for stream in _streams(lines).values() for tb in _parse_stream(stream)]
    return sorted(found, key=lambda tb: tb.end)


def last_traceback(text: str) -> Traceback | None:
    found = tracebacks(text)
    causes = [tb for tb in found if not tb.type.endswith(_WRAPPERS)]
    return (causes or found)[-1] if found else None


def traceback_finding(origin: str, text: str) -> Finding | None:
    """The program's own exception, when no known signature explains the log."""
    tb = last_traceback(text)
    if tb is None:
        return None
    return Finding(
        PYTHON_TRACEBACK, "the program raised an exception", tb.summary(),
        "this is an error of the program, not of the cluster: fix it where the traceback points (the same "
        "command on a laptop or in an interactive job reproduces it); diffscale logs RUN_DIR shows the whole log",
        origin, tb.evidence, tb.end)


def last_error_line(text: str) -> str | None:
    """The last line that reads like an error (an exception, ``error: ...``), without a rank prefix."""
    for line in reversed(text.splitlines()):
        bare = RANK_PREFIX.sub("", line, count=1).strip()
        if _LAST_ERROR.match(bare) and not _LAUNCHER_NOISE.match(bare):
            return bare[:300]
    return None


def tail(text: str, count: int = 15) -> list[str]:
    """The last ``count`` non-empty lines."""
    return [line.rstrip()[:300] for line in text.splitlines() if line.strip()][-count:]
