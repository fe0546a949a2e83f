"""``diffscale train --data spool:DIR``: a follower that trains on what a simulation spools,
waits (saying so) while the buffer fills, skips bad files, stops cleanly while waiting and
resumes bit for bit."""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from diffscale.cli import main
from diffscale.data.device_loader import DataPosition
from diffscale.data.feed import Feed
from diffscale.data.locations import DEFAULT_CAPACITY, parse_spool_spec
from diffscale.errors import UserError
from diffscale.runtime import checkpoint as ckpt
from diffscale.runtime.signals import EXIT_REQUEUE
from diffscale.tasks.fields.buffer import BufferPolicy, BufferSpec, ReplayBuffer
from diffscale.tasks.fields.data import FieldGenerator
from diffscale.tasks.fields.follow import SpoolBatcher
from diffscale.tasks.fields.source import EndHow
from diffscale.tasks.fields.spool import SpoolReader, SpoolWriter

SMALL = ["--preset", "field-icon", "--device", "cpu"]
for _item in ("model.hidden=32", "model.depth=1", "model.embed_dim=16", "train.steps=40", "train.log_every=10",
              "train.checkpoint_every=20", "train.sample_count=4", "train.sample_steps=3", "optim.warmup_steps=2",
              "train.seed=3"):
    SMALL += ["--set", _item]

# The simulation: output steps of 80 cells, one of them written with the wrong condition size.
WRITER = """
import sys, time
from diffscale.tasks.fields.data import FieldGenerator
from diffscale.tasks.fields.spool import SpoolWriter
writer, generator = SpoolWriter(sys.argv[1]), FieldGenerator()
for step in range(7):
    cond, x = generator.sample(80, seed=step)
    writer.write(cond.numpy()[:, :6] if step == 3 else cond.numpy(), x.numpy(), sim_time=600.0 * step)
    time.sleep(0.3)
"""


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="200", OMP_NUM_THREADS="1")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


def _same_state(a: Path, b: Path) -> None:
    """The newest checkpoints of two runs hold the same step, weights, EMA, optimizer and task state."""
    first, second = (ckpt.load_checkpoint(ckpt.list_checkpoints(r)[-1]) for r in (a, b))
    assert first.step == second.step
    for part in ("model", "ema", "task"):
        one, two = getattr(first, part), getattr(second, part)
        assert one.keys() == two.keys() and all(torch.equal(one[k], two[k]) for k in one), part
    moments = [(k, s) for k, state in first.optimizer["state"].items() for s in ("exp_avg", "exp_avg_sq")]
    assert all(torch.equal(first.optimizer["state"][k][s], second.optimizer["state"][k][s]) for k, s in moments)
    assert first.meta.data_position == second.meta.data_position


