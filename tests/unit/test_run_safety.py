"""Nothing lost or mixed up: one trainer per run dir (real processes hold and contend for the
lock), outputs replaced whole or not at all, a run that outlives the reader of its stdout, a
resume that cannot relabel a run, and a state.json whose content is wrong read as damage."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from diffscale.cli import main
from diffscale.errors import UserError
from diffscale.io.atomic import atomic_path, write_text
from diffscale.runtime.runlock import LOCK_NAME

from helpers import REPO, micro_args, run_cli

ENV = {"PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "diffscale", *args]


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 300) -> None:
    """Until ``path`` exists (the process got that far), failing if the process ends first."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.1)


def _dead_pid() -> int:
    done = subprocess.Popen(["true"])
    done.wait()
    return done.pid


def _lock(run: Path, **record: object) -> Path:
    run.mkdir(parents=True, exist_ok=True)
    path = run / LOCK_NAME
    path.write_text(json.dumps({"since": 0, **record}) + "\n")
    return path


def _error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and err.rstrip().splitlines()[-1] == lines[0], err
    return lines[0]


# ----------------------------------------------------------------------------- the run-dir lock

def test_a_second_trainer_on_a_run_dir_in_use_is_refused_with_the_holders_host_and_pid(tmp_path, capsys):
    import diffscale
    from diffscale.config import ConfigSources, resolve_config

    run = tmp_path / "run"
    args = ["train", "--out", str(run), *micro_args(steps=100000)]
    first = subprocess.Popen(_cli(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, **ENV})
    try:
        _wait_for(run / "checkpoints", first)  # past its lock: it has trained a few steps
        second = run_cli("train", "--out", str(run), "--resume", "auto", *micro_args(steps=100000), env=ENV)
        line = _error_line(second.stderr)
        assert second.returncode == 2
        assert f"is in use by another trainer (pid {first.pid} on host {socket.gethostname()}" in line, line
        assert f"kill {first.pid}" in line and "another --out" in line
        cfg = resolve_config(ConfigSources(config_file=str(run / "config.yaml")))
        with pytest.raises(UserError, match=f"pid {first.pid} on host"):  # the Python API too
            diffscale.train_run(cfg, run, resume="auto")
    finally:
        first.send_signal(signal.SIGTERM)  # checkpoints, then frees the lock
        out, err = first.communicate(timeout=300)
    assert first.returncode == 85, err
    assert not (run / LOCK_NAME).exists()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records if "loss" in r]
    assert steps == sorted(set(steps)), "two trainers logged the same steps"


def test_a_lock_left_by_a_dead_process_on_this_host_is_taken_over_and_said(tmp_path, capsys):
    run = tmp_path / "run"
    pid = _dead_pid()
    _lock(run, host=socket.gethostname(), pid=pid)
    assert main(["train", "--out", str(run), *micro_args(steps=4)]) == 0
    out = capsys.readouterr().err
    assert f"warning: took over the lock of pid {pid} on host {socket.gethostname()}" in out
    assert "that process is gone" in out
    assert not (run / LOCK_NAME).exists() and (run / "checkpoints" / "step_00000004").is_dir()


def test_a_lock_file_of_garbage_bytes_is_taken_over_as_stale_with_a_warning(tmp_path, capsys):
    """A lock that cannot be read (bytes no UTF-8 decoder takes) names no holder: it is stale, the
    run starts and says so, instead of a UnicodeDecodeError until the file is deleted by hand."""
    run = tmp_path / "run"
    run.mkdir()
    (run / LOCK_NAME).write_bytes(b"\xff\xfe\x00garbage\x80\x81")
    assert main(["train", "--out", str(run), *micro_args(steps=4)]) == 0
    assert "its record cannot be read (a damaged lock file), so nothing holds it" in capsys.readouterr().err
    assert not (run / LOCK_NAME).exists() and (run / "checkpoints" / "step_00000004").is_dir()


def test_a_lock_of_another_host_is_refused_and_taken_with_force(tmp_path, capsys):
    run = tmp_path / "run"
    lock = _lock(run, host="gpu-node-17", pid=4242)
    before = lock.read_text()
    assert main(["train", "--out", str(run), *micro_args(steps=4)]) == 2
    line = _error_line(capsys.readouterr().err)
    assert "in use by another trainer (pid 4242 on host gpu-node-17, since" in line
    assert "pass --force (force=True) to take the lock" in line
    assert sorted(p.name for p in run.iterdir()) == [LOCK_NAME] and lock.read_text() == before
    assert main(["train", "--out", str(run), "--force", *micro_args(steps=4)]) == 0
    out = capsys.readouterr().err
    assert "took over the lock of pid 4242 on host gpu-node-17" in out and "--force was passed" in out
    assert not lock.exists()


