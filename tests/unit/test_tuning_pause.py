"""While the background compile times kernel configurations on the GPU (Triton's autotuning),
a marker file exists and the training process's eager steps wait for it to go
(``runtime.eager_pauses_for_tuning``): the marking in the background process, the waiting in the
training process, and a background process that ends while its marker is left behind."""

from __future__ import annotations

import subprocess
import sys
import threading
from types import SimpleNamespace

import pytest
from torch._inductor.runtime.triton_heuristics import CachingAutotuner

from diffscale.config import ConfigSources, resolve_config
from diffscale.training.background_compile import BackgroundCompile, HeldOutput, mark_kernel_timing


def test_the_marker_exists_while_kernel_configurations_are_timed_and_not_after(tmp_path, monkeypatch):
    marker = tmp_path / "tuning"
    seen: list[bool] = []

    def timing(self, *args, **kwargs):
        seen.append(marker.exists())
        if kwargs.get("fail"):
            raise RuntimeError("a configuration failed to run")
        return {"config": 1.0}

    monkeypatch.setattr(CachingAutotuner, "benchmark_all_configs", timing)
    assert mark_kernel_timing(marker) is True
    assert not marker.exists()
    assert CachingAutotuner.benchmark_all_configs(object(), 3, grid=(1,)) == {"config": 1.0}
    assert seen == [True] and not marker.exists()
    with pytest.raises(RuntimeError, match="failed to run"):  # inductor's own error goes on, the marker goes
        CachingAutotuner.benchmark_all_configs(object(), fail=True)
    assert seen == [True, True] and not marker.exists()


def _background(tmp_path, code: str, marker) -> BackgroundCompile:
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert child.stdout is not None
    return BackgroundCompile(child, HeldOutput.read(child.stdout), marker)


def test_an_eager_step_waits_until_the_timing_ends(tmp_path):
    marker = tmp_path / "tuning"
    background = _background(tmp_path, "import time; time.sleep(60)", marker)
    try:
        assert background.wait_while_tuning() == 0.0  # no timing: no wait
        marker.touch()
        timing_ended = threading.Event()

        def end_timing() -> None:
            timing_ended.set()
            marker.unlink()

        threading.Timer(0.2, end_timing).start()
        waited = background.wait_while_tuning()
        assert timing_ended.is_set() and not marker.exists()
        assert waited > 0 and background.paused_s == waited
    finally:
        background.stop()


def test_a_background_process_gone_while_timing_leaves_no_step_waiting(tmp_path):
    marker = tmp_path / "tuning"
    background = _background(tmp_path, "pass", marker)
    background.process.wait(timeout=60)
    marker.touch()  # as a process killed inside a timing leaves it
    background.wait_while_tuning()
    assert not marker.exists() and background.ended()


def test_the_marker_is_passed_to_the_background_process_unless_the_pause_is_off(tmp_path):
    ctx = SimpleNamespace(local_rank=0, world_size=1, info=SimpleNamespace(local_world_size=1))
    started = {}
    for setting in ("on", "off"):
        cfg = resolve_config(ConfigSources(preset="tiny", overrides=[f"runtime.eager_pauses_for_tuning={setting}"]))
        background = BackgroundCompile.start(cfg, ctx, tmp_path / "kernels")
        background.stop()
        started[setting] = (background.tuning_marker, background.process.args)
    marker, argv = started["on"]
    assert marker is not None and argv[-2:] == ["--tuning-marker", str(marker)] and not marker.exists()
    assert started["off"][0] is None and "--tuning-marker" not in started["off"][1]
