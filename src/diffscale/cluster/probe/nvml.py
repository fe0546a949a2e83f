"""GPU memory of a set of processes through NVML (``pynvml``, optional: ``pip install nvidia-ml-py``).

Without pynvml or an NVIDIA driver nothing is measured, and the reason is kept so that the
probe can say why its GPU figure is missing instead of reporting zero.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class GpuWatch:
    """Peak GPU memory used by the given processes, summed over every GPU they use."""

    def __init__(self) -> None:
        self.peak_bytes = 0
        self.name: str | None = None
        self.why_not: str | None = None
        self._nvml: Any = None
        self._handles: list[Any] = []
        try:
            import pynvml  # type: ignore[import-not-found,import-untyped,unused-ignore]
        except ImportError:
            self.why_not = "pynvml is not installed (pip install nvidia-ml-py)"
            return
        try:
            pynvml.nvmlInit()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            self.why_not = f"NVML did not answer ({exc}): no NVIDIA GPU or driver here"
            return
        if not self._handles:
            self.why_not = "NVML sees no GPU here"
            return
        self._nvml = pynvml

    @property
    def available(self) -> bool:
        return self._nvml is not None

    def sample(self, pids: Iterable[int]) -> None:
        if self._nvml is None:
            return
        wanted = set(pids)
        total = 0
        for handle in self._handles:
            try:
                procs = self._nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            except Exception:
                continue
            used = [p.usedGpuMemory or 0 for p in procs if p.pid in wanted]
            if used and self.name is None:
                name = self._nvml.nvmlDeviceGetName(handle)
                self.name = name.decode() if isinstance(name, bytes) else str(name)
            total += sum(used)
        self.peak_bytes = max(self.peak_bytes, total)

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
