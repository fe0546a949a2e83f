"""What the file system refuses, and what a killed or interrupted command leaves behind.

* An unreadable newest checkpoint is skipped like a damaged one (resume and sample fall back).
* A full disk (a small tmpfs) during train and export: one clear line, exit 2, the newest good
  checkpoint intact, no partial checkpoint or export left, and both go on once there is space.
* An export interrupted halfway leaves nothing, and the next one is not refused.
* After a kill -9 and a resume, metrics.jsonl and TensorBoard hold one record per step.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from diffscale.cli import main
from diffscale.io.rundir import read_records
from diffscale.runtime import checkpoint as ckpt

from helpers import REPO, micro_args, unavailable_here
from unprivileged import bypass_dropped, unavailable, without_root_bypass


def _train(run: Path, *extra: str, steps: int = 8) -> int:
    return main(["train", "--out", str(run), *extra, *micro_args(steps=steps)])


def test_an_unreadable_newest_checkpoint_is_skipped_like_a_damaged_one(tmp_path, capsys):
    if unavailable():
        pytest.skip(unavailable())
    run = tmp_path / "run"
    assert _train(run) == 0
    (ckpt.list_checkpoints(run)[-1] / "model.safetensors").chmod(0)
    capsys.readouterr()
    with without_root_bypass():
        assert main(["sample", str(run), "--n", "2", "--steps", "2", "--out", str(tmp_path / "s.png")]) == 0
        assert "warning: checkpoint step_00000008: model.safetensors is not readable (Permission denied); " \
               "falling back to the previous one" in capsys.readouterr().err
        assert _train(run, "--resume", "auto", steps=10) == 0
    out = capsys.readouterr().err
    assert "model.safetensors is not readable (Permission denied)" in out and "resumed from step 4" in out
    assert ckpt.step_of(ckpt.list_checkpoints(run)[-1]) == 10


def test_a_whole_process_without_the_bypass_gets_the_same_one_line(tmp_path):
    """The in-process drop above, checked against a real process that never had the bypass."""
    log = tmp_path / "job.log"
    log.write_text("CUDA out of memory")
    log.chmod(0)
    argv = bypass_dropped([sys.executable, "-m", "diffscale", "doctor", str(log)])
    if argv is None:
        pytest.skip("root, and no setpriv to drop the permission bypass with")
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [f"error: cannot read the log '{log}' (Permission denied) -- check its "
                                        "permissions (ls -l), or run the doctor as a user who may read it"]


# ----------------------------------------------------------------------------- a full disk

@pytest.fixture
def small_disk(tmp_path):
    """A 4 MiB tmpfs: room for a micro run and one checkpoint (~0.8 MiB), then filled up."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], capture_output=True,
                             text=True)
    if mounted.returncode != 0:  # not root, or a container without CAP_SYS_ADMIN
        unavailable_here(f"cannot mount a small tmpfs here to fill up ({mounted.stderr.strip() or 'mount failed'})")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=True)


def _fill(disk: Path, leave: int) -> Path:
    """Write a filler file until only ``leave`` bytes are free on ``disk``."""
    filler = disk / "filler"
    free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
    with open(filler, "wb") as fh:
        fh.write(b"\0" * max(free - leave, 0))
    return filler


def _one_error(err: str) -> str:
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


def test_a_full_disk_during_training_is_one_line_and_keeps_the_newest_checkpoint(small_disk, capsys):
    run = small_disk / "run"
    assert _train(run, "--max-steps", "4") == 0
    filler = _fill(small_disk, leave=200_000)  # the next checkpoint needs ~800 kB
    capsys.readouterr()
    assert _train(run, "--resume", "auto") == 2
    error = _one_error(capsys.readouterr().err)
    assert "could not write checkpoint step_00000008" in error and "No space left on device" in error
    assert "the newest complete checkpoint, step_00000004, is intact" in error and "--resume auto" in error
    assert [p.name for p in ckpt.list_checkpoints(run)] == ["step_00000004"]
    assert not list((run / "checkpoints").glob(".tmp-*")), "a partial checkpoint was left"
    assert ckpt.load_checkpoint(ckpt.list_checkpoints(run)[-1]).step == 4
    filler.unlink()
    assert _train(run, "--resume", "auto") == 0
    assert ckpt.step_of(ckpt.list_checkpoints(run)[-1]) == 8


def test_a_full_disk_during_export_leaves_no_folder_and_the_next_export_works(small_disk, tmp_path, capsys):
    run = tmp_path / "run"
    assert _train(run, steps=4) == 0
    out = small_disk / "pipe"
    filler = _fill(small_disk, leave=50_000)
    capsys.readouterr()
    assert main(["export", str(run), "--diffusers", str(out)]) == 2
    error = _one_error(capsys.readouterr().err)
    assert f"export to '{out}' failed, nothing was written there: no space left on the device" in error
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler"]  # no target, no partial folder
    filler.unlink()
    assert main(["export", str(run), "--diffusers", str(out)]) == 0
    assert (out / "model_index.json").is_file()


