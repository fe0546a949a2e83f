"""Progress, metrics (JSON lines + TensorBoard) and the throughput meter. Rank 0 only."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


class ThroughputMeter:
    """Samples per second between two reports (wall clock, after the device has synced)."""

    def __init__(self) -> None:
        self._t = time.perf_counter()
        self._samples = 0

    def add(self, samples: int) -> None:
        self._samples += samples

    def rate(self) -> float:
        now = time.perf_counter()
        elapsed = max(now - self._t, 1e-9)
        rate = self._samples / elapsed
        self._t, self._samples = now, 0
        return rate


class Telemetry:
    """Writes metrics.jsonl and TensorBoard scalars, and shows progress (rich bar on a TTY,
    a plain line per report in batch logs)."""

    def __init__(self, run_dir: Path, *, enabled: bool, total_steps: int, start_step: int,
                 console: Console | None = None, tensorboard: bool = True) -> None:
        self.enabled = enabled
        self.console = console or Console(stderr=False)
        self._jsonl = None
        self._tb = None
        self._progress: Progress | None = None
        self._task = None
        if not enabled:
            return
        self._jsonl = open(Path(run_dir) / "metrics.jsonl", "a", buffering=1)
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(log_dir=str(Path(run_dir) / "tb"))
            except Exception as exc:  # TensorBoard missing or broken: metrics.jsonl still has everything
                self.console.print(f"[yellow]warning: TensorBoard disabled ({exc})[/]")
        if self.console.is_terminal and sys.stdout.isatty():
            self._progress = Progress(
                TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                TimeElapsedColumn(), TimeRemainingColumn(), console=self.console, transient=False,
            )
            self._task = self._progress.add_task("train", total=total_steps, completed=start_step, info="")
            self._progress.start()

    def log(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        assert self._jsonl is not None
        self._jsonl.write(json.dumps(record) + "\n")
        if self._tb is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)):
                    self._tb.add_scalar(f"train/{key}", value, record["step"])
        info = f"loss {record['loss']:.4f}  {record['samples_per_s']:.0f} samples/s"
        if self._progress is not None:
            self._progress.update(self._task, completed=record["step"], info=info)
        else:
            self.console.print(f"step {record['step']}/{record.get('total_steps', '?')}  {info}  lr {record['lr']:.2e}  "
                               f"eta {record.get('eta_s', 0):.0f}s", highlight=False)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
