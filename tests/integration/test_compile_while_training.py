"""Training while the step compiles (``runtime.compile_while_training on``) on the CPU, where inductor
compiles C++ kernels: a compiled run takes its first steps eager while a background process
compiles the same step, then every rank switches to it at the same step; checkpoints written on
either side of the switch resume on the other; compile off stays eager.

One run compiles cold (the module's fixture, most of this file's time: inductor's first compile
of even the one-level micro UNet takes tens of seconds on a CPU); the other runs load its kernels.
Runs that train compiled end when the test has seen what it needs, by the scheduler's stop
signal (SIGTERM: a checkpoint, exit 85), since how many eager steps fit in the compile's time is
the machine's business."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from diffscale.cli import main
from diffscale.config import ConfigSources, resolve_config
from diffscale.io.kernels import build_name, kernels_root, step_built
from diffscale.runtime import checkpoint as ckpt
from diffscale.runtime.signals import EXIT_REQUEUE
from diffscale.training.switch import CHECK_EVERY

from helpers import micro_args

pytestmark = pytest.mark.integration

LOG_EVERY = 20
ONE_LEVEL = ("model.block_out_channels=[8]", "model.attention=[false]", f"train.log_every={LOG_EVERY}",
             f"train.checkpoint_every={CHECK_EVERY}", "train.keep_checkpoints=60")
"""Checkpoints as often as the switch is decided: the switch's step has one, the last state of the eager steps.
Kept: 60, so the one before the switch outlives the steps taken between the compiled speed's record and
the stop (12 kept held only ~40 of them, a third of a second of the micro network's steps on the CPU: a
slow look at the run pruned it)."""
COMPILED = ("runtime.compile=on", "runtime.compile_while_training=on")
STEPS = 1_000_000
"""Never reached: the runs that switch are stopped by a signal."""


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHINDUCTOR_CACHE_DIR")}
    # Inductor dry-compiles a probe per vector ISA the CPU reports, into the kernel cache; trusting the
    # CPU's flags skips them (where they would pass, inductor picks the same ISA and kernels).
    return {**env, "OMP_NUM_THREADS": "1", "TORCHINDUCTOR_VEC_ISA_OK": "1", "PYTHONUNBUFFERED": "1", "COLUMNS": "250",
            **extra}


def _events(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def _kinds(run: Path, kind: str) -> list[dict]:
    return [e for e in _events(run) if e.get("kind") == kind]


def _checkpoint_steps(run: Path) -> list[int]:
    return [ckpt.step_of(p) for p in ckpt.list_checkpoints(run)]


def _stopped_when(cmd: list[str], seen: Callable[[subprocess.Popen], bool], out: Path,
                  env: dict[str, str]) -> tuple[int, str]:
    """Run ``cmd`` until ``seen(its process)``, then send the scheduler's stop signal; its exit code
    and output once it has checkpointed and ended."""
    with out.open("w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            deadline = time.monotonic() + 840  # a guard against a hang, not a measurement
            while proc.poll() is None and not seen(proc) and time.monotonic() < deadline:
                time.sleep(0.5)
            assert proc.poll() is None, out.read_text()  # still training: the run has not ended by itself
            assert seen(proc), f"not seen in time:\n{out.read_text()[-4000:]}"
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
    return code, out.read_text()


@pytest.fixture(scope="module")
def switched(tmp_path_factory) -> tuple[Path, str]:
    """A run that starts eager while its background process compiles cold, switches, and is stopped
    once it has said its compiled speed and written two checkpoints on the compiled side."""
    run = tmp_path_factory.mktemp("switch") / "run"

    def two_compiled_checkpoints(_: subprocess.Popen) -> bool:
        compiled, speed = _kinds(run, "compiled"), _kinds(run, "compiled_speed")
        return bool(compiled and speed) and len([s for s in _checkpoint_steps(run) if s > compiled[0]["step"]]) >= 2

    cmd = [sys.executable, "-m", "diffscale", "train", "--device", "cpu", "--out", str(run),
           *micro_args(*ONE_LEVEL, *COMPILED, steps=STEPS)]
    code, out = _stopped_when(cmd, two_compiled_checkpoints, run.parent / "out.txt", _env())
    assert code == EXIT_REQUEUE and "stop requested (SIGTERM)" in out
    return run, out


def test_a_compiled_run_trains_eager_until_its_background_compile_is_built_then_switches(switched):
    run, out = switched
    records = _events(run)
    first, compiled, speed = (_kinds(run, k) for k in ("first_step", "compiled", "compiled_speed"))
    assert len(first) == len(compiled) == len(speed) == 1
    first, compiled, speed = first[0], compiled[0], speed[0]
    switch = compiled["step"]
    # the first step did not wait for the compile: it came first, then windows of eager steps, each
    # logged while the background process still compiled (the switch is decided every CHECK_EVERY
    # steps, between logged steps too)
    assert records[0] == first and first["step"] == 1 and first["eager"] is True
    eager_windows = [r["step"] for r in records[:records.index(compiled)] if "loss" in r]
    assert eager_windows == list(range(LOG_EVERY, switch + 1, LOG_EVERY)) and switch >= 2 * LOG_EVERY
    assert switch % CHECK_EVERY == 0
    assert compiled["background_compile_s"] > 0 and compiled["switch_s"] > 0 and compiled["eager_samples_per_s"] > 0
    assert compiled["paused_for_tuning_s"] == 0  # on a CPU inductor times no Triton kernels: nothing to wait for
    # dynamo's account of the switch: the forward traced; its phases take no more than the switch did
    account = compiled["switch_account"]
    assert 0 < account["_compile.compile_inner"] <= compiled["switch_s"], account
    # the compiled speed: the first logged window that starts a whole window after the switch
    first_clean_window = -(-(switch + 2 * LOG_EVERY) // LOG_EVERY) * LOG_EVERY
    assert speed["compiled_from_step"] == switch and speed["step"] == first_clean_window
    assert speed["same_step_every_rank"] is True and speed["samples_per_s"] > 0
    # the log says what runs
    assert "| eager while compiling, then compiled |" in out
    assert f", its log in {run / 'background-compile.log'}; every rank switches to the compiled step" in out
    assert "first step of this job (step 1) " in out and "s after it started: eager while compiling" in out
    assert f"compiling from its kernels at step {switch}\n" in out
    assert f"compiled from step {switch}: the switch took" in out
    assert f"(compiled from step {switch} on every rank)" in out
    background = (run / "background-compile.log").read_text()
    assert "compiled: forward and backward built in" in background and "Traceback" not in background


def _weights(run: Path, step: int) -> dict[str, torch.Tensor]:
    folder = ckpt.checkpoint_root(run) / f"step_{step:08d}"
    return {f"{name}/{k}": v for name in ("model", "ema") for k, v in
            load_file(str(folder / f"{name}.safetensors")).items()}


def _assert_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def _assert_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], start: dict[str, torch.Tensor]) -> None:
    """``a`` and ``b`` trained from ``start`` by the same steps in other kernels: eager and compiled CPU
    kernels round differently, and AdamW turns a gradient's rounding noise into a step of up to the
    learning rate, so they agree to within a tenth of how far the steps moved the weights (2-6 % on
    this network over 20-300 steps)."""
    assert a.keys() == b.keys() == start.keys()
    apart = sum(float(((a[k] - b[k]) ** 2).sum()) for k in a) ** 0.5
    moved = sum(float(((b[k] - start[k]) ** 2).sum()) for k in a) ** 0.5
    assert moved > 0 and apart <= 0.1 * moved, f"{apart} apart after moving {moved}"


def _resume(source: Path, step: int, out: Path, until: int, *overrides: str, in_process: bool) -> None:
    """``source``'s checkpoint of ``step`` trained on to ``until`` in a new run dir ``out``."""
    args = ["train", str(source / "config.yaml"), "--out", str(out), "--resume",
            str(ckpt.checkpoint_root(source) / f"step_{step:08d}"), "--max-steps", str(until), "--device", "cpu",
            *[a for o in overrides for a in ("--set", o)]]
    if in_process:  # eager: nothing compiles in the test's process
        assert main(args) == 0
        return
    done = subprocess.run([sys.executable, "-m", "diffscale", *args], capture_output=True, text=True, env=_env(),
                          timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr


def test_checkpoints_written_before_the_switch_resume_after_it_and_the_other_way_round(switched, tmp_path):
    """The switch's step is checkpointed before its first compiled step: the last eager state."""
    run, _ = switched
    switch = _kinds(run, "compiled")[0]["step"]
    after = switch + CHECK_EVERY
    assert {switch - CHECK_EVERY, switch, after, after + CHECK_EVERY} <= set(_checkpoint_steps(run))
    # before the switch, resumed eager: bit for bit (the same kernels ran)
    _resume(run, switch - CHECK_EVERY, tmp_path / "eager", switch, "runtime.compile=off", in_process=True)
    _assert_equal(_weights(tmp_path / "eager", switch), _weights(run, switch))
    # the eager steps' last state, resumed in a job compiled from its start (on the kernels the switch
    # loaded): bit for bit with the steps the run took after its switch
    _resume(run, switch, tmp_path / "compiled", after, "runtime.compile_while_training=off", in_process=False)
    _assert_equal(_weights(tmp_path / "compiled", after), _weights(run, after))
    # after the switch, resumed eager: the same math in other kernels
    _resume(run, after, tmp_path / "back", after + CHECK_EVERY, "runtime.compile=off", in_process=True)
    end = after + CHECK_EVERY
    _assert_close(_weights(tmp_path / "back", end), _weights(run, end), _weights(run, after))


def test_two_torchrun_ranks_switch_at_the_same_step(switched, tmp_path):
    """Rank 1 starts no background compile (one a node): were the switch decided by each rank alone,
    it would compile at its first check, rank 0 later. The kernels are the single-process
    run's (TORCHINDUCTOR_CACHE_DIR set as a user sets it): its network compiles to the same graphs
    under DDP, whose background process builds them as a rank does, DDP included."""
    single, _ = switched
    cfg = resolve_config(ConfigSources(config_file=single / "config.yaml"))
    kernels = kernels_root() / build_name("CPU", torch.__version__) / cfg.graph_key(1)
    assert step_built(kernels)  # the single run's background process and switch marked a whole build
    run = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "diffscale",
           "train", "--device", "cpu", "--out", str(run), *micro_args(*ONE_LEVEL, *COMPILED, steps=STEPS)]
    code, out = _stopped_when(cmd, lambda _: bool(_kinds(run, "compiled_speed")), tmp_path / "out.txt",
                              _env(TORCHINDUCTOR_CACHE_DIR=str(kernels)))
    assert code != 0 and "stop requested (SIGTERM)" in out  # torchrun reports its workers' exit 85 as a failure
    compiled, speed = _kinds(run, "compiled"), _kinds(run, "compiled_speed")
    assert len(compiled) == len(speed) == 1
    switch = compiled[0]["step"]
    assert speed[0]["compiled_from_step"] == switch and speed[0]["same_step_every_rank"] is True
    assert "world size 2 (torchrun)" in out and f"(compiled from step {switch} on every rank)" in out
    assert out.count("compiled from step") == 2  # rank 0 says it, once and in the speed line
    assert not (run / "background-compile-node1.log").exists()  # one node: one background compile
    assert "compiled: forward and backward built in" in (run / "background-compile.log").read_text()