# ----------------------------------------------------------------------------- interrupted export

class _InterruptedAfterWriting:
    """The real task, whose export is interrupted (Ctrl-C) right after it wrote its files: a
    moment a real SIGINT hits only by chance (the export of a micro run takes milliseconds)."""

    def __init__(self, task):
        self.task = task

    def export(self, network, out_dir: Path) -> str:
        self.task.export(network, out_dir)
        assert (out_dir / "model_index.json").is_file()
        raise KeyboardInterrupt


def test_an_interrupted_export_leaves_nothing_and_the_next_is_not_refused(tmp_path):
    from diffusers import DDPMPipeline

    from diffscale.inference.export import export_network
    from diffscale.inference.trained import load_trained

    run = tmp_path / "run"
    assert _train(run, steps=4) == 0
    trained = load_trained(run, "cpu")
    out = tmp_path / "exports" / "pipe"
    with pytest.raises(KeyboardInterrupt):
        export_network(_InterruptedAfterWriting(trained.task), trained.network, out)
    assert not out.exists() and list(out.parent.iterdir()) == []
    (out.parent / ".pipe.partial-999999999").mkdir()  # left by an export killed with SIGKILL
    export_network(trained.task, trained.network, out)
    assert sorted(p.name for p in out.parent.iterdir()) == ["pipe"]
    DDPMPipeline.from_pretrained(str(out))


# ----------------------------------------------------------------------------- kill -9, resume, metrics

def _metric_steps(run: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _steps_logged_so_far(run: Path) -> int:
    """The newest step in metrics.jsonl while a run writes it: a line still being written is
    skipped (only a finished file must parse whole, ``_metric_steps``)."""
    return max([0, *(record["step"] for record in read_records(run)[0])])


def _tensorboard_steps(run: Path) -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tb"))
    events.Reload()
    return [e.step for e in events.Scalars("train/loss")]


def _tensorboard_purges(run: Path) -> list[int]:
    """Steps of the SessionLog START events: TensorBoard drops what earlier writers logged from there."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.compat.proto.event_pb2 import SessionLog

    return [event.step for path in sorted((run / "tb").iterdir()) for event in EventFileLoader(str(path)).Load()
            if event.HasField("session_log") and event.session_log.status == SessionLog.START]


def test_after_a_kill_and_a_resume_every_step_has_one_record(tmp_path):
    run = tmp_path / "run"
    assert _train(run, "--max-steps", "4") == 0  # logs every 2nd step
    # Resumed with no checkpoint before step 1000: the kill lands after steps logged since step 4.
    argv = [sys.executable, "-m", "diffscale", "train", "--out", str(run), "--resume", "auto",
            *micro_args("train.checkpoint_every=1000", steps=1000)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=dict(os.environ, PYTHONPATH=str(REPO / "src")))
    try:
        deadline = time.monotonic() + 240
        while _steps_logged_so_far(run) < 10 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _steps_logged_so_far(run) >= 10, "the resumed run never logged step 10"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert ckpt.step_of(ckpt.list_checkpoints(run)[-1]) == 4  # steps 5.. were logged, then lost
    assert _train(run, "--resume", "auto", "--max-steps", "8", steps=1000) == 0
    assert _metric_steps(run) == [2, 4, 6, 8]
    assert _tensorboard_steps(run) == [2, 4, 6, 8]
    assert _tensorboard_purges(run)[-1] == 5  # the last resume (from step 4) hid the killed run's steps 5..


def _event_files_in_reading_order(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "tb").iterdir())


def test_a_writer_opened_in_the_second_of_an_earlier_one_still_sorts_after_it(tmp_path):
    """TensorBoard applies event files in name order; a resume's file must come last even when
    the killed run opened its writer in the same second from a higher-sorting host and pid."""
    import io

    from rich.console import Console

    from diffscale.training.telemetry import Telemetry

    run = tmp_path / "run"
    (run / "tb").mkdir(parents=True)
    earlier = f"events.out.tfevents.{int(time.time()):010d}.zzzz.99999999.0"
    (run / "tb" / earlier).write_bytes(b"")
    console = Console(file=io.StringIO())
    telemetry = Telemetry(run, enabled=True, total_steps=10, start_step=4, console=console)
    telemetry.close()
    names = _event_files_in_reading_order(run)
    assert len(names) == 2 and names[0] == earlier


def test_an_event_file_from_a_clock_far_ahead_is_a_warning_not_a_long_wait(tmp_path):
    import io

    from rich.console import Console

    from diffscale.training.telemetry import Telemetry

    run = tmp_path / "run"
    (run / "tb").mkdir(parents=True)
    (run / "tb" / f"events.out.tfevents.{int(time.time()) + 600:010d}.other.1.0").write_bytes(b"")
    out = io.StringIO()
    telemetry = Telemetry(run, enabled=True, total_steps=10, start_step=0, console=Console(file=out, width=400))
    telemetry.close()
    assert "s in this host's future" in out.getvalue() and "clocks differ between nodes" in out.getvalue()
