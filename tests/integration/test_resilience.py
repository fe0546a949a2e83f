"""Runs survive kill -9, non-finite losses and Ctrl-C / SIGTERM outside a scheduler.

Everything here is a real training process on the CPU with the micro config (tests/conftest.py);
the loop is untouched: NaNs come from a monkeypatched task loss, kills from os.kill.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from diffscale.cli import main
from diffscale.runtime import checkpoint as ckpt
from diffscale.runtime.signals import EXIT_REQUEUE
from diffscale.tasks.images.task import ImageTask

pytestmark = pytest.mark.integration

CHECKPOINT_EVERY = 4  # the micro config's train.checkpoint_every


def final_tensors(run_dir: Path) -> tuple[str, dict[str, torch.Tensor]]:
    """Weights, EMA and optimizer state of the newest checkpoint (as test_train_resume compares)."""
    last = ckpt.list_checkpoints(run_dir)[-1]
    out = {}
    for name in ("model", "ema", "optimizer"):
        out.update({f"{name}/{k}": v for k, v in load_file(str(last / f"{name}.safetensors")).items()})
    return last.name, out


def assert_same_run(a: Path, b: Path) -> None:
    name_a, ta = final_tensors(a)
    name_b, tb = final_tensors(b)
    assert name_a == name_b
    assert ta.keys() == tb.keys()
    for key in ta:
        assert torch.equal(ta[key], tb[key]), key


def metrics(run_dir: Path) -> list[dict]:
    """The training records (events such as a rollback's carry a ``kind``)."""
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in lines if "kind" not in r]