def test_a_background_compile_that_fails_leaves_the_compile_to_the_training_process(switched, tmp_path):
    """Its process killed (as the kernel's OOM killer would): the run goes on eager, says so at the next
    check and compiles by itself, from the kernels the module's first run left."""
    import psutil

    run = tmp_path / "run"
    killed: list[int] = []

    def background_killed_then_compiled(trainer: subprocess.Popen) -> bool:
        if not killed:
            for child in psutil.Process(trainer.pid).children():
                if "diffscale.training.background_compile" in " ".join(child.cmdline()):
                    child.kill()
                    killed.append(child.pid)
            return False
        return bool(_kinds(run, "compiled"))

    cmd = [sys.executable, "-m", "diffscale", "train", "--device", "cpu", "--out", str(run),
           *micro_args(*ONE_LEVEL, *COMPILED, steps=STEPS)]
    code, out = _stopped_when(cmd, background_killed_then_compiled, tmp_path / "out.txt", _env())
    assert code == EXIT_REQUEUE and killed
    switch = _kinds(run, "compiled")[0]["step"]
    assert (f"warning: the background compile failed (its log: {run}/background-compile*.log): the training "
            f"process compiles the step itself now, at step {switch}") in out
    assert f"compiled from step {switch}: the switch took" in out


def test_a_run_with_compile_off_stays_eager_and_starts_no_background_compile(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--device", "cpu", "--out", str(run),
                 *micro_args("runtime.compile=off", "runtime.compile_while_training=on", steps=4)]) == 0
    out = capsys.readouterr().err
    banner = next(line for line in out.splitlines() if line.startswith("diffscale |"))
    assert "compiled" not in banner and "eager while compiling" not in out
    assert not list(run.glob("background-compile*.log"))
    assert not [e for e in _events(run) if e.get("kind") in ("first_step", "compiled", "compiled_speed")]
