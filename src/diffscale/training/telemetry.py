"""Progress, metrics (JSON lines + TensorBoard) and the throughput meter. Rank 0 only.

One record per step, also across a kill: a run killed after its last checkpoint logged steps
it will train again on resume, so opening the metrics at ``start_step`` drops the training
records after it from metrics.jsonl and has TensorBoard purge them (``purge_step``). A
rollback within a run (:meth:`Telemetry.log` of a step already logged) does the same.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from diffscale.errors import UserError
from diffscale.io.atomic import write_text
from diffscale.io.rundir import gpu_summary
from diffscale.io.scores import summary
from diffscale.training.console_log import LoggedConsole

if TYPE_CHECKING:  # imported when TensorBoard is on (it may be missing or broken)
    from torch.utils.tensorboard import SummaryWriter

    from diffscale.config import RunConfig
    from diffscale.runtime.gpustats import GpuStats
    from diffscale.training.trackers import Tracker


def seconds_since_process_start() -> float:
    """How long this process has run. On Linux from its start in clock ticks since boot
    (``/proc/self/stat``) against the boot-time clock: psutil's ``create_time`` adds the boot time
    in whole seconds, up to 1 s off (a CPU job's first step: 148.0 s by it, 147.0 s timed by the
    parent that started it). Elsewhere psutil's."""
    try:
        after_name = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started = int(after_name[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime
        return time.clock_gettime(time.CLOCK_BOOTTIME) - started
    except (OSError, ValueError, IndexError, AttributeError):
        import psutil

        return time.time() - psutil.Process().create_time()


class ThroughputMeter:
    """Samples per second between two reports (wall clock, after the device has synced), and the
    share of that time the loop waited for its next batch."""

    def __init__(self) -> None:
        self._t = time.perf_counter()
        self._samples = 0
        self.window_s = 0.0
        """Wall seconds of the window the latest ``rate`` measured."""
        self.total_s = 0.0
        self.waited_s = 0.0
        """Totals over this invocation's windows, for the end summary."""

    def add(self, samples: int) -> None:
        self._samples += samples

    def rate(self) -> float:
        now = time.perf_counter()
        elapsed = max(now - self._t, 1e-9)
        rate = self._samples / elapsed
        self._t, self._samples = now, 0
        self.window_s = elapsed
        self.total_s += elapsed
        return rate

    def wait_share(self, waited_s: float) -> float:
        """Share of the latest window spent waiting ``waited_s`` seconds for data (call after ``rate``)."""
        self.waited_s += waited_s
        return min(waited_s / max(self.window_s, 1e-9), 1.0)

    def summary(self) -> str:
        """``data wait: 0.8 % of the training time (...)`` over this invocation, or '' before a window."""
        if self.total_s <= 0:
            return ""
        return (f"data wait: {self.waited_s / self.total_s:.1%} of the training time ({self.waited_s:.1f} s of "
                f"{self.total_s:.0f} s waiting for the next batch)")


class Telemetry:
    """Writes metrics.jsonl, TensorBoard scalars and preview images (and the same to the
    optional trackers), and shows progress (rich bar on a TTY, a plain line per report in batch
    logs). With ``gpus``, each record carries the GPUs' utilisation and memory (NVML)."""

    def __init__(self, run_dir: Path, *, enabled: bool, total_steps: int, start_step: int,
                 console: Console | None = None, tensorboard: bool = True, gpus: GpuStats | None = None,
                 trackers: list[Tracker] | None = None) -> None:
        self.enabled = enabled
        self._gpus = gpus
        self._trackers = trackers or []
        self.console = console or Console(stderr=False)
        self._path = Path(run_dir) / "metrics.jsonl"
        self._tb_dir = Path(run_dir) / "tb"
        self._jsonl: TextIO | None = None
        self._tb: SummaryWriter | None = None
        self._tensorboard = tensorboard
        self._last_step = start_step
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        if not enabled:
            return
        self._open(start_step)
        if self.console.is_terminal and self.console.file.isatty():
            self._progress = Progress(
                TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                TimeElapsedColumn(), TimeRemainingColumn(), console=self.console, transient=False,
            )
            self._task = self._progress.add_task("train", total=total_steps, completed=start_step, info="")
            self._progress.start()

    def _open(self, after_step: int) -> None:
        """Open metrics.jsonl and TensorBoard with nothing logged after ``after_step``."""
        _truncate_after(self._path, after_step)
        self._jsonl = open(self._path, "a", buffering=1)
        if self._tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                # purge_step hides the events at and after it that an earlier writer left
                _after_earlier_event_files(self._tb_dir, self.console)
                self._tb = SummaryWriter(log_dir=str(self._tb_dir), purge_step=after_step + 1)
            except Exception as exc:  # TensorBoard missing or broken: metrics.jsonl still has everything
                self.console.print(f"[yellow]warning: TensorBoard disabled ({exc})[/]")

    def log(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        step = record["step"]
        if step <= self._last_step:  # rolled back to an earlier checkpoint: those steps are trained again
            self._close_files()
            self._open(step - 1)
        self._last_step = step
        gpus = self._gpus.read() if self._gpus is not None else {}
        record = {**record, **gpus}
        self._write_line(record)
        numbers = {k: v for k, v in record.items() if k != "step" and isinstance(v, (int, float))
                   and not isinstance(v, bool)}
        if self._tb is not None:
            for key, value in numbers.items():
                self._tb.add_scalar(f"{'gpu' if key in gpus else 'train'}/{key}", value, step)
        for tracker in self._trackers:
            tracker.log(numbers, step)
        info = f"loss {record['loss']:.4f}  {record['samples_per_s']:.0f} samples/s"
        if record.get("restores"):
            info += f"  restores {record['restores']}"
        if gpus:
            info += f"  {gpu_summary(gpus)}"
        wait = f"  data wait {record['data_wait_share']:.0%}" if "data_wait_share" in record else ""
        line = (f"step {record['step']}/{record.get('total_steps', '?')}  {info}  lr {record['lr']:.2e}  "
                f"eta {record.get('eta_s', 0):.0f}s{wait}")
        if self._progress is not None:
            assert self._task is not None  # added with the progress bar
            self._progress.update(self._task, completed=record["step"], info=info)
            if isinstance(self.console, LoggedConsole):  # the bar is redrawn in place: the log gets the line
                self.console.run_log.print(line, highlight=False)
        else:
            self.console.print(line, highlight=False)

    def images(self, paths: list[Path], step: int) -> None:
        """Preview grids (PNG) into TensorBoard's Images tab (``samples/NAME``) and the trackers."""
        if not self.enabled:
            return
        for path in (p for p in paths if p.suffix == ".png"):
            if self._tb is not None:
                import numpy as np
                from PIL import Image

                with Image.open(path) as picture:
                    pixels = np.asarray(picture.convert("RGB"))
                self._tb.add_image("samples/preview", pixels, step, dataformats="HWC")
            for tracker in self._trackers:
                tracker.image(path, step)

    def evaluation(self, scores: dict[str, float], step: int, about: dict[str, Any]) -> None:
        """Quality metrics at ``step``: a ``kind: eval`` line in metrics.jsonl (with ``about``, how
        the samples were drawn; kept by a resume's clean-up of later training records), ``eval/NAME``
        scalars in TensorBoard and the trackers."""
        if not self.enabled:
            return
        self._write_line({"kind": "eval", "step": step, **about, **scores, "time": time.time()})
        if self._tb is not None:
            for key, value in scores.items():
                self._tb.add_scalar(f"eval/{key}", value, step)
        for tracker in self._trackers:
            tracker.log({f"eval/{k}": v for k, v in scores.items()}, step)
        said = summary(scores) or "  ".join(f"{k} {v:.4g}" for k, v in scores.items())
        self.console.print(f"eval at step {step}: {said}", highlight=False, markup=False)

    def divergence(self, record: dict[str, Any]) -> None:
        """The divergence guard went back to an earlier state: a ``kind: divergence`` line in
        metrics.jsonl (kept when the steps after it are trained again) and ``train/restores`` in
        TensorBoard and the trackers at the step it diverged."""
        if not self.enabled:
            return
        self._write_line(record)
        if self._tb is not None:
            self._tb.add_scalar("train/restores", record["restore"], record["step"])
            self._tb.add_text("train/divergence", f"step {record['step']}: {record['why']}; back to step "
                              f"{record['restored_step']}, learning rate {record['lr']:.2e}", record["step"])
        for tracker in self._trackers:
            tracker.log({"train/restores": record["restore"]}, record["step"])

    def event(self, record: dict[str, Any]) -> None:
        """A record that is not a training report (waiting for data, a skipped file): metrics.jsonl
        only, with a ``kind``, so a resume's clean-up of later training records keeps it."""
        if not self.enabled:
            return
        assert "kind" in record
        self._write_line(record)

    def _write_line(self, record: dict[str, Any]) -> None:
        """One JSON line in metrics.jsonl; a full disk is one clear error, the checkpoints untouched."""
        assert self._jsonl is not None
        try:
            self._jsonl.write(json.dumps(record) + "\n")
        except OSError as exc:
            raise UserError(f"could not write {self._path} at step {record.get('step', '?')} ({exc.strerror})",
                            "free space there (df -h), then continue with --resume auto from the newest "
                            "checkpoint") from exc

    def _close_files(self) -> None:
        """Close both writers; a flush the disk refuses (full) is a warning, not a second error
        that would hide the first one (close runs in the loop's ``finally``)."""
        for name in ("_tb", "_jsonl"):
            writer = getattr(self, name)
            setattr(self, name, None)
            if writer is None:
                continue
            try:
                writer.close()
            except OSError as exc:
                self.console.print(f"warning: metrics not completely written ({exc.strerror})", highlight=False)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        self._close_files()
        trackers, self._trackers = self._trackers, []
        for tracker in trackers:
            tracker.close()
        if self._gpus is not None:
            self._gpus.close()
            self._gpus = None


def open_telemetry(run_dir: Path, cfg: RunConfig, *, main: bool, on_gpu: bool, start_step: int,
                   console: Console) -> Telemetry:
    """The run's telemetry: on rank 0 with NVML readings where there are GPUs and the trackers
    the config turns on, after recording the system this invocation runs on (``system.json``)."""
    if not main:
        return Telemetry(run_dir, enabled=False, total_steps=cfg.train.steps, start_step=start_step, console=console)
    from diffscale.runtime.gpustats import open_gpu_stats
    from diffscale.runtime.sysinfo import write_system
    from diffscale.training.trackers import open_trackers

    write_system(Path(run_dir) / "system.json")
    gpus = open_gpu_stats(on_gpu, lambda text: console.print(text, highlight=False, markup=False))
    return Telemetry(run_dir, enabled=True, total_steps=cfg.train.steps, start_step=start_step, console=console,
                     gpus=gpus, trackers=open_trackers(cfg.logging, Path(run_dir), cfg.to_dict()))


def record_evaluation(run_dir: Path, cfg: RunConfig, scores: Mapping[str, Any], step: int,
                      say: Callable[[str], None]) -> None:
    """A ``diffscale eval``'s numeric scores as ``eval/NAME`` at ``step`` in the run's TensorBoard
    and the trackers its config turns on, beside the evaluations made while it trained. Neither
    stops the evaluation, already in metrics.jsonl: a failure is said."""
    numbers = {k: float(v) for k, v in scores.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    try:
        from torch.utils.tensorboard import SummaryWriter

        with SummaryWriter(log_dir=str(Path(run_dir) / "tb")) as writer:
            for key, value in numbers.items():
                writer.add_scalar(f"eval/{key}", value, step)
    except Exception as exc:  # TensorBoard missing or broken: metrics.jsonl has the scores
        say(f"warning: the scores are not in TensorBoard ({exc})")
    from diffscale.training.trackers import open_trackers

    try:
        trackers = open_trackers(cfg.logging, Path(run_dir), cfg.to_dict())
    except UserError as exc:
        say(f"warning: the scores are not in the trackers: {exc.message}")
        return
    for tracker in trackers:
        tracker.log({f"eval/{k}": v for k, v in numbers.items()}, step)
        tracker.close()


def _event_file_second(name: str) -> int | None:
    """The creation second in a TensorBoard event file's name
    (``events.out.tfevents.SECONDS.HOST.PID.N``), or None for another file."""
    parts = name.split(".")
    if name.startswith("events.out.tfevents.") and len(parts) > 3 and parts[3].isdigit():
        return int(parts[3])
    return None


def _after_earlier_event_files(tb_dir: Path, console: Console, max_wait_s: float = 2.0) -> None:
    """Wait until a new event file's name sorts after every one already in ``tb_dir``.

    TensorBoard reads a directory's event files in name order, and the name starts with the
    second the writer was created. A run resumed in the same second its killed predecessor
    opened its writer (a tiny model logs ten steps in under a second) would sort by host and
    pid instead, so TensorBoard would apply the old file (and its purge) last and show the
    killed run's lost steps again. A later second settles it; a clock behind the newest file by
    more than ``max_wait_s`` (another node's clock on a shared file system) gets a warning."""
    if not tb_dir.is_dir():
        return
    seconds = [s for s in (_event_file_second(p.name) for p in tb_dir.iterdir()) if s is not None]
    if not seconds:
        return
    newest = max(seconds)
    deadline = time.monotonic() + max_wait_s
    while int(time.time()) <= newest and time.monotonic() < deadline:
        time.sleep(min(0.05, max(0.01, newest + 1 - time.time())))
    if int(time.time()) <= newest:
        console.print(f"warning: {tb_dir} holds an event file from {newest - int(time.time()) + 1} s in this "
                      "host's future (clocks differ between nodes?); TensorBoard may show steps a resume "
                      "replaced until the clocks agree", highlight=False)


def _truncate_after(path: Path, step: int) -> None:
    """Drop the training records after ``step`` (and a line cut by a kill) from a JSON-lines
    file, atomically; records of other kinds (``diffscale eval``) are kept."""
    if not path.is_file():
        return
    kept, dropped = [], False
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            dropped = True
            continue
        if isinstance(record, dict) and "kind" not in record and isinstance(record.get("step"), int) \
                and record["step"] > step:
            dropped = True
            continue
        kept.append(line)
    if dropped:
        write_text(path, "".join(f"{line}\n" for line in kept))
