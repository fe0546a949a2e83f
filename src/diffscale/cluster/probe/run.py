"""``diffscale probe``: run a user's command for a bounded time and measure what one rank uses.

The command runs here (a login node's CPU, or the GPU node of a short probe job) in a
session of its own; every SAMPLE_S the probe reads its process tree from /proc (peak PSS/USS
or RSS per process, threads), asks NVML for the tree's GPU memory, and reads what the
command prints for progress lines (steps/s). At ``seconds`` it stops the whole session
(SIGTERM, then SIGKILL after STOP_GRACE_S). What it prints goes to RUN_DIR/probe.log.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path

from diffscale.cluster.probe import procfs
from diffscale.cluster.probe.nvml import GpuWatch
from diffscale.cluster.probe.result import ProbeResult, ProcFigure, Progress, parse_progress
from diffscale.errors import UserError

SAMPLE_S = 0.25
STOP_GRACE_S = 5.0
MIN_SECONDS = 5
MAX_SECONDS = 1800
"""A probe measures start-up and the first steps; a login node is no place for longer runs."""
AT_ONCE_S = 2.0
"""A command that ends within this long left nothing to measure."""


class _Output:
    """Reads the command's stdout+stderr (tqdm redraws with \\r: both end a line) into a log,
    keeping the last lines and the last progress line."""

    def __init__(self, stream: object, log: Path) -> None:
        self.last: deque[str] = deque(maxlen=5)
        self.progress: Progress | None = None
        self.bytes = 0
        self._stream = stream
        self._log = log
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        pending = b""
        fd = self._stream.fileno()  # type: ignore[attr-defined]
        try:
            with open(self._log, "ab") as log:
                while chunk := os.read(fd, 65536):
                    self.bytes += len(chunk)
                    log.write(chunk)
                    log.flush()
                    *lines, pending = re.split(rb"[\r\n]", pending + chunk)
                    for raw in lines:
                        self._line(raw.decode(errors="replace"))
                if pending:
                    self._line(pending.decode(errors="replace"))
        finally:
            self._stream.close()  # type: ignore[attr-defined]

    def _line(self, line: str) -> None:
        if not line.strip():
            return
        self.last.append(line.strip()[:200])
        found = parse_progress(line)
        if found is not None:
            self.progress = found

    def join(self) -> None:
        self._thread.join(timeout=5)


def check_seconds(seconds: int) -> None:
    if not MIN_SECONDS <= seconds <= MAX_SECONDS:
        raise UserError(f"--seconds {seconds} is out of range: a probe runs {MIN_SECONDS} to {MAX_SECONDS} s",
                        "pass e.g. --seconds 60 (enough for start-up and the first steps)")


def _start(argv: Sequence[str], log: Path) -> subprocess.Popen:
    exe = argv[0]
    if os.sep not in exe and shutil.which(exe) is None:
        raise UserError(f"command '{exe}' not found: it is not on PATH",
                        "check the spelling, activate the environment it lives in, or give its full path")
    if os.sep in exe and not os.path.exists(exe):  # refused before RUN_DIR is made
        raise UserError(f"command '{exe}' not found", "give the path of an existing program")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    log.parent.mkdir(parents=True, exist_ok=True)
    try:
        return subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=env)
    except FileNotFoundError as exc:
        raise UserError(f"command '{exe}' not found", "give the path of an existing program") from exc
    except PermissionError as exc:
        raise UserError(f"command '{exe}' cannot be run (permission denied)",
                        f"make it executable (chmod +x {exe}) or run it through its interpreter") from exc


def _stop(proc: subprocess.Popen) -> list[str]:
    """End the command's whole session; a note when it had to be killed."""
    if proc.poll() is not None:
        _kill_group(proc.pid, signal.SIGKILL)  # workers it left behind
        return []
    _kill_group(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_GRACE_S)
        _kill_group(proc.pid, signal.SIGKILL)
        return []
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid, signal.SIGKILL)
        proc.wait()
        return [f"the command did not stop within {STOP_GRACE_S:g} s of SIGTERM and was killed"]


