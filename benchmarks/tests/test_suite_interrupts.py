"""The suite stopped mid-call: ^C to the process group, a signal to one training process, an
evaluation cut off. Real ``python -m benchmarks.suite.defaults`` processes of micro configs on a CPU."""

from __future__ import annotations

import json
import time

import pytest

from benchmarks.tests.suite_micro import MICRO, set_args


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    """Feature networks and rendered data go to this test's folder, not the user's cache."""
    monkeypatch.setenv("DIFFSCALE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def _suite_started(out, steps: int, extra_sets: tuple[str, ...] = (), env: dict[str, str] | None = None):
    """The suite started on strokes then colour, tiny micro runs of ``steps`` steps, once it says
    its first run trains: (its process, the lines it printed, its command)."""
    import os
    import subprocess
    import sys

    argv = [sys.executable, "-m", "benchmarks.suite.defaults", "--preset", "tiny", "--sets", "strokes", "colour",
            "--seeds", "1", "--steps", str(steps), "--count", "40", "--out", str(out), "--gpus", "none",
            *set_args([*MICRO, *extra_sets])]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    assert process.stdout is not None
    lines = []
    for line in process.stdout:
        lines.append(line)
        if "strokes/defaults/seed0: training" in line:
            break
    return process, lines, argv


def _suite_in_training(out):
    """The suite with runs too long to end, once its first run has begun training: (the suite's
    process, the lines it printed, that run's folder)."""
    process, lines, _ = _suite_started(out, steps=100000)
    run_dir = out / "runs" / "tiny" / "strokes" / "defaults" / "seed0"
    while not (run_dir / "metrics.jsonl").is_file() and process.poll() is None:  # training has begun
        time.sleep(0.1)
    return process, lines, run_dir


def _stopped(process, lines) -> str:
    """What the suite printed in all, once it ended (killed, with its runs, if it has not in 300 s)."""
    import os
    import signal
    import subprocess

    try:
        rest, _ = process.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        rest, _ = process.communicate()
    return "".join(lines) + rest


def test_an_interrupted_call_keeps_no_half_run_and_starts_no_other(tmp_path):
    """^C (or ``timeout --signal=INT``, as scripts/gpu/suite_defaults.sh stops a call) to the whole
    process group mid-run: exit 130, the run it cut keeps no record (the next call trains it), the
    next set never starts."""
    import os
    import signal

    out = tmp_path / "out"
    process, lines, run_dir = _suite_in_training(out)
    os.killpg(process.pid, signal.SIGINT)
    printed = _stopped(process, lines)
    assert process.returncode == 130, printed
    assert "tiny/strokes/defaults/seed0: interrupted, not kept" in printed
    assert "the finished runs are kept; the same command trains the others" in printed
    assert not (run_dir / "result.json").exists()
    assert "colour/defaults/seed0: training" not in printed and not (out / "runs" / "tiny" / "colour").exists()


def test_a_run_stopped_by_a_signal_the_main_thread_did_not_hear_stops_the_call(tmp_path):
    """SIGINT to the training process alone, as a process-directed signal that landed on a worker
    thread leaves the suite's main thread, blocked on that run, unaware: the run checkpoints and
    exits 85 before its budget, which is not a budget stop. The call stops as interrupted (exit
    130): the run is not kept, not evaluated, and the next set never starts (on a GPU host such runs
    were evaluated for minutes, and the call was killed at its limit)."""
    import os
    import signal

    out = tmp_path / "out"
    process, lines, run_dir = _suite_in_training(out)
    trainers = [int(pid) for pid in os.listdir("/proc") if pid.isdigit() and str(run_dir).encode() in
                _cmdline(int(pid)) and b"train" in _cmdline(int(pid))]
    assert len(trainers) == 1, trainers
    os.kill(trainers[0], signal.SIGINT)
    printed = _stopped(process, lines)
    log = run_dir.with_name("seed0.log").read_text()
    assert "stop requested (SIGINT)" in log and " eval " not in log, log[-2000:]
    assert process.returncode == 130, printed
    assert "tiny/strokes/defaults/seed0: interrupted, not kept" in printed
    assert not (run_dir / "result.json").exists()
    assert "colour/defaults/seed0: training" not in printed and not (out / "runs" / "tiny" / "colour").exists()


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read()
    except OSError:  # gone, or not ours to read
        return b""


def _cut_off_in_its_evaluation(tmp_path, flag):
    """A suite call on strokes stopped (SIGINT to the process group) while its run, trained to its
    end, was being evaluated in a feature network of the test's own that waits while ``flag``
    exists: (the run's folder, its kept record, the call's command, its environment)."""
    import os
    import signal

    (tmp_path / "waiting_features.py").write_text(
        "import os, time\n"
        "import torch\n"
        "def build():\n"
        f"    while os.path.exists({str(flag)!r}):  # until the call is interrupted\n"
        "        time.sleep(0.05)\n"
        "    return torch.nn.Flatten()  # the pixels as features\n")
    out = tmp_path / "out"
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    process, lines, argv = _suite_started(out, steps=6, extra_sets=("train.eval_features=waiting_features:build",),
                                          env=env)
    log = out / "runs" / "tiny" / "strokes" / "defaults" / "seed0.log"
    while process.poll() is None and " eval " not in (log.read_text() if log.is_file() else ""):
        time.sleep(0.1)  # the evaluation has started (or is about to: then the stopping call skips it)
    os.killpg(process.pid, signal.SIGINT)
    printed = _stopped(process, lines)
    assert process.returncode == 130, printed
    run_dir = log.with_suffix("")
    kept = json.loads((run_dir / "result.json").read_text())
    assert "tiny/strokes/defaults/seed0: trained; its evaluation was cut off, kept without its score" in printed, (
        {key: kept.get(key) for key in ("exit_code", "eval_code", "eval_error")}, log.read_text()[-2000:])
    assert "colour/defaults/seed0: training" not in printed
    return run_dir, kept, argv, env


def _strokes_again(argv: list[str], env: dict[str, str]) -> str:
    """The suite on strokes alone again, to its end: what it printed. (Were the run trained or
    evaluated while the test's feature network waits, it would wait for good: the whole session
    is stopped after the time limit.)"""
    import os
    import signal
    import subprocess

    again = subprocess.Popen([*argv[:7], *argv[8:]], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1", **env})
    try:
        said, _ = again.communicate(timeout=300)
    finally:
        if again.poll() is None:
            os.killpg(again.pid, signal.SIGKILL)
    assert again.returncode == 0, said
    return said


def test_a_run_whose_evaluation_an_interrupted_call_cut_off_is_kept_then_scored_where_its_weights_are(tmp_path):
    """A run the stopping call caught in its evaluation is kept with its verdict, without a score.
    The next call reuses it: carried without its checkpoints (another machine) it stays as it is;
    where its checkpoints are (the same machine) it is evaluated, not trained again."""
    import shutil

    flag = tmp_path / "hold-the-evaluation"
    flag.touch()
    run_dir, kept, argv, env = _cut_off_in_its_evaluation(tmp_path, flag)
    assert kept["exit_code"] == 0 and kept["steps_reached"] == 6 and kept["collapsed"] is False
    assert kept["quality"] is None and kept["eval_error"].startswith("the call was interrupted during the evaluation")
    # its record carried to another machine, without the weights: kept as it is
    shutil.move(run_dir / "checkpoints", tmp_path / "checkpoints")
    assert "strokes/defaults/seed0: kept from an earlier call" in _strokes_again(argv, env)
    assert json.loads((run_dir / "result.json").read_text()) == kept
    # on the machine that trained it: evaluated now, its training and verdict unchanged
    shutil.move(tmp_path / "checkpoints", run_dir / "checkpoints")
    flag.unlink()
    metrics = (run_dir / "metrics.jsonl").read_text()
    printed = _strokes_again(argv, env)
    assert "strokes/defaults/seed0: trained by an earlier call, its evaluation cut off: evaluating it" in printed
    assert "strokes/defaults/seed0: training" not in printed, printed
    scored = json.loads((run_dir / "result.json").read_text())
    assert scored["quality"] is not None and scored["quality"] >= 0 and "eval_error" not in scored, scored
    assert {key: scored[key] for key in ("exit_code", "train_s", "steps_reached", "collapsed", "final_loss")} == {
        key: kept[key] for key in ("exit_code", "train_s", "steps_reached", "collapsed", "final_loss")}
    now = (run_dir / "metrics.jsonl").read_text()  # no step trained again; the evaluation's record added
    assert now.startswith(metrics) and [json.loads(line)["kind"] for line in now[len(metrics):].splitlines()] == [
        "eval"]
    assert f"fd {round(scored['quality'], 4)}" in printed
    # and a third call keeps the scored run
    assert "strokes/defaults/seed0: kept from an earlier call" in _strokes_again(argv, env)


@pytest.mark.parametrize("exit_code", [85, 130])
def test_runs_waiting_for_a_stopped_leader_do_not_start(tmp_path, exit_code):
    """Two seeds of one step, staggered as on GPUs: the second waits for the first's compiled step.
    A SIGINT to the first before its first step (it checkpoints and exits 85, or exits 130 before it
    could) releases the second, which must not start training: the call stops (KeyboardInterrupt)
    with neither kept. On a GPU host the released run trained on and the call was killed at its
    limit. The leader's training is a stand-in process that waits for the signal: a real run cannot
    be held before its first step."""
    import os
    import signal
    import sys
    import threading
    from dataclasses import dataclass

    from benchmarks.suite.launch import RunSpec, Slots, run_all

    waits_for_signal = (f"import pathlib, signal, sys, time\n"
                        f"signal.signal(signal.SIGINT, lambda *_: sys.exit({exit_code}))\n"
                        "folder = pathlib.Path(sys.argv[1]); folder.mkdir(parents=True)\n"
                        "(folder / 'pid').write_text(str(__import__('os').getpid()))\n"
                        "time.sleep(120)\n")

    @dataclass(frozen=True)
    class HeldBeforeItsFirstStep(RunSpec):
        def train_command(self) -> list[str]:
            return [sys.executable, "-c", waits_for_signal, str(self.run_dir)]

    specs = [HeldBeforeItsFirstStep("tiny", "strokes", "images", "v", seed, "builtin:mix", (), (),
                                    tmp_path / f"seed{seed}") for seed in (0, 1)]
    said: list[str] = []
    ended: list[BaseException | list[dict]] = []

    def call() -> None:
        try:
            ended.append(run_all(specs, Slots(jobs=2, cores=2), lambda spec, outcome: {"summary": ""}, said.append,
                                 stagger=True, budget_s=None, evaluate=False, eval_count=None))
        except BaseException as stop:  # noqa: BLE001 - the test reads what ended the call
            ended.append(stop)

    runner = threading.Thread(target=call, daemon=True)
    runner.start()
    pid_files = [tmp_path / f"seed{seed}" / "pid" for seed in (0, 1)]
    while not (any(p.is_file() and p.read_text() for p in pid_files) and any("waits" in s for s in said)):
        assert runner.is_alive(), (said, ended)
        time.sleep(0.05)
    leader = next(p for p in pid_files if p.is_file() and p.read_text())
    os.kill(int(leader.read_text()), signal.SIGINT)
    runner.join(timeout=120)
    follower = next(p for p in pid_files if p != leader)
    assert not runner.is_alive() and isinstance(ended[0], KeyboardInterrupt), (said, ended)
    assert not follower.parent.exists(), said  # never started
    assert [s for s in said if s.endswith("training")] == [f"tiny/strokes/v/{leader.parent.name}: training"], said
    assert not any(p.parent.joinpath("result.json").exists() for p in pid_files)
