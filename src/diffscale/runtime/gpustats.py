"""GPU utilisation and memory per GPU through NVML (the ``pynvml`` module of nvidia-ml-py).

Optional: without nvidia-ml-py, without an NVIDIA driver or on a CPU run the records simply
have no GPU fields, and the reason is said once. Reading NVML costs microseconds and never
synchronises the device, so it is done at each metrics report only.

Fields per visible GPU ``i`` (the order of CUDA_VISIBLE_DEVICES, as torch numbers them):
``gpu{i}_util_pct`` (share of the last sample period a kernel ran), ``gpu{i}_mem_mb`` (memory
used on the card, all processes) and ``gpu{i}_mem_pct`` (of the card's total).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

INSTALL_HINT = "pip install nvidia-ml-py (or diffscale[gpu])"


def _visible(nvml: Any) -> list[Any]:
    """NVML handles of the GPUs this process sees: CUDA_VISIBLE_DEVICES (indices or UUIDs), else all."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
    handles = []
    for item in (v.strip() for v in visible.split(",") if v.strip()):
        if item.isdigit():
            handles.append(nvml.nvmlDeviceGetHandleByIndex(int(item)))
        else:
            handles.append(nvml.nvmlDeviceGetHandleByUUID(item))
    return handles


class GpuStats:
    """Reads utilisation and memory of the visible GPUs; ``why_not`` says why it cannot."""

    def __init__(self, nvml: Any, handles: list[Any]) -> None:
        self._nvml = nvml
        self._handles = handles

    @classmethod
    def open(cls, on_gpu: bool) -> tuple[GpuStats | None, str]:
        """(stats, "") where NVML answers, else (None, the reason in a few words)."""
        if not on_gpu:
            return None, "not training on a CUDA GPU"
        try:
            import pynvml
        except ImportError:
            return None, f"nvidia-ml-py is not installed -- {INSTALL_HINT}"
        try:
            pynvml.nvmlInit()
            handles = _visible(pynvml)
        except Exception as exc:  # NVMLError: no driver, no device, a UUID NVML does not know
            return None, f"NVML did not answer ({exc})"
        if not handles:
            return None, "NVML sees no GPU"
        return cls(pynvml, handles), ""

    def read(self) -> dict[str, float]:
        """One reading of every visible GPU; a GPU that stops answering is left out of it."""
        out: dict[str, float] = {}
        for index, handle in enumerate(self._handles):
            try:
                util = self._nvml.nvmlDeviceGetUtilizationRates(handle)
                mem = self._nvml.nvmlDeviceGetMemoryInfo(handle)
            except Exception:  # an Xid or a reset: the doctor reads the log, metrics go on
                continue
            out[f"gpu{index}_util_pct"] = float(util.gpu)
            out[f"gpu{index}_mem_mb"] = mem.used / 2**20
            out[f"gpu{index}_mem_pct"] = 100.0 * mem.used / max(mem.total, 1)
        return out

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except Exception:
            pass


def open_gpu_stats(on_gpu: bool, say: Callable[[str], None]) -> GpuStats | None:
    """NVML readings for the metrics, or None after saying once why there are none. Nothing is
    said for CPU and MPS runs, which have no NVIDIA GPU to read."""
    stats, why = GpuStats.open(on_gpu)
    if stats is None and on_gpu:
        say(f"note: GPU utilisation and memory are not recorded: {why}")
    return stats