def train_process(run_dir: Path, *args: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="200")
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    return subprocess.Popen([sys.executable, "-m", "diffscale", "train", "--out", str(run_dir), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


# ----------------------------------------------------------------------------- kill -9

# One process imports diffscale, torch and diffusers once, then forks a training process for each
# command line it reads (a JSON list of `diffscale` arguments): every kill hits a fresh process that
# trains from its command line, without a Python and torch start-up of its own. A training process
# prints its pid first; the forking process prints how it ended and reaps it only when the next
# command comes, so a signal the test sends never reaches a reused pid.
FORKS = r"""
import json, os, sys, traceback
from diffscale.cli import main
import diffscale.tasks.images.task, diffscale.training.loop  # what `train` imports, loaded before the forks

ended = None
for line in sys.stdin:
    if ended is not None:
        os.waitpid(ended, 0)
    pid = os.fork()
    if pid == 0:
        code = 70
        try:
            print("PID", os.getpid(), flush=True)
            code = main(json.loads(line))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            os._exit(code)
    info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    print("ENDED", info.si_status if info.si_code == os.CLD_EXITED else -info.si_status, flush=True)
    ended = pid
if ended is not None:
    os.waitpid(ended, 0)
"""


class TrainingForks:
    """`diffscale train` processes forked by one ``FORKS`` process, one at a time."""

    def __init__(self) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="200")
        env.pop("RANK", None)
        env.pop("WORLD_SIZE", None)
        self.proc = subprocess.Popen([sys.executable, "-c", FORKS], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, env=env)
        self.returncode: int | None = None

    def train(self, run_dir: Path, *args: str) -> int:
        """Start ``diffscale train --out RUN_DIR ARGS``; returns its pid."""
        self.returncode = None
        self.proc.stdin.write(json.dumps(["train", "--out", str(run_dir), *args]) + "\n")
        self.proc.stdin.flush()
        first = self.proc.stdout.readline()
        assert first.startswith("PID "), first + self.proc.stdout.read()
        return int(first.split()[1])

    def output(self):
        """The training process's lines until it ended (then ``returncode`` is set)."""
        while self.returncode is None:
            line = self.proc.stdout.readline()
            assert line, "the forking process ended"
            if line.startswith("ENDED "):
                self.returncode = int(line.split()[1])
                return
            yield line

    def close(self) -> None:
        self.proc.stdin.close()
        assert self.proc.wait(timeout=60) == 0
        self.proc.stdout.close()


MAX_RUNS = 30
"""Runs the random-kill test starts at most to land its six kills."""


def test_kill_9_at_random_moments_always_resumes_and_loses_at_most_one_interval(tmp_path, micro):
    micro_args = micro
    steps = 40
    args = [*micro_args(steps=steps), "--resume", "auto"]
    straight = tmp_path / "straight"
    assert main(["train", "--out", str(straight), *micro_args(steps=steps)]) == 0

    rng = random.Random(5)
    kills = killed_mid_save = finished = 0
    chain = 0
    run_dir = tmp_path / f"killed{chain}"
    forks = TrainingForks()
    for _ in range(MAX_RUNS):  # each run is killed or finishes first; the bound keeps a bad run from looping
        if kills == 6:
            break
        before = ckpt.list_checkpoints(run_dir)
        resumed_from = ckpt.step_of(before[-1]) if before else None
        pid = forks.train(run_dir, *args)
        lines = []
        for line in forks.output():  # wait until it trains, then kill it at a random moment
            lines.append(line)
            if line.startswith("step "):
                break
        time.sleep(rng.uniform(0.0, 0.3))
        os.kill(pid, signal.SIGKILL)
        lines += forks.output()
        text = "".join(lines)
        if resumed_from is not None:  # the previous kill left a checkpoint this run resumed from
            assert f"resumed from step {resumed_from}" in text, text
        if forks.returncode == 0:  # it finished before the kill landed: compare, start a new chain
            finished += 1
            assert_same_run(straight, run_dir)
            chain += 1
            run_dir = tmp_path / f"killed{chain}"
            continue
        assert forks.returncode == -signal.SIGKILL, text
        kills += 1
        killed_mid_save += any((run_dir / "checkpoints").glob(".tmp-*"))
        printed = [int(line.split()[1].split("/")[0]) for line in text.splitlines() if line.startswith("step ")]
        state = ckpt.load_latest(run_dir, log=lambda m: pytest.fail(f"a checkpoint is damaged: {m}"))
        newest = state.step if state else 0
        assert newest >= max(printed) - CHECKPOINT_EVERY, (newest, printed)
    forks.close()
    assert kills == 6, f"only {kills} of {MAX_RUNS} runs were killed before they finished ({finished} finished)"
    # Random moments rarely land inside a save (it takes milliseconds): aim kills at the moment
    # a temporary checkpoint folder appears, in a chain of their own, until one lands mid-save.
    aimed = tmp_path / "aimed0"
    for attempt in range(6):
        if killed_mid_save:
            break
        before = ckpt.list_checkpoints(aimed)
        proc = train_process(aimed, *args)
        checkpoints = aimed / "checkpoints"
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            if checkpoints.is_dir() and any(name.startswith(".tmp-") for name in os.listdir(checkpoints)):
                proc.send_signal(signal.SIGKILL)
                break
        text = proc.communicate()[0]
        if proc.returncode == 0:  # every save slipped past the poll: start a fresh chain
            assert_same_run(straight, aimed)
            aimed = tmp_path / f"aimed{attempt + 1}"
            continue
        assert proc.returncode == -signal.SIGKILL, text
        killed_mid_save += any(checkpoints.glob(".tmp-*"))
        state = ckpt.load_latest(aimed, log=lambda m: pytest.fail(f"a checkpoint is damaged: {m}"))
        assert before == [] or (state is not None and state.step >= ckpt.step_of(before[-1])), text
    if ckpt.list_checkpoints(aimed):
        assert main(["train", "--out", str(aimed), *args]) == 0
        assert_same_run(straight, aimed)
    # the last chain, resumed once more, still ends exactly where an uninterrupted run does
    assert main(["train", "--out", str(run_dir), *args]) == 0
    assert_same_run(straight, run_dir)
    assert killed_mid_save >= 1, "no kill landed inside a save; the atomic rename was not exercised"


# ----------------------------------------------------------------------------- non-finite losses

def nan_on_calls(monkeypatch, calls: set[int]) -> list[int]:
    """Make the task's loss NaN on the given (1-based) calls; one call per step here (grad_accum 1)."""
    seen = [0]
    original = ImageTask.loss

    def loss(self, *args, **kwargs):
        seen[0] += 1
        value = original(self, *args, **kwargs)
        return value * float("nan") if seen[0] in calls else value

    monkeypatch.setattr(ImageTask, "loss", loss)
    return seen


def test_nan_steps_are_skipped_counted_then_rolled_back_with_half_the_lr(tmp_path, monkeypatch, capsys, micro):
    """With the divergence guard off: back to the newest checkpoint, as before the guard existed."""
    micro_args = micro
    run_dir = tmp_path / "run"
    # steps 9, 10 are NaN (2 in a row = max_nonfinite_steps): roll back to step 8; the replayed
    # steps 9, 10 are NaN again: second rollback; then the loss is finite and the run finishes.
    nan_on_calls(monkeypatch, {9, 10, 11, 12})
    args = micro_args("train.max_nonfinite_steps=2", "optim.warmup_steps=0", "optim.schedule=constant",
                      "train.divergence_guard=off", steps=16)
    assert main(["train", "--out", str(run_dir), *args]) == 0
    out = capsys.readouterr().err
    assert ("warning: non-finite loss for 2 steps in a row at step 10: rolled back to step 8 with the learning "
            "rate halved (rollback 1 of 3)") in out
    assert "(rollback 2 of 3)" in out
    records = metrics(run_dir)
    # One record per step: each rollback replaces what was logged after its checkpoint, so step
    # 10 keeps the last record, which counts the four NaN steps once each.
    assert [r["step"] for r in records] == sorted({r["step"] for r in records})
    at10 = [r for r in records if r["step"] == 10]
    assert [r["nonfinite_skipped"] for r in at10] == [4]
    lrs = {r["step"]: r["lr"] for r in records}
    assert lrs[16] == pytest.approx(records[0]["lr"] / 4)  # halved twice
    state = ckpt.load_latest(run_dir)
    assert state.step == 16 and state.meta.rollbacks == 2 and state.meta.lr_backoff == 0.25
    assert state.meta.nonfinite_total == 4
    assert all(torch.isfinite(v).all() for v in state.model.values())


def test_nan_steps_send_the_guarded_run_back_to_its_last_good_state(tmp_path, monkeypatch, capsys, micro):
    """With the divergence guard on (the default), non-finite losses take its path: back to the good
    state it kept in memory (step 4: the state of step 8 had no healthy window after it yet)."""
    micro_args = micro
    run_dir = tmp_path / "run"
    nan_on_calls(monkeypatch, {9, 10})
    args = micro_args("train.max_nonfinite_steps=2", "optim.warmup_steps=0", "optim.schedule=constant", steps=16)
    assert main(["train", "--out", str(run_dir), *args]) == 0
    out = capsys.readouterr().err
    assert ("warning: divergence at step 10: the loss was non-finite for 2 steps in a row; went back to step 4 "
            "and halved the learning rate (now 5.00e-04; restore 1 of 3)") in out
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(e["step"], e["restored_step"]) for e in events if e.get("kind") == "divergence"] == [(10, 4)]
    state = ckpt.load_latest(run_dir)
    assert state.step == 16 and state.meta.rollbacks == 1 and state.meta.lr_backoff == 0.5
    assert all(torch.isfinite(v).all() for v in state.model.values())