def test_a_follower_waits_for_a_writer_process_trains_and_resumes_bit_for_bit(tmp_path):
    spool, run = tmp_path / "spool", tmp_path / "follower"
    spool.mkdir()
    follower = subprocess.Popen([sys.executable, "-m", "diffscale", "train", "--data", f"spool:{spool}:480",
                                 "--out", str(run), *SMALL], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=_env())
    assert follower.stdout is not None
    seen = []
    for line in follower.stdout:  # the simulation starts once the trainer waits for it
        seen.append(line)
        if "waiting for data" in line:
            break
    writer = subprocess.run([sys.executable, "-c", WRITER, str(spool)], env=_env(), capture_output=True, text=True,
                            timeout=300)
    assert writer.returncode == 0, writer.stderr
    log = "".join(seen) + follower.communicate(timeout=300)[0]
    assert follower.returncode == 0, log
    assert f"waiting for data: buffer 0/480 samples (0 spool files) from {spool}" in log
    assert ("warning: skipped spool file 0000000003.npz: cond (80, 6) and x (80, 256) do not fit the task (cond n x "
            "7, x n x 256) -- the simulation must pass arrays of those shapes to SpoolWriter.write" in log)
    assert "(1 skipped so far)" in log
    assert f"buffer full: 480 samples from 6 spool files of {spool}; training" in log and "done: 40 steps" in log
    records = [line for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any('"kind": "waiting"' in r and '"ready_at": 480' in r for r in records)
    state = ckpt.load_checkpoint(ckpt.list_checkpoints(run)[-1])
    assert state.task["buffer_counters"].tolist() == [480, 480, 6, 7]  # size, seen, files, spool cursor
    assert state.task["stats_fitted"].item() == 1 and state.task["buffer_time"].max().item() == 3600.0

    # The same spool followed again, interrupted halfway and resumed: exactly the live follower's run. Both
    # run in processes with the follower's environment: a different CPU thread count changes float sums.
    again = tmp_path / "resumed"
    for extra in (["--max-steps", "20"], ["--resume", "auto"]):
        done = subprocess.run([sys.executable, "-m", "diffscale", "train", "--data", f"spool:{spool}:480", "--out",
                               str(again), *extra, *SMALL], env=_env(), capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
    _same_state(run, again)


def _write(writer: SpoolWriter, steps: range) -> None:
    generator = FieldGenerator()
    for step in steps:
        cond, x = generator.sample(80, seed=step)
        writer.write(cond.numpy(), x.numpy(), sim_time=600.0 * step)


def _stop_once_waiting(run: Path) -> None:
    """What SLURM's warning signal does before the time limit, once ``run`` waits for data."""
    def stop() -> None:
        metrics, deadline = run / "metrics.jsonl", time.monotonic() + 300
        while time.monotonic() < deadline:
            if metrics.is_file() and '"kind": "waiting"' in metrics.read_text():
                os.kill(os.getpid(), signal.SIGUSR2)
                return
            time.sleep(0.05)

    threading.Thread(target=stop, daemon=True).start()


def test_a_stop_while_waiting_checkpoints_and_the_resumed_run_reads_on(tmp_path, capsys):
    spool, run = tmp_path / "spool", tmp_path / "run"
    writer = SpoolWriter(spool)
    _write(writer, range(2))
    _stop_once_waiting(run)
    assert main(["train", "--data", f"spool:{spool}:480", "--out", str(run), *SMALL]) == EXIT_REQUEUE
    out = capsys.readouterr().err
    assert "waiting for data: buffer 160/480 samples (2 spool files)" in out
    assert "stop requested (SIGUSR2) while waiting for data (buffer 160/480 samples): writing a checkpoint" in out
    state = ckpt.load_checkpoint(ckpt.list_checkpoints(run)[-1])
    assert state.step == 0 and state.task["buffer_counters"].tolist() == [160, 160, 2, 2]

    _write(writer, range(2, 6))  # the simulation went on meanwhile
    assert main(["train", "--data", f"spool:{spool}:480", "--out", str(run), "--resume", "auto", *SMALL]) == 0
    out = capsys.readouterr().err
    assert "resumed from step 0" in out and "buffer full: 480 samples from 6 spool files" in out
    state = ckpt.load_checkpoint(ckpt.list_checkpoints(run)[-1])
    assert state.step == 40 and state.task["buffer_counters"].tolist() == [480, 480, 6, 6]


def test_a_follower_resumed_with_a_larger_buffer_keeps_its_rows_and_waits_until_it_is_full(tmp_path, capsys):
    spool, run = tmp_path / "spool", tmp_path / "run"
    writer = SpoolWriter(spool)
    _write(writer, range(4))  # 320 samples: spool:DIR:160 keeps the newest 160
    assert main(["train", "--data", f"spool:{spool}:160", "--out", str(run), "--max-steps", "20", *SMALL]) == 0
    assert "buffer full: 160 samples from 4 spool files" in capsys.readouterr().err

    _write(writer, range(4, 6))
    _stop_once_waiting(run)
    args = ["train", "--data", f"spool:{spool}:480", "--out", str(run), "--resume", "auto", *SMALL]
    assert main(args) == EXIT_REQUEUE
    out = capsys.readouterr().err
    assert "resumed from step 20" in out and "waiting for data: buffer 320/480 samples (6 spool files)" in out
    assert "buffer full" not in out
    state = ckpt.load_checkpoint(ckpt.list_checkpoints(run)[-1])
    assert state.step == 20 and state.task["buffer_counters"].tolist() == [320, 480, 6, 6]
    assert state.task["buffer_time"].tolist() == [1200.0] * 80 + [1800.0] * 80 + [2400.0] * 80 + [3000.0] * 80

    _write(writer, range(6, 8))
    assert main(args) == 0
    assert "buffer full: 480 samples from 8 spool files" in capsys.readouterr().err
    state = ckpt.load_checkpoint(ckpt.list_checkpoints(run)[-1])
    assert state.step == 40 and state.task["buffer_counters"].tolist() == [480, 640, 8, 8]


def test_spool_sources_and_their_messages(tmp_path, capsys):
    assert parse_spool_spec("spool:/scratch/a:b/spool:960") == parse_spool_spec("spool:/scratch/a:b/spool:960")
    assert parse_spool_spec("spool:/scratch/a:b/spool").capacity == DEFAULT_CAPACITY
    assert str(parse_spool_spec("spool:/scratch/a:b/spool:960").directory) == "/scratch/a:b/spool"
    for spec in ("spool:", "spool:/x:0"):
        with pytest.raises(UserError, match="is not a spool directory -- write spool:DIR or spool:DIR:N"):
            parse_spool_spec(spec)
    absent = tmp_path / "absent"
    assert main(["train", "--data", f"spool:{absent}", "--out", str(tmp_path / "run"), *SMALL]) == 2
    assert capsys.readouterr().err == (f"error: spool directory '{absent}' does not exist -- check the path given to "
                                       "--data spool:DIR, or create it (the simulation's SpoolWriter creates it when "
                                       "it starts)\n")
    absent.mkdir()
    assert main(["train", "--data", f"spool:{absent}:8", "--out", str(tmp_path / "run"), *SMALL]) == 2
    assert "keeps 8 samples, fewer than one effective batch of 16" in capsys.readouterr().err


def test_each_skipped_file_is_reported_with_the_count_up_to_it(tmp_path):
    writer = SpoolWriter(tmp_path)
    _write(writer, range(1))
    np.savez(tmp_path / "0000000001.npz", cond=np.ones((2, 6)), x=np.ones((2, 256)), sim_time=1.0)
    (tmp_path / "0000000002.npz").write_text("not an archive")
    np.savez(tmp_path / "0000000003.npz", cond=np.ones((2, 7)), x=np.ones((2, 255)), sim_time=1.0)
    _write(SpoolWriter(tmp_path), range(4, 5))
    reports: list[tuple[str, dict]] = []
    buffer = ReplayBuffer(BufferSpec(BufferPolicy.FIFO, 480), 7, (256,), torch.device("cpu"))
    batcher = SpoolBatcher(buffer, SpoolReader(tmp_path, 7, (256,)), 16, 0, torch.device("cpu"), DataPosition(),
                           Feed(report=lambda line, record: reports.append((line, record))), on_ready=lambda: None)
    batcher.ingest()  # one poll finds all five files
    skipped = [(line, record["skipped_files"]) for line, record in reports if "skipped_files" in record]
    assert [(line.split(": ")[1], line.rpartition(" (")[2], count) for line, count in skipped] == [
        ("skipped spool file 0000000001.npz", "1 skipped so far)", 1),
        ("skipped spool file 0000000002.npz", "2 skipped so far)", 2),
        ("skipped spool file 0000000003.npz", "3 skipped so far)", 3)]
    assert buffer.pushes == 2


def test_the_newest_file_is_read_again_while_it_may_still_be_written(tmp_path):
    writer = SpoolWriter(tmp_path)
    _write(writer, range(2))
    whole = (tmp_path / "0000000001.npz").read_bytes()
    (tmp_path / "0000000001.npz").write_bytes(whole[: len(whole) // 2])  # a writer that does not rename
    reader = SpoolReader(tmp_path, 7, (256,))
    assert [c.sequence for c in reader.poll()] == [0] and reader.next == 1 and reader.skipped == []
    (tmp_path / "0000000001.npz").write_bytes(whole)
    assert [c.sequence for c in reader.poll()] == [1] and reader.skipped == []
    (tmp_path / "0000000002.npz").write_bytes(whole[:100])
    old = time.time() - 3600
    os.utime(tmp_path / "0000000002.npz", (old, old))  # unreadable for an hour: the writer is gone
    assert reader.poll() == [] and reader.next == 3 and reader.skipped[0].startswith("0000000002.npz: not a complete")
    (tmp_path / "0000000003.npz").write_bytes(b"PK\x03\x04")
    np.savez(tmp_path / "0000000004.npz", cond=np.ones((2, 7)), x=np.ones((2, 256)), sim_time=1.0)
    assert [c.sequence for c in reader.poll()] == [4] and len(reader.skipped) == 2  # a later file exists: skipped


# A simulation that ends: FILES output steps, then the end marker with STATUS (as a coupled
# simulation's job script writes it once the command has ended).
ENDING_WRITER = """
import sys, time
from diffscale.tasks.fields.data import FieldGenerator
from diffscale.tasks.fields.spool import SpoolWriter
writer, generator = SpoolWriter(sys.argv[1]), FieldGenerator()
for step in range(int(sys.argv[2])):
    cond, x = generator.sample(80, seed=step)
    writer.write(cond.numpy(), x.numpy(), sim_time=600.0 * step)
    time.sleep(0.2)
writer.end(int(sys.argv[3]))
"""


def _events(run: Path, kind: str) -> list[dict]:
    import json

    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if r.get("kind") == kind]


def test_a_follower_ends_once_its_writer_process_has_ended_and_its_files_are_trained_on(tmp_path):
    spool, run = tmp_path / "spool", tmp_path / "follower"
    spool.mkdir()
    long = [*SMALL, "--set", "train.steps=1000000"]  # a target the data would never reach
    follower = subprocess.Popen([sys.executable, "-m", "diffscale", "train", "--data", f"spool:{spool}:480",
                                 "--out", str(run), *long], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=_env())
    writer = subprocess.run([sys.executable, "-c", ENDING_WRITER, str(spool), "6", "0"], env=_env(),
                            capture_output=True, text=True, timeout=300)
    assert writer.returncode == 0, writer.stderr
    out, _ = follower.communicate(timeout=600)
    assert follower.returncode == 0, out
    ended = _events(run, "source_ended")
    assert len(ended) == 1 and ended[0]["exit_status"] == 0 and ended[0]["files"] == 6, ended
    one_pass = 480 // 16  # the final buffer's samples over the global batch
    assert ended[0]["end_after_steps"] == one_pass
    final = ckpt.load_checkpoint(ckpt.list_checkpoints(run)[-1])
    assert final.step == ended[0]["step"] + one_pass
    assert f"after 6 spool files: training {one_pass} more steps" in " ".join(out.split())
    assert f"done: {final.step} steps" in out
    assert final.task["buffer_counters"].tolist()[:3] == [480, 480, 6]


@pytest.mark.parametrize("files, status, message", [
    (2, 3, "failed (exit status 3) after 2 spool files; checkpointed at step 0 -- see the simulation's log"),
    (2, 0, "ended (exit status 0) after 160 samples in 2 spool files, fewer than the 480 the buffer waits for"),
])
def test_a_failed_or_short_simulation_ends_the_waiting_follower_with_its_state(files, status, message, tmp_path,
                                                                                capsys):
    spool, run = tmp_path / "spool", tmp_path / "follower"
    writer = subprocess.run([sys.executable, "-c", ENDING_WRITER, str(spool), str(files), str(status)], env=_env(),
                            capture_output=True, text=True, timeout=300)
    assert writer.returncode == 0, writer.stderr
    assert main(["train", "--data", f"spool:{spool}:480", "--out", str(run), *SMALL]) == 2
    said = capsys.readouterr().err  # the progress, then the one error line
    err = said.rstrip().splitlines()[-1]
    assert err.startswith(f"error: the simulation writing {spool} ") and message in err, said
    assert said.count("error:") == 1
    assert ckpt.list_checkpoints(run)  # what it had is kept
    assert main(["status", str(run)]) == 0
    status = capsys.readouterr().out
    assert f"stopped: the simulation writing {spool} {message.split(';')[0]}; it ended at 20" in status, status


@pytest.mark.parametrize("world_size", [1, 2])
def test_the_end_marker_read_before_the_listing_ends_the_stream_after_one_pass(world_size, tmp_path):
    """Rank 0's end status travels with its chunks (``Feed.share``: the identity for the rank that
    broadcasts), and the stream ends exactly one pass over the final buffer after it."""
    from diffscale.data.feed import DataEnded
    from diffscale.tasks.fields.spool import read_end, write_end

    writer = SpoolWriter(tmp_path)
    _write(writer, range(0, 3))  # 240 samples
    buffer = ReplayBuffer(BufferSpec(BufferPolicy.FIFO, 160), 7, (256,), torch.device("cpu"))
    batcher = SpoolBatcher(buffer, SpoolReader(tmp_path, 7, (256,)), 16, 0, torch.device("cpu"), DataPosition(),
                           Feed(world_size=world_size), on_ready=lambda: None)
    for _ in range(3):
        batcher.next_indices()
    assert batcher.source_end is None and read_end(tmp_path) is None
    _write(writer, range(3, 4))
    writer.end(0)
    batcher._next_poll = 0.0  # the next draw polls (the poll interval is a wall-clock rate limit)
    batcher.position = DataPosition(0, 100)  # several ranks share new data at multiples of SHARE_EVERY
    drawn = 0
    with pytest.raises(DataEnded) as ended:
        while drawn <= 100:
            batcher.next_indices()
            drawn += 1
    assert drawn == 160 // 16  # one pass over the final buffer, then the end
    assert ended.value.ok and batcher.source_end is not None and buffer.pushes == 4
    assert (batcher.source_end.how, batcher.source_end.exit_status) == (EndHow.EXITED, 0)
    assert "has ended (exit status 0) and its last spool file was trained on (4 files)" in str(ended.value)
    write_end(tmp_path, 5)
    assert read_end(tmp_path) == 5