def _scheduler(tmp_path: Path, monkeypatch, script: str) -> None:
    """A stand-in ``squeue`` first on PATH, answering as SLURM's does for the job asked about."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "squeue").write_text(f"#!/bin/sh\n{script}\n")
    (bin_dir / "squeue").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


def test_a_lock_of_a_job_the_scheduler_no_longer_runs_is_taken_over(tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    lock = _lock(run, host="gpu-node-17", pid=4242, job="991")
    _scheduler(tmp_path, monkeypatch, 'echo "RUNNING"')
    assert main(["train", "--out", str(run), *micro_args(steps=4)]) == 2
    assert "pid 4242 on host gpu-node-17, job 991" in _error_line(capsys.readouterr().err)
    assert lock.exists()
    (tmp_path / "bin" / "squeue").write_text(
        '#!/bin/sh\necho "slurm_load_jobs error: Invalid job id specified" >&2\nexit 1\n')
    assert main(["train", "--out", str(run), *micro_args(steps=4)]) == 0
    assert "the scheduler no longer runs job 991" in capsys.readouterr().err and not lock.exists()


def test_a_requeued_job_takes_over_its_own_lock(tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    _lock(run, host="gpu-node-17", pid=4242, job="991")
    monkeypatch.setenv("SLURM_JOB_ID", "991")
    assert main(["train", "--out", str(run), *micro_args(steps=4)]) == 0
    assert "job 991 was requeued, and this is its new run" in capsys.readouterr().err


def test_a_lock_held_by_a_live_process_stops_an_online_trainer_until_it_ends(tmp_path):
    from test_online import _cfg

    from diffscale.online import OnlineTrainer

    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        started = Path(f"/proc/{holder.pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
        _lock(tmp_path / "run", host=socket.gethostname(), pid=holder.pid, started=started)
        with pytest.raises(UserError, match=f"in use by another trainer \\(pid {holder.pid} on host"):
            OnlineTrainer(tmp_path / "run", _cfg(), capacity=160)
    finally:
        holder.kill()
        holder.wait()
    trainer = OnlineTrainer(tmp_path / "run", _cfg(), capacity=160)  # its holder is gone now
    with pytest.raises(UserError, match="this process trains there already: close\\(\\) that trainer first"):
        OnlineTrainer(tmp_path / "run", _cfg(), capacity=160)
    trainer.close()
    assert not (tmp_path / "run" / LOCK_NAME).exists()
    OnlineTrainer(tmp_path / "run", _cfg(), capacity=160).close()


# ----------------------------------------------------------------------------- whole outputs

def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".") or p.stat().st_size == 0)


@pytest.mark.parametrize("failure", [RuntimeError("the writer broke"),
                                     OSError(errno.ENOSPC, "No space left on device")])
def test_a_write_that_fails_midway_keeps_the_old_file_and_leaves_nothing(tmp_path, failure):
    target = tmp_path / "grid.png"
    target.write_bytes(b"old picture")
    with pytest.raises(type(failure)), atomic_path(target) as tmp:
        tmp.write_bytes(b"half of a new pic")
        raise failure
    assert target.read_bytes() == b"old picture"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["grid.png"]
    write_text(target, "new")
    assert target.read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["grid.png"]
    assert oct(target.stat().st_mode & 0o777) != oct(0o600)  # the mode a plain write gives, not mkstemp's


def test_sample_over_an_existing_png_on_a_full_disk_keeps_it(tmp_path, capsys, monkeypatch):
    from PIL import Image

    run = tmp_path / "run"
    assert main(["train", "--out", str(run), *micro_args(steps=4)]) == 0
    out = tmp_path / "out"
    out.mkdir()
    old = out / "s.png"
    Image.new("L", (4, 4), 7).save(old)
    before = old.read_bytes()
    real_save = Image.Image.save

    def full_disk(self, fp, *args, **kwargs):  # the first bytes go out, then the disk is full
        real_save(self, fp, *args, **kwargs)
        Path(fp).write_bytes(Path(fp).read_bytes()[:100])
        raise OSError(errno.ENOSPC, "No space left on device", str(fp))

    monkeypatch.setattr(Image.Image, "save", full_disk)
    capsys.readouterr()
    assert main(["sample", str(run), "--n", "4", "--steps", "2", "--out", str(old)]) == 2
    assert "no space left" in _error_line(capsys.readouterr().err).lower()
    assert old.read_bytes() == before
    assert sorted(p.name for p in out.iterdir()) == ["s.png"]


def test_a_report_that_fails_keeps_the_old_page_and_leaves_nothing(tmp_path, monkeypatch):
    from diffscale.report import page

    run = tmp_path / "run"
    assert main(["train", "--out", str(run), *micro_args(steps=4)]) == 0
    report = run / "report.html"
    report.write_text("old page")
    real_write_text = Path.write_text

    def full_disk(self, data, *args, **kwargs):
        real_write_text(self, data[:10], *args, **kwargs)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full_disk)
    with pytest.raises(OSError):
        page.write_report(run)
    monkeypatch.undo()
    assert report.read_text() == "old page"
    assert not [p for p in run.iterdir() if p.name.startswith(".")]


# ----------------------------------------------------------------------------- stdout, preset, state.json

def test_a_closed_stdout_stops_nothing(tmp_path):
    """``train ... 2>&1 | head -1``: the reader of its progress leaves after one line; the run
    finishes with its files, and its log keeps the rest."""
    run = tmp_path / "run"
    proc = subprocess.Popen(_cli("train", "--out", str(run), *micro_args(steps=12)), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env={**os.environ, **ENV, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout is not None and proc.stdout.readline()
    proc.stdout.close()
    assert proc.wait(timeout=600) == 0
    log = (run / "train.log").read_text()
    assert "Traceback" not in log and "BrokenPipe" not in log and "done: 12 steps" in log
    assert (run / "checkpoints" / "step_00000012").is_dir()
    last = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["step"] == 12


def test_sample_writes_its_image_after_the_reader_of_its_progress_left(tmp_path):
    """``sample ... 2>&1 | head -1``: progress goes to stderr; the image is still written, exit 0."""
    run = tmp_path / "run"
    assert main(["train", "--out", str(run), *micro_args(steps=2)]) == 0
    out = tmp_path / "grid.png"
    proc = subprocess.Popen(_cli("sample", str(run), "--n", "4", "--steps", "3", "--out", str(out)),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, **ENV, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout is not None and proc.stdout.readline()
    proc.stdout.close()
    assert proc.wait(timeout=600) == 0
    assert out.read_bytes().startswith(b"\x89PNG")


def test_a_resume_under_another_preset_is_refused_and_config_yaml_kept(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--out", str(run), *micro_args(steps=4)]) == 0
    before = (run / "config.yaml").read_bytes()
    capsys.readouterr()
    assert main(["train", "--preset", "policy-tiny", "--resume", "auto", "--out", str(run),
                 *micro_args(steps=8)]) == 2
    line = _error_line(capsys.readouterr().err)
    assert f"run dir '{run}' holds a run of preset 'tiny', but this resume asks for preset 'policy-tiny'" in line
    assert "drop --preset to resume it as it is" in line and "another --out" in line
    assert (run / "config.yaml").read_bytes() == before and not (run / LOCK_NAME).exists()
    assert main(["train", "--preset", "tiny", "--resume", "auto", "--out", str(run), *micro_args(steps=8)]) == 0


def _rewrite_state(step_dir: Path, change) -> None:
    """Change state.json and its manifest entry together (the checksum then matches)."""
    state = json.loads((step_dir / "state.json").read_text())
    change(state)
    data = json.dumps(state).encode()
    (step_dir / "state.json").write_bytes(data)
    manifest = json.loads((step_dir / "manifest.json").read_text())
    manifest["files"]["state.json"] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (step_dir / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize(("change", "says"), [
    (lambda s: s.update(step="four"), "step 'four' is not a whole number"),
    (lambda s: s.pop("step"), "has no 'step'"),
    (lambda s: s.pop("optimizer"), "has no 'optimizer'"),
    (lambda s: s.update(world_size="2"), "world_size '2' is not of type int"),
    (lambda s: s.update(optimizer={"scalars": {}}), "the optimizer state does not match its tensors"),
])
def test_a_state_json_with_wrong_content_is_a_damaged_checkpoint(tmp_path, capsys, change, says):
    run = tmp_path / "run"
    assert main(["train", "--out", str(run), *micro_args(steps=8)]) == 0
    _rewrite_state(run / "checkpoints" / "step_00000008", change)
    capsys.readouterr()
    assert main(["train", "--out", str(run), "--resume", "auto", *micro_args(steps=10)]) == 0
    out = capsys.readouterr().err
    assert "warning: checkpoint step_00000008" in out and says in out, out
    assert "falling back to the previous one" in out and "resumed from step 4" in out