def test_nan_without_a_checkpoint_stops_with_a_clear_message(tmp_path, monkeypatch, capsys, micro):
    micro_args = micro
    nan_on_calls(monkeypatch, {1, 2, 3, 4})
    run_dir = tmp_path / "run"
    args = micro_args("train.max_nonfinite_steps=2", "train.divergence_guard=off", steps=16)
    assert main(["train", "--out", str(run_dir), *args]) == 2
    err = capsys.readouterr().err
    assert ("error: the loss was non-finite for 2 steps in a row at step 2 and no checkpoint exists to roll back "
            "to -- lower optim.lr, keep optim.grad_clip on, or set train.checkpoint_every lower") in err
    nan_on_calls(monkeypatch, {1, 2, 3, 4})
    guarded = tmp_path / "guarded"
    assert main(["train", "--out", str(guarded), *micro_args("train.max_nonfinite_steps=2", steps=16)]) == 2
    assert ("error: the loss diverged at step 2 (the loss was non-finite for 2 steps in a row) and no earlier "
            "state was kept to go back to -- lower optim.lr") in capsys.readouterr().err
    assert main(["doctor", str(run_dir)]) == 0  # metrics.jsonl has the skipped steps
    assert "non-finite steps skipped" in capsys.readouterr().out


# ----------------------------------------------------------------------------- Ctrl-C / SIGTERM

@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_ctrl_c_or_sigterm_saves_exits_85_and_the_same_command_continues(tmp_path, sig, micro, capsys):
    micro_args = micro
    steps = 400  # far more than it trains before the signal lands
    args = [*micro_args(steps=steps), "--resume", "auto"]
    run_dir = tmp_path / "run"
    proc = train_process(run_dir, *args)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("step "):
            break
    proc.send_signal(sig)
    lines += proc.stdout.readlines()
    assert proc.wait() == EXIT_REQUEUE, "".join(lines)
    proc.stdout.close()
    text = "".join(lines)
    stopped = [ln for ln in text.splitlines() if ln.startswith("stop requested")]
    assert stopped and f"({sig.name})" in stopped[0], text
    at = int(stopped[0].split("at step ")[1].split(":")[0])
    assert ckpt.step_of(ckpt.list_checkpoints(run_dir)[-1]) == at  # nothing since the last log step is lost
    assert at < steps
    # the same command continues in this process: only the signalled run needs a process of its own
    capsys.readouterr()
    code = main(["train", "--out", str(run_dir), *args[:-2], "--set", "train.steps=" + str(at + 6), "--resume", "auto"])
    text2 = capsys.readouterr().err
    assert code == 0, text2
    assert f"resumed from step {at}" in text2 and f"done: {at + 6} steps" in text2
