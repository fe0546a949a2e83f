"""A run trained here tells the truth about itself: its console output kept in train.log (the
earlier one rotated on resume), its process in trainer.json, ``status`` calling a killed trainer
stopped, and ``doctor`` and ``logs`` reading it as they read a submitted run's job."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from diffscale.cli import main
from diffscale.io.trainer import KEPT_LOGS, rotate_log

from helpers import REPO, micro_args, run_cli

ENV = dict(os.environ, PYTHONPATH=str(REPO / "src"), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")


def _first_record(run: Path, proc: subprocess.Popen, timeout: float = 300) -> None:
    """Wait until the run has written a training record and printed its progress line (after the
    record and TensorBoard's scalars: a kill between them on a busy machine left no line to read)."""
    deadline = time.monotonic() + timeout
    metrics, console = run / "metrics.jsonl", run / "train.log"

    def printed() -> bool:
        return console.is_file() and any(line.startswith("step ") for line in console.read_text().splitlines())

    while not (metrics.is_file() and metrics.read_text().count("\n") >= 1 and printed()):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no training record appeared"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def killed(tmp_path_factory) -> Path:
    """A local run SIGKILLed after its first training record."""
    run = tmp_path_factory.mktemp("local") / "run"
    proc = subprocess.Popen([sys.executable, "-m", "diffscale", "train", "--out", str(run),
                             *micro_args(steps=100000)], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _first_record(run, proc)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    return run


def test_a_killed_local_run_is_stopped_in_status_without_an_eta(killed, capsys):
    assert main(["status", str(killed)]) == 0
    out = capsys.readouterr().out
    trainer = json.loads((killed / "trainer.json").read_text())
    assert trainer["ended"] is None and trainer["host"] == socket.gethostname()
    assert (f"stopped: its trainer (pid {trainer['pid']} on {trainer['host']}) is gone without recording an end "
            "(killed: SIGKILL, the out-of-memory killer, a closed terminal); its last output") in out
    assert f"continue with `diffscale train --out {killed} --resume auto`" in out
    assert "eta" not in out


def test_doctor_names_the_kill_and_logs_print_the_console_output_of_a_local_run(killed, capsys):
    pid = json.loads((killed / "trainer.json").read_text())["pid"]
    assert main(["doctor", str(killed)]) == 0
    out = capsys.readouterr().out
    assert "the trainer was killed" in out and f"'Killed process {pid}'" in out
    assert f"diffscale train --out {killed} --resume auto" in out
    assert main(["logs", str(killed), "-n", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"==> train.log (trained here: pid {pid} on {socket.gethostname()}) <=="
    assert re.match(r"step \d+/100000  loss ", out[1]) and len(out) == 2  # the last step it logged
    assert main(["logs", str(killed), "--job", "12"]) == 2
    assert capsys.readouterr().err.strip() == (f"error: {killed} was trained here, not submitted: it has no job 12 "
                                               f"-- drop --job: diffscale logs {killed} prints its train.log")


def test_a_resume_rotates_the_log_and_records_how_it_ended(killed, tmp_path, capsys):
    run = tmp_path / "run"
    subprocess.run(["cp", "-r", str(killed), str(run)], check=True)
    first = (run / "train.log").read_text()
    done = run_cli("train", "--out", str(run), "--resume", "auto", *micro_args(steps=4), env={"OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{run}\n"  # the result on stdout, the progress on stderr
    assert "step 4/4" in done.stderr
    assert (run / "train.log.1").read_text() == first
    log = (run / "train.log").read_text()
    assert "warning: took over the lock of pid" in log.splitlines()[0]  # said before the log opened
    assert "diffscale | cpu" in log and "step 4/4" in log and "done: 4 steps" in log
    trainer = json.loads((run / "trainer.json").read_text())
    assert trainer["outcome"] == "finished at step 4" and trainer["ended"] >= trainer["since"]
    assert main(["status", str(run)]) == 0
    assert "): finished at step 4" in capsys.readouterr().out


def test_an_error_ends_up_in_train_log_and_trainer_json(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    assert main(["train", "--out", str(run), *micro_args(steps=4)]) == 0

    def broken(*args, **kwargs):  # a failure inside the loop no input can cause
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr("diffscale.training.loop._loop", broken)
    with pytest.raises(RuntimeError):
        main(["train", "--out", str(run), "--resume", "auto", *micro_args(steps=8)])
    log = (run / "train.log").read_text()
    assert "Traceback (most recent call last):" in log
    assert log.rstrip().endswith("RuntimeError: CUDA error: an illegal memory access was encountered")
    trainer = json.loads((run / "trainer.json").read_text())
    assert trainer["outcome"] == "error: RuntimeError: CUDA error: an illegal memory access was encountered"
    capsys.readouterr()
    assert main(["doctor", str(run)]) == 0
    assert "illegal memory access" in capsys.readouterr().out
    monkeypatch.undo()
    before = (run / "train.log").read_text(), (run / "trainer.json").read_text()
    assert main(["train", "--out", str(run), "--resume", "auto", "--preset", "small", *micro_args(steps=8)]) == 2
    assert ((run / "train.log").read_text(), (run / "trainer.json").read_text()) == before  # refused: untouched


def test_logs_keep_the_newest_rotations(tmp_path):
    for n in range(KEPT_LOGS + 2):
        rotate_log(tmp_path).write_text(f"invocation {n}\n")
    kept = sorted(p.name for p in tmp_path.iterdir())
    assert kept == ["train.log", *(f"train.log.{n}" for n in range(1, KEPT_LOGS + 1))]
    assert (tmp_path / "train.log").read_text() == f"invocation {KEPT_LOGS + 1}\n"
    assert (tmp_path / f"train.log.{KEPT_LOGS}").read_text() == "invocation 1\n"


def test_a_log_the_disk_refuses_is_given_up_and_training_goes_on(tmp_path):
    """A full disk is no cause to stop a run for its log: the checkpoints and metrics say it first."""
    import errno

    from diffscale.training.console_log import RunLog

    class Full:
        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

        def flush(self):
            raise OSError(errno.ENOSPC, "No space left on device")

        def close(self):
            raise OSError(errno.ENOSPC, "No space left on device")

    log = RunLog()
    log.print("before the lock")
    log.attach(tmp_path)
    assert (tmp_path / "train.log").read_text() == "before the lock\n"
    log._file.close()
    log._file = Full()  # the disk fills up (a failure this test cannot cause for real)
    log.print("step 2/8")
    log.failed(RuntimeError("later"))
    log.close()
    assert json.loads((tmp_path / "trainer.json").read_text())["outcome"] == "error: RuntimeError: later"


def test_a_submitted_run_is_judged_by_its_jobs_not_by_its_trainer_record(killed, tmp_path):
    """A job killed at its time limit leaves an open trainer.json too: for a run with jobs.json the
    job table and the scheduler's accounting say what happened (doctor reads the job's log)."""
    from diffscale.doctor.sources import gather
    from diffscale.io import rundir

    run = tmp_path / "run"
    subprocess.run(["cp", "-r", str(killed), str(run)], check=True)
    (run / "jobs.json").write_text("[]")
    lines = rundir.describe(rundir.progress(run))
    assert not any(line.startswith(("stopped:", "trainer")) for line in lines)
    assert any(line.startswith("eta ") for line in lines)  # as the last record said: the jobs say more
    assert str(run / "train.log") not in gather(str(run)).origins
