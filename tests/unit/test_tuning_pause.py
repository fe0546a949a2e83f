"""While the background compile times kernel configurations on the GPU (Triton's autotuning),
the training process's eager steps pause (``runtime.eager_pauses_for_tuning``): the background
process opens a burst with a marker file and times once the training process says its queued
kernels have run; the burst closes a moment after its last timing. Both sides with real threads
and processes; a background process that ends inside a burst leaves no step waiting."""

from __future__ import annotations

import subprocess
import sys
import threading
from types import SimpleNamespace

import pytest
from torch._inductor.runtime.triton_heuristics import CachingAutotuner

from diffscale.config import ConfigSources, resolve_config
from diffscale.training import tuning_pause
from diffscale.training.background_compile import BackgroundCompile, HeldOutput
from diffscale.training.tuning_pause import TimingBursts, drained_path, mark_kernel_timing, wait_while_tuning

from helpers import eventually


def test_a_timing_starts_once_the_training_process_has_drained_the_gpu_and_the_burst_outlives_it(tmp_path):
    marker = tmp_path / "tuning"
    bursts = TimingBursts(marker, linger_s=2.0, drain_wait_s=60)
    seen: list[tuple[bool, bool]] = []
    timed = bursts.wrap(lambda: seen.append((marker.exists(), drained_path(marker).exists())))
    drained_steps: list[str] = []

    def training() -> None:  # the eager loop: a step, then the pause before the next
        eventually(marker.exists, "no burst was opened")
        wait_while_tuning(marker, drain=lambda: drained_steps.append("drained"), gone=lambda: False)

    trainer = threading.Thread(target=training)
    trainer.start()
    timed()
    timed()  # the same burst: no second hand-over
    assert seen == [(True, True), (True, True)] and drained_steps == ["drained"]
    assert marker.exists()  # the burst lingers for the next kernel's timing
    trainer.join(timeout=60)
    assert not trainer.is_alive() and not marker.exists()


def test_the_training_process_says_drained_again_when_a_new_burst_opens_while_it_waits(tmp_path):
    marker = tmp_path / "tuning"
    bursts = TimingBursts(marker, linger_s=0.0, drain_wait_s=60)
    marker.touch()  # a burst is open; the trainer waits in it
    waited: list[float] = []
    trainer = threading.Thread(target=lambda: waited.append(
        wait_while_tuning(marker, drain=lambda: None, gone=lambda: False)))
    trainer.start()
    eventually(drained_path(marker).exists, "the trainer never said it had drained")
    marker.unlink()
    bursts.wrap(lambda: None)()  # a new burst: it drops the old drained file and waits for a new one
    eventually(lambda: not marker.exists(), "the burst never closed")
    trainer.join(timeout=60)
    assert waited and waited[0] > 0


def test_triton_timing_is_wrapped_and_its_errors_go_on(tmp_path, monkeypatch):
    marker = tmp_path / "tuning"
    seen: list[bool] = []

    def timing(self, *args, **kwargs):
        seen.append(marker.exists())
        if kwargs.get("fail"):
            raise RuntimeError("a configuration failed to run")
        return {"config": 1.0}

    monkeypatch.setattr(CachingAutotuner, "benchmark_all_configs", timing)
    bursts = mark_kernel_timing(marker)
    assert bursts is not None
    bursts.drain_wait_s = 0.0  # no training process here
    assert CachingAutotuner.benchmark_all_configs(object(), 3, grid=(1,)) == {"config": 1.0}
    with pytest.raises(RuntimeError, match="failed to run"):
        CachingAutotuner.benchmark_all_configs(object(), fail=True)
    assert seen == [True, True]
    eventually(lambda: not marker.exists(), "the burst never closed after an error")


def _background(code: str, marker) -> BackgroundCompile:
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert child.stdout is not None
    return BackgroundCompile(child, HeldOutput.read(child.stdout), marker)


def test_an_eager_step_waits_for_the_burst_and_counts_the_pause(tmp_path):
    marker = tmp_path / "tuning"
    background = _background("import time; time.sleep(60)", marker)
    try:
        assert background.wait_while_tuning(drain=lambda: None) == 0.0  # no burst: no wait
        marker.touch()
        threading.Timer(0.2, marker.unlink).start()
        waited = background.wait_while_tuning(drain=lambda: None)
        assert waited > 0 and background.paused_s == waited and not marker.exists()
    finally:
        background.stop()
    assert not drained_path(marker).exists()  # stopped: neither file is left


def test_a_background_process_gone_inside_a_burst_leaves_no_step_waiting(tmp_path):
    marker = tmp_path / "tuning"
    background = _background("pass", marker)
    background.process.wait(timeout=60)
    marker.touch()  # as a process killed inside a timing leaves it
    background.wait_while_tuning(drain=lambda: None)
    assert not marker.exists() and background.ended()
    tuning_pause.remove(marker)


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
