"""What a process tree uses, read from Linux's /proc: one sample at a time, peaks kept.

Memory per process is PSS and USS from ``/proc/PID/smaps_rollup`` (Linux >= 4.14) where the
kernel provides it, else RSS from ``/proc/PID/status``. PSS divides every shared page among
the processes that map it, so the sum over a tree counts pages a forked loader worker shares
copy-on-write with its rank once, not once per process; USS is what a process alone holds
(what freeing it would return). RSS counts shared pages in every process that maps them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

PROC = Path("/proc")
MEASURE_PSS = "PSS (/proc/PID/smaps_rollup)"
MEASURE_RSS = "RSS (/proc/PID/status; this kernel gives no smaps_rollup: shared pages count in every process)"


@dataclass(frozen=True)
class ProcSample:
    pid: int
    ppid: int
    name: str
    cmdline: str
    rss: int
    pss: int | None
    uss: int | None
    threads: int

    @property
    def memory(self) -> int:
        """The figure the probe reports: PSS where the kernel gives it, else RSS."""
        return self.pss if self.pss is not None else self.rss


def _kib_fields(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0].endswith(":") and parts[1].isdigit():
            out[parts[0][:-1]] = int(parts[1]) * 1024
    return out


def read_process(pid: int, proc: Path = PROC) -> ProcSample | None:
    """One process's memory and threads now; None when it is gone (or not ours to read)."""
    base = proc / str(pid)
    try:
        status = (base / "status").read_text()
        cmdline = (base / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None
    fields = _kib_fields(status)
    named = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    pss = uss = None
    try:
        rollup = _kib_fields((base / "smaps_rollup").read_text())
        pss = rollup.get("Pss")
        uss = rollup.get("Private_Clean", 0) + rollup.get("Private_Dirty", 0) if pss is not None else None
    except OSError:
        pass
    return ProcSample(pid=pid, ppid=int(named.get("PPid", "0").strip() or 0), name=named.get("Name", "?").strip(),
                      cmdline=cmdline, rss=fields.get("VmRSS", 0), pss=pss, uss=uss,
                      threads=int(named.get("Threads", "1").strip() or 1))


def tree_pids(root: int, proc: Path = PROC) -> list[int]:
    """``root`` and every descendant alive now (parents before children)."""
    children: dict[int, list[int]] = {}
    for entry in proc.iterdir() if proc.is_dir() else []:
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])  # the name in (...) may hold spaces
        children.setdefault(ppid, []).append(int(entry.name))
    order, todo = [], [root]
    while todo:
        pid = todo.pop(0)
        order.append(pid)
        todo.extend(sorted(children.get(pid, [])))
    return order


@dataclass
class ProcPeak:
    """The largest figures one process showed over the samples."""

    pid: int
    ppid: int
    cmdline: str
    rss: int = 0
    pss: int | None = None
    uss: int | None = None
    threads: int = 0
    samples: int = 0

    def add(self, s: ProcSample) -> None:
        self.rss = max(self.rss, s.rss)
        self.pss = s.pss if self.pss is None else max(self.pss, s.pss or 0)
        self.uss = s.uss if self.uss is None else max(self.uss, s.uss or 0)
        self.threads = max(self.threads, s.threads)
        self.samples += 1

    @property
    def memory(self) -> int:
        return self.pss if self.pss is not None else self.rss


@dataclass
class TreeWatch:
    """Samples of one process tree: per-process peaks and the tree's peak sum and threads."""

    root: int
    proc: Path = PROC
    peaks: dict[int, ProcPeak] = field(default_factory=dict)
    tree_peak: int = 0
    """Largest sum of the tree's memory (PSS, else RSS) seen in one sample."""
    threads_peak: int = 0
    """Largest number of threads of the whole tree in one sample."""
    pss_seen: bool = False
    rss_only_seen: bool = False
    alive: list[frozenset[int]] = field(default_factory=list)
    """The pids of every sample (which processes ran at the same time)."""

    def sample(self) -> list[ProcSample]:
        got = [s for pid in tree_pids(self.root, self.proc) if (s := read_process(pid, self.proc)) is not None]
        if any(s.pss is not None for s in got):
            self.pss_seen = True
        if self.pss_seen:
            # The kernel gives PSS: a process without it in this sample was exiting (its smaps_rollup
            # already gone). Its RSS would mix the two measures and flip the label: left out.
            got = [s for s in got if s.pss is not None]
        else:
            self.rss_only_seen = self.rss_only_seen or bool(got)
        for s in got:
            self.peaks.setdefault(s.pid, ProcPeak(s.pid, s.ppid, s.cmdline)).add(s)
        self.alive.append(frozenset(s.pid for s in got))
        if got:
            self.tree_peak = max(self.tree_peak, sum(s.memory for s in got))
            self.threads_peak = max(self.threads_peak, sum(s.threads for s in got))
        return got

    def most_at_once(self, pids: list[int]) -> int:
        """The most of ``pids`` alive in one sample."""
        wanted = set(pids)
        return max((len(wanted & sample) for sample in self.alive), default=0)

    @property
    def measure(self) -> str:
        """PSS once any sample had it (the kernel gives smaps_rollup), else RSS."""
        return MEASURE_PSS if self.pss_seen else MEASURE_RSS


def main_process(peaks: dict[int, ProcPeak], root: int) -> int:
    """The rank's own process: the root, or below a launcher wrapper (``bash -c``, ``uv run``,
    ``srun``...) that holds little memory and started exactly one child, that child."""
    pid = root
    while True:
        kids = [p for p in peaks.values() if p.ppid == pid]
        here = peaks.get(pid)
        if len(kids) == 1 and here is not None and here.memory < 64 * 2**20 and kids[0].memory > here.memory:
            pid = kids[0].pid
            continue
        return pid


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1