def _kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def run_probe(argv: Sequence[str], seconds: int, log: Path) -> ProbeResult:
    """Run ``argv`` for at most ``seconds`` and measure it (see the module docstring)."""
    check_seconds(seconds)
    proc = _start(argv, log)
    assert proc.stdout is not None
    output = _Output(proc.stdout, log)
    watch, gpu = procfs.TreeWatch(proc.pid), GpuWatch()
    t0 = time.monotonic()
    try:
        while proc.poll() is None and time.monotonic() - t0 < seconds:
            gpu.sample(s.pid for s in watch.sample())
            time.sleep(SAMPLE_S)
        ran = time.monotonic() - t0
        ended = "exited" if proc.poll() is not None else "limit"
        notes = _stop(proc)
    finally:
        if proc.poll() is None:
            _kill_group(proc.pid, signal.SIGKILL)
            proc.wait()
        gpu.close()
    output.join()
    _refuse_useless(argv, proc.returncode if ended == "exited" else None, ran, output, seconds)
    return _result(argv, seconds, ran, ended, proc.returncode if ended == "exited" else None, watch, gpu,
                   output, notes)


def _refuse_useless(argv: Sequence[str], code: int | None, ran: float, output: _Output, seconds: int) -> None:
    """A run that measured nothing worth planning with is one error line, not a probe.json."""
    last = f"; its last line: {output.last[-1]!r}" if output.last else "; it printed nothing"
    if code is not None and code != 0:
        raise UserError(f"the command failed (exit {code} after {ran:.1f} s){last}",
                        "run it by hand until it trains, then probe it again")
    if code is not None and ran < AT_ONCE_S:
        raise UserError(f"the command exited at once (exit 0 after {ran:.1f} s){last}: nothing to measure",
                        "probe the training command itself (it must run for a while)")
    if output.bytes == 0:
        raise UserError(f"the command printed nothing in {ran:.0f} s: no progress line to take steps/s from, "
                        "so no probe.json was written",
                        f"let it print progress (Lightning's bar, tqdm) or pass a longer --seconds than {seconds}")


def _figure(peak: procfs.ProcPeak) -> ProcFigure:
    return ProcFigure(pid=peak.pid, cmdline=peak.cmdline[:300], memory_bytes=peak.memory, rss_bytes=peak.rss,
                      pss_bytes=peak.pss, uss_bytes=peak.uss, threads=peak.threads)


def _result(argv: Sequence[str], seconds: int, ran: float, ended: str, code: int | None, watch: procfs.TreeWatch,
            gpu: GpuWatch, output: _Output, notes: list[str]) -> ProbeResult:
    if not watch.peaks:
        raise UserError("the command ended before the probe could read it from /proc",
                        "probe a command that runs for a while (its training), on Linux")
    main = procfs.main_process(watch.peaks, watch.root)
    below = _descendants(watch.peaks, main)
    workers = tuple(_figure(watch.peaks[p]) for p in below)
    at_once = watch.most_at_once(below)
    gpu_note = ("measured through NVML" if gpu.available else f"not measured: {gpu.why_not}")
    if output.progress is None:
        notes.append("no training step seen (no progress line from tqdm / Lightning): steps/s unknown, and the "
                     "memory figures may be start-up's (imports, data loading, compiling), not training's steady "
                     "state; probe for longer (--seconds) with progress printed")
    return ProbeResult(command=tuple(argv), seconds=seconds, ran_s=round(ran, 2), ended=ended, exit_code=code,
                       measure=watch.measure, main=_figure(watch.peaks[main]), workers=workers,
                       workers_at_once=at_once, tree_peak_bytes=watch.tree_peak, threads_peak=watch.threads_peak,
                       gpu_bytes=gpu.peak_bytes if gpu.available else None, gpu_name=gpu.name, gpu_note=gpu_note,
                       steps_per_s=output.progress.steps_per_s if output.progress else None,
                       progress_line=output.progress.line if output.progress else None, host=socket.gethostname(),
                       cpus=procfs.cpu_count(), notes=tuple(notes))


def _descendants(peaks: dict[int, procfs.ProcPeak], root: int) -> list[int]:
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        kids = sorted(p.pid for p in peaks.values() if p.ppid == pid)
        out += kids
        todo += kids
    return sorted(out)

