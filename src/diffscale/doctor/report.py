"""The doctor's output: per finding its cause, fix and evidence; when nothing is recognised,
what was read, each log's last error and its last lines.

A terminal gets a panel per finding; a pipe or file gets the same words as plain
unwrapped lines, so they can be grepped and pasted into a ticket whole.
"""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.text import Text

from diffscale.doctor.signatures import Finding
from diffscale.doctor.sources import Evidence
from diffscale.doctor.tracebacks import last_error_line, tail


def _panel(f: Finding) -> Panel:
    body = Text()
    body.append("cause: ", style="bold")
    body.append(f.cause + "\n")
    body.append("fix:   ", style="bold green")
    body.append(f.fix + "\n")
    body.append(f"seen:  {f.origin}: {f.evidence}", style="dim")
    return Panel(body, title=Text(f.title, style="bold red"), title_align="left")


def print_report(target: str, ev: Evidence, findings: list[Finding], console: Console | None = None,
                 note: str | None = None) -> None:
    console = console or Console(highlight=False)
    out = console.print if console.is_terminal else (lambda s: print(s, file=console.file))
    read = ev.origins
    header = f"diffscale doctor: {target} ({len(read)} source{'s' if len(read) != 1 else ''} read)"
    out(escape(header) if console.is_terminal else header)
    if note:
        out(escape(note) if console.is_terminal else note)
    for f in findings:
        if console.is_terminal:
            console.print(_panel(f))
        else:
            out(f"{f.title}\n  cause: {f.cause}\n  fix:   {f.fix}\n  seen:  {f.origin}: {f.evidence}")
    if not findings:
        out("no known failure signature found in:")
        for origin in read or ["(nothing: no logs, metrics or scheduler records)"]:
            out(f"  {escape(origin) if console.is_terminal else origin}")
        for line in _unexplained(ev):
            out(escape(line) if console.is_terminal else line)
    for note in ev.skipped:
        out(f"not read: {note}")


def _unexplained(ev: Evidence, lines: int = 15) -> list[str]:
    """What a user would look for first when nothing is recognised: each log's last error
    (an exception, an ``error:`` line) and its last lines."""
    out: list[str] = []
    for origin, text in ev.texts:
        last = tail(text, lines)
        if not last:
            continue
        error = last_error_line(text)
        out.append(f"last error in {origin}: {error}" if error else f"no error line in {origin}")
        out.append(f"last {len(last)} lines of {origin}:")
        out += [f"  | {line}" for line in last]
    return out
