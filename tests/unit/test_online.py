"""Online training: the replay buffer, the spool format, and OnlineTrainer driven by a fake
simulation loop (push -> train -> sample -> checkpoint -> restart -> resume, bit for bit)."""

import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from diffscale.cli import main
from diffscale.config import deep_merge, from_dict
from diffscale.config.presets import get_preset
from diffscale.errors import UserError
from diffscale.online import OnlineTrainer
from diffscale.online.trainer import BACKGROUND_SWITCH_INTERVAL_S
from diffscale.runtime import checkpoint as ckpt
from diffscale.tasks.fields.buffer import (
    BufferBatcher,
    BufferPolicy,
    BufferSpec,
    ReplayBuffer,
    as_chunk,
    parse_buffer_spec,
)
from diffscale.tasks.fields.data import FieldGenerator
from diffscale.tasks.fields.spool import SpoolReader, SpoolWriter

from helpers import micro_args

CPU = torch.device("cpu")


def _cfg(**train):
    small = {"model": {"hidden": 32, "depth": 1, "embed_dim": 16},
             "train": {"batch_per_gpu": 16, "seed": 3, **train}, "runtime": {"device": "cpu"}}
    return from_dict(deep_merge(get_preset("field-icon").to_dict(), small))


class FakeSimulation:
    """Output steps of 80 cells (7 coarse -> 256 fine values), from the built-in generator."""

    def __init__(self, seed: int = 0) -> None:
        self.generator = FieldGenerator()
        self.seed = seed
        self.step = 0

    def output(self) -> tuple[np.ndarray, np.ndarray, float]:
        cond, x = self.generator.sample(80, seed=self.seed * 10_000 + self.step)
        self.step += 1
        return cond.numpy(), x.numpy(), 600.0 * self.step


def _rows(n: int, start: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    values = torch.arange(start, start + n, dtype=torch.float32)
    return values[:, None].repeat(1, 2), values[:, None].repeat(1, 3), values.double()


# -- buffer -----------------------------------------------------------------------------------
def test_fifo_keeps_the_newest_samples():
    buffer = ReplayBuffer(BufferSpec(BufferPolicy.FIFO, 5), 2, (3,), CPU)
    buffer.add(*_rows(3))
    buffer.add(*_rows(3, start=3))
    assert (buffer.size, buffer.seen, buffer.pushes) == (5, 6, 2)
    assert sorted(buffer.x[:, 0].tolist()) == [1, 2, 3, 4, 5]
    buffer.add(*_rows(12, start=6))  # a chunk longer than the buffer: its newest five stay
    assert sorted(buffer.x[:, 0].tolist()) == [13, 14, 15, 16, 17] and buffer.latest_time() == 17


def test_reservoir_keeps_a_uniform_sample_and_resumes_exactly():
    spec = BufferSpec(BufferPolicy.RESERVOIR, 200)
    buffer = ReplayBuffer(spec, 2, (3,), CPU, seed=1)
    for start in range(0, 1000, 10):
        buffer.add(*_rows(10, start))
        if start == 500:
            copy = ReplayBuffer(spec, 2, (3,), CPU)
            copy.load_state_tensors(buffer.state_tensors())
    for start in range(510, 1000, 10):
        copy.add(*_rows(10, start))
    assert torch.equal(copy.x, buffer.x) and copy.seen == buffer.seen == 1000
    kept = buffer.x[:, 0]
    assert len(set(kept.tolist())) == 200
    assert 400 < kept.mean() < 600 and (kept < 500).sum() > 70  # old and new samples alike, not the newest


@pytest.mark.parametrize("saved_before_buffer_head", [False, True])
def test_a_fifo_resumed_larger_keeps_its_rows_oldest_first_and_fills_after_them(saved_before_buffer_head):
    small = ReplayBuffer(BufferSpec(BufferPolicy.FIFO, 5), 2, (3,), CPU)
    for start in range(100, 112, 3):  # samples 100..111: it keeps 107..111, wrapped round its slots
        small.add(*_rows(3, start))
    state = small.state_tensors()
    if saved_before_buffer_head:  # a checkpoint of an older diffscale
        del state["buffer_head"]
    larger = ReplayBuffer(BufferSpec(BufferPolicy.FIFO, 8), 2, (3,), CPU)
    larger.load_state_tensors(state)
    assert larger.x[:5, 0].tolist() == [107, 108, 109, 110, 111] and (larger.size, larger.seen) == (5, 12)
    larger.add(*_rows(2, 112))
    assert larger.describe() == "fifo buffer 7/8 samples (5 pushes, 14 seen)"
    assert larger.x[:7, 0].tolist() == larger.sim_time[:7].tolist() == list(range(107, 114))
    larger.add(*_rows(3, 114))  # full: the oldest rows make room
    assert sorted(larger.x[:, 0].tolist()) == list(range(109, 117))

    same = ReplayBuffer(BufferSpec(BufferPolicy.FIFO, 8), 2, (3,), CPU)  # resumed at its own capacity: unchanged
    same.load_state_tensors(larger.state_tensors())
    for buffer in (larger, same):
        buffer.add(*_rows(3, 117))
    assert all(torch.equal(same.state_tensors()[k], v) for k, v in larger.state_tensors().items())
    assert torch.equal(same.x, larger.x)


def test_a_reservoir_resumed_larger_keeps_its_rows_and_then_samples_as_if_larger_throughout():
    small = ReplayBuffer(BufferSpec(BufferPolicy.RESERVOIR, 200), 2, (3,), CPU, seed=1)
    for start in range(1, 1001, 10):  # samples 1..1000 (a zero would look like an empty row)
        small.add(*_rows(10, start))
    larger = ReplayBuffer(BufferSpec(BufferPolicy.RESERVOIR, 400), 2, (3,), CPU)
    larger.load_state_tensors(small.state_tensors())
    assert torch.equal(larger.x[:200], small.x) and (larger.size, larger.seen) == (200, 1000)
    larger.add(*_rows(10, 1001))
    assert larger.size == 210 and larger.x[200:210, 0].tolist() == list(range(1001, 1011))  # after the kept rows
    for start in range(1011, 1201, 10):
        larger.add(*_rows(10, start))
    assert torch.equal(larger.x[:200], small.x) and sorted(larger.x[200:, 0].tolist()) == list(range(1001, 1201))
    for start in range(1201, 2401, 10):
        larger.add(*_rows(10, start))
    # A new sample enters as in a reservoir of 400 that saw all 2400 (drawn against every sample
    # seen): about half of what it holds came in the second half, 1201..2400.
    assert larger.size == 400 and 170 < int((larger.x[:, 0] > 1200).sum()) < 230
    same = ReplayBuffer(BufferSpec(BufferPolicy.RESERVOIR, 400), 2, (3,), CPU)
    same.load_state_tensors(larger.state_tensors())
    for buffer in (larger, same):
        buffer.add(*_rows(10, 2401))
    assert torch.equal(same.x, larger.x) and same.seen == larger.seen == 2410


def test_buffer_specs_chunks_and_batches():
    assert parse_buffer_spec("online:reservoir:48").capacity == 48
    with pytest.raises(UserError, match="is not an online buffer -- write online:POLICY:N with POLICY one of fifo, "
                                        "reservoir"):
        parse_buffer_spec("online:lifo:48")
    c, x, t, dropped = as_chunk(np.ones((4, 7)), np.stack([np.ones(256)] * 3 + [np.full(256, np.nan)]), 5.0, 7, (256,))
    assert (c.shape, x.shape, dropped, t.tolist()) == ((3, 7), (3, 256), 1, [5.0] * 3)
    with pytest.raises(UserError, match=r"pushed cond \(4, 6\) and x \(4, 256\) do not fit the task \(cond n x 7, x n"):
        as_chunk(np.ones((4, 6)), np.ones((4, 256)), 0.0, 7, (256,))
    buffer = ReplayBuffer(BufferSpec(BufferPolicy.FIFO, 50), 2, (3,), CPU)
    batcher = BufferBatcher(buffer, 8, seed=0, device=CPU)
    with pytest.raises(UserError, match="buffer is empty"):
        batcher.next_indices()
    buffer.add(*_rows(20))
    first = batcher.next_indices()
    assert first.max() < 20 and batcher.position.offset == 1
    again = BufferBatcher(buffer, 8, seed=0, device=CPU)
    assert torch.equal(again.next_indices(), first)  # a batch is a function of (seed, position)


# -- spool ------------------------------------------------------------------------------------
def test_spool_files_are_read_once_in_order_and_bad_ones_skipped(tmp_path):
    writer = SpoolWriter(tmp_path / "spool")
    for step in range(3):
        writer.write(np.full((4, 7), step), np.full((4, 256), step), sim_time=60.0 * step)
    (tmp_path / "spool" / ".0000000003.npz.tmp").write_bytes(b"half a file")  # a write in progress
    (tmp_path / "spool" / "notes.txt").write_text("not data")
    reader = SpoolReader(tmp_path / "spool", 7, (256,))
    chunks = reader.poll()
    assert [c.sequence for c in chunks] == [0, 1, 2] and chunks[2].sim_time.tolist() == [120.0] * 4
    assert reader.poll() == [] and reader.next == 3
    np.savez(tmp_path / "spool" / "0000000003.npz", cond=np.ones((2, 5)), x=np.ones((2, 256)), sim_time=0.0)
    (tmp_path / "spool" / "0000000004.npz").write_bytes(b"PK\x03\x04 truncated")
    (tmp_path / "spool" / "0000000005.npz").write_text("a note saved under a spool file's name")
    assert SpoolWriter(tmp_path / "spool").write(np.ones((1, 7)), np.ones((1, 256)), 1.0).name == "0000000006.npz"
    assert [c.sequence for c in reader.poll()] == [6]
    assert reader.skipped == [
        "0000000003.npz: cond (2, 5) and x (2, 256) do not fit the task (cond n x 7, x n x 256) -- the simulation "
        "must pass arrays of those shapes to SpoolWriter.write",
        "0000000004.npz: not a complete .npz archive (File is not a zip file)",
        "0000000005.npz: not a spool .npz archive (not a zip file: write spool files with SpoolWriter or numpy.savez)"]
    with pytest.raises(UserError, match="spool directory .* does not exist"):
        SpoolReader(tmp_path / "absent", 7, (256,)).poll()


# One rank of a simulation: writes STEPS output steps marked with its rank, starting when GO exists.
RANK_WRITER = """
import sys, time
from pathlib import Path
import numpy as np
from diffscale.tasks.fields.spool import SpoolWriter
spool, rank, steps, go = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
writer = SpoolWriter(spool)  # every rank sees the same empty directory: all would start at 0000000000
(go.parent / f"ready-{rank}").touch()
while not go.exists():
    time.sleep(0.001)
for step in range(steps):
    writer.write(np.full((2, 7), rank), np.full((2, 256), step), sim_time=float(step))
"""


def test_writer_processes_sharing_a_spool_lose_no_file(tmp_path):
    spool, ranks, steps = tmp_path / "spool", 4, 25
    spool.mkdir()
    writers = [subprocess.Popen([sys.executable, "-c", RANK_WRITER, str(spool), str(rank), str(steps),
                                 str(tmp_path / "go")]) for rank in range(ranks)]
    while len(list(tmp_path.glob("ready-*"))) < ranks and all(w.poll() is None for w in writers):
        time.sleep(0.01)
    (tmp_path / "go").touch()  # all at once
    reader, chunks = SpoolReader(spool, 7, (256,)), []
    while any(w.poll() is None for w in writers):  # the follower reads while they write
        chunks += reader.poll()
        time.sleep(0.01)
    chunks += reader.poll()
    assert [w.returncode for w in writers] == [0] * ranks
    names = sorted(p.name for p in spool.iterdir())  # no temp left; the writers' heartbeat beside the files
    assert names == [f"{n:010d}.npz" for n in range(ranks * steps)] + ["heartbeat.json"]
    assert reader.skipped == [] and [c.sequence for c in chunks] == list(range(ranks * steps))
    written = [(int(c.cond[0, 0]), int(c.x[0, 0])) for c in chunks]  # (rank, step) of each file, in file order
    assert sorted(written) == [(rank, step) for rank in range(ranks) for step in range(steps)]
    assert all([s for r, s in written if r == rank] == list(range(steps)) for rank in range(ranks))


# -- OnlineTrainer ------------------------------------------------------------------------------
def _weights(trainer: OnlineTrainer) -> list[torch.Tensor]:
    return [p.detach().clone() for p in [*trainer.run_state.net.parameters(), *trainer.run_state.ema.parameters()]]


def test_push_train_sample_checkpoint_and_resume_bit_for_bit(tmp_path):
    sim = FakeSimulation()
    trainer = OnlineTrainer(tmp_path / "run", _cfg(), capacity=480, ready_at=240)
    trainer.push(*sim.output())
    waiting = trainer.train_for(steps=5)
    assert waiting["waiting"] and (waiting["buffer"], waiting["ready_at"]) == (80, 240)
    for _ in range(3):
        trainer.push(*sim.output())
    assert trainer.ready()
    assert trainer.train_for(steps=6)["steps"] == 6
    fields = trainer.sample(np.zeros((3, 7)), n_members=4, steps=5)
    assert fields.shape == (3, 4, 256) and np.isfinite(fields).all()
    trainer.push(*sim.output())  # pushed, not trained on yet: the checkpoint keeps it
    def restored(resumed: OnlineTrainer) -> None:
        assert resumed.run_state.step == 6 and resumed.buffer.size == 400 and resumed.buffer.latest_time() == 3000.0

    resumed = checkpoint_and_resume(trainer, sim, tmp_path / "run", steps=7, restored=restored)
    assert resumed.sample(np.zeros((3, 7)), n_members=4, steps=5).shape == (3, 4, 256)


def checkpoint_and_resume(trainer: OnlineTrainer, sim: FakeSimulation, run_dir, steps: int,
                          restored=lambda resumed: None) -> OnlineTrainer:
    """Checkpoint ``trainer``, then push two more outputs and train ``steps`` on it and on a
    trainer restarted from that checkpoint (a restarted simulation; ``restored`` checks it as
    loaded); asserts both end with the same weights and buffer to the bit, and returns the
    restarted one."""
    trainer.checkpoint()
    later = [sim.output() for _ in range(2)]
    for chunk in later:
        trainer.push(*chunk)
    trainer.train_for(steps=steps)
    expected, expected_buffer = _weights(trainer), trainer.buffer.state_tensors()
    # The first trainer goes on living here: the restarted one resumes a copy of its run (without
    # its lock), as a simulation restarted on another node would.
    restarted = Path(run_dir).with_name("restarted")
    shutil.copytree(run_dir, restarted, ignore=shutil.ignore_patterns("train.lock"))
    resumed = OnlineTrainer(restarted, _cfg(), capacity=480, ready_at=240)
    restored(resumed)
    for chunk in later:
        resumed.push(*chunk)
    resumed.train_for(steps=steps)
    assert all(torch.equal(a, b) for a, b in zip(_weights(resumed), expected, strict=True))
    assert all(torch.equal(resumed.buffer.state_tensors()[k], v) for k, v in expected_buffer.items())
    return resumed


def test_a_run_resumed_with_a_larger_buffer_keeps_its_rows_and_waits_until_it_holds_ready_at(tmp_path):
    sim = FakeSimulation()
    trainer = OnlineTrainer(tmp_path / "run", _cfg(), capacity=160)
    for _ in range(5):  # 400 samples seen, the newest 160 kept
        trainer.push(*sim.output())
    assert trainer.train_for(steps=2)["steps"] == 2
    trainer.checkpoint()
    trainer.close()
    resumed = OnlineTrainer(tmp_path / "run", _cfg(), capacity=480)
    resumed.push(*sim.output())
    assert not resumed.ready()  # ready_at: the 480 of a full buffer
    assert resumed.buffer.describe() == "fifo buffer 240/480 samples (6 pushes, 480 seen)"
    assert bool(resumed.buffer.x[:240].ne(0).any(1).all())  # no empty row among those it trains on
    assert resumed.buffer.sim_time[:240].tolist() == [2400.0] * 80 + [3000.0] * 80 + [3600.0] * 80  # oldest first
    waiting = resumed.train_for(steps=2)
    assert waiting["waiting"] and (waiting["buffer"], waiting["ready_at"], waiting["step"]) == (240, 480, 2)
    for _ in range(3):
        resumed.push(*sim.output())
    assert resumed.ready() and resumed.train_for(steps=2)["step"] == 4


def test_a_run_resumed_with_a_smaller_buffer_is_refused_with_the_size_it_needs(tmp_path):
    sim = FakeSimulation()
    trainer = OnlineTrainer(tmp_path / "run", _cfg(), capacity=240, ready_at=160)
    for _ in range(3):
        trainer.push(*sim.output())
    trainer.train_for(steps=1)
    trainer.checkpoint()
    trainer.close()
    with pytest.raises(UserError) as caught:
        OnlineTrainer(tmp_path / "run", _cfg(), capacity=160, ready_at=160)
    assert "the checkpoint's buffer (240 rows of (256,)) does not fit online:fifo:160" in str(caught.value)
    assert "resume with a buffer of at least 240 samples" in str(caught.value)


def test_background_training_between_pushes(tmp_path):
    sim = FakeSimulation()
    trainer = OnlineTrainer(tmp_path / "run", _cfg(), capacity=480, ready_at=160)
    interval = sys.getswitchinterval()
    trainer.start(steps_per_round=3)
    assert sys.getswitchinterval() == pytest.approx(min(interval, BACKGROUND_SWITCH_INTERVAL_S))  # push waits less
    for _ in range(4):
        trainer.push(*sim.output())  # the simulation carries on while the thread trains
    deadline = time.monotonic() + 300  # a guard against a hang, not a speed requirement
    while trainer.run_state.step < 6 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert trainer.sample(np.zeros((2, 7)), n_members=3, steps=4).shape == (2, 3, 256)
    trainer.stop()
    assert sys.getswitchinterval() == interval  # the simulation's interpreter as it was
    assert trainer.run_state.step >= 6 and trainer.buffer.pushes == 4
    assert ckpt.step_of(trainer.checkpoint()) == trainer.run_state.step


def test_calls_waiting_for_background_training_get_in_at_the_next_round(tmp_path):
    sim = FakeSimulation()
    trainer = OnlineTrainer(tmp_path / "run", _cfg(), capacity=160, ready_at=160)
    for _ in range(2):
        trainer.push(*sim.output())
    assert trainer.ready()
    trainer.sample(np.zeros((2, 7)), n_members=2, steps=2)  # a sampler to watch below
    rounds: list[int] = []  # one entry per training round started
    calls: list[int] = []  # for each call: the rounds started when it got the lock
    holds = {k: threading.Event() for k in range(3, 34, 3)}  # a lock that is not fair lets some calls in late
    train_round, save, sampler = trainer._train_round, trainer.run_state.save, trainer._sampler

    def round_held_until_a_call_waits(steps, seconds):
        rounds.append(len(rounds))
        if len(rounds) in holds:  # this round runs while sample() or checkpoint() waits for the lock
            holds[len(rounds)].set()
            while trainer._waiting == 0:
                time.sleep(0.001)
        return train_round(steps, seconds)

    def sampled(*args):
        calls.append(len(rounds))
        return sampler(*args)

    def saved(batcher):
        calls.append(len(rounds))
        save(batcher)

    trainer._train_round, trainer._sampler, trainer.run_state.save = round_held_until_a_call_waits, sampled, saved
    trainer.start(steps_per_round=1)
    for k in sorted(holds)[:-1]:
        assert holds[k].wait(timeout=300)  # a guard against a hang, not a speed requirement
        assert trainer.sample(np.zeros((2, 7)), n_members=2, steps=2).shape == (2, 2, 256)
    assert holds[33].wait(timeout=300)
    trainer.checkpoint()
    trainer.stop()
    assert calls == sorted(holds)  # each right after the round it waited for: no further round started first


def test_a_background_failure_names_the_call_that_caused_it(tmp_path, capsys):
    trainer = OnlineTrainer(tmp_path / "run", _cfg(), capacity=160, ready_at=80)
    trainer.follow(tmp_path / "absent")
    trainer.start()
    deadline = time.monotonic() + 300  # a guard against a hang, not a speed requirement
    while trainer.error is None and time.monotonic() < deadline:
        time.sleep(0.01)
    expected = (f"spool directory '{tmp_path / 'absent'}' does not exist -- start the simulation's writer first, or "
                "check the path given to OnlineTrainer.follow")
    with pytest.raises(UserError, match=re.escape(expected)):
        trainer.stop()
    said = "".join(capsys.readouterr().err.split())  # as one line, however the console wrapped it
    assert "".join(f"error: background training stopped: {expected}".split()) in said


def test_bad_input_never_stops_the_simulation_loop(tmp_path, capsys):
    trainer = OnlineTrainer(tmp_path / "run", _cfg(), capacity=160, ready_at=80)
    cond, x, _ = FakeSimulation().output()
    x[:5] = np.inf
    trainer.push(cond, x, 0.0)
    assert trainer.dropped_rows == 5 and "dropped 5 pushed rows holding NaN or inf" in capsys.readouterr().err
    with pytest.raises(UserError, match="do not fit the task"):
        trainer.push(cond[:, :6], x, 0.0)
    with pytest.raises(UserError, match="before the model trained on any data"):
        trainer.sample(cond, n_members=2, steps=3)
    with pytest.raises(UserError, match="needs steps or seconds"):
        trainer.train_for()
    with pytest.raises(UserError, match="train_for's steps=-5 is not a whole number of at least 1 -- pass steps=1"):
        trainer.train_for(steps=-5)
    with pytest.raises(UserError, match="push's sim_time=None is not a number -- pass the simulation time"):
        trainer.push(cond, x, sim_time=None)
    for sim_time in (float("nan"), float("inf"), np.float32("nan")):
        with pytest.raises(UserError, match=re.escape(f"push's sim_time={sim_time!r} is not a finite number -- pass")):
            trainer.push(cond, x, sim_time=sim_time)
    for wrong_x, what in [(x.astype(np.complex64), "complex numbers"), (x.astype(object), "Python objects"),
                          (x.astype(str), "strings"), (x.astype(bytes), "bytes")]:
        with pytest.raises(UserError, match=f"pushed x holds {what}.*, not real numbers -- push arrays of real"):
            trainer.push(cond, wrong_x, 0.0)
    with pytest.raises(UserError, match="pushed cond holds complex numbers"):
        trainer.push(cond + 1j, x, 0.0)
    assert trainer.buffer.size == 0 and len(trainer._pending) == 1  # none of them was taken
    trainer.push(torch.tensor(cond[5:10], requires_grad=True), torch.tensor(x[5:10]), 1.0)  # of an autograd graph
    expected = torch.tensor(x[5:10], dtype=torch.float32)
    assert trainer.ready() and torch.equal(trainer.buffer.x[75:80], expected) and trainer.buffer.size == 80
    for kwargs, message in [
            ({"ready_at": 8}, "ready_at=8 is below one batch of 16 samples -- pass ready_at from 16 to 160 "),
            ({"ready_at": 0}, "ready_at=0 is below one batch of 16 samples -- pass ready_at from 16 to 160 "),
            ({"ready_at": 200}, "ready_at=200 is more than the buffer's capacity of 160 samples -- pass ready_at from "
                                "16 to 160 "),
            ({"policy": "lifo"}, "policy='lifo' is not a buffer policy (did you mean 'fifo'?) -- pass policy= one of "
                                 "fifo, reservoir"),
            ({"capacity": 8}, "capacity=8 is below one batch of 16 samples -- pass capacity >= 16"),
            ({"capacity": 0}, "capacity=0 is below one batch of 16 samples -- pass capacity >= 16"),
            ({"capacity": 160.0}, "capacity=160.0 is not a whole number of samples -- pass capacity >= 16")]:
        with pytest.raises(UserError, match=re.escape(message)):
            OnlineTrainer(tmp_path / "other", _cfg(), **{"capacity": 160, **kwargs})
    assert not (tmp_path / "other").exists()


def test_a_run_directory_of_another_task_is_refused(tmp_path):
    run = tmp_path / "images"
    assert main(["train", "--out", str(run), *micro_args(steps=2)]) == 0
    with pytest.raises(UserError, match="holds checkpoints of a 'images' run"):
        OnlineTrainer(run, _cfg(), capacity=160, ready_at=80)


def test_a_field_run_trained_offline_is_refused_before_anything_is_written(tmp_path):
    run = tmp_path / "offline"
    args = ["--preset", "field-icon", "--device", "cpu", "--data", "builtin:fields:256"]
    for item in ("model.hidden=32", "model.depth=1", "model.embed_dim=16", "train.steps=2", "train.seed=3",
                 "train.checkpoint_every=2", "train.sample_count=4", "train.sample_steps=2", "optim.warmup_steps=1"):
        args += ["--set", item]
    assert main(["train", "--out", str(run), *args]) == 0
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    with pytest.raises(UserError, match=re.escape(
            f"'{run}' holds a run that was trained offline from builtin:fields:256; OnlineTrainer continues only runs "
            "it started -- start online training in a new run directory")):
        OnlineTrainer(run, _cfg(), capacity=160, ready_at=80)
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


WRITER = """
import sys
import numpy as np
from diffscale.tasks.fields.data import FieldGenerator
from diffscale.tasks.fields.spool import SpoolWriter
writer, generator = SpoolWriter(sys.argv[1]), FieldGenerator()
for step in range(6):
    cond, x = generator.sample(80, seed=step)
    writer.write(cond.numpy(), x.numpy(), sim_time=600.0 * step)
"""


def test_a_follower_trains_on_what_a_writer_process_spools(tmp_path):
    spool = tmp_path / "spool"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(spool)])
    trainer = OnlineTrainer(tmp_path / "run", _cfg(), capacity=480, ready_at=160)
    spool.mkdir(exist_ok=True)
    trainer.follow(spool)
    while writer.poll() is None or trainer.buffer.pushes < 6:  # trains as the files arrive
        trainer.train_for(steps=2)
        assert writer.poll() in (None, 0)
    assert trainer.buffer.size == 480 and trainer.buffer.latest_time() == 3000.0 and trainer.run_state.step > 0
    trainer.checkpoint()
    trainer.close()
    resumed = OnlineTrainer(tmp_path / "run", _cfg(), capacity=480, ready_at=160)
    resumed.follow(spool)
    resumed.train_for(steps=1)
    assert resumed.buffer.pushes == 6  # the spool position came back with the buffer: nothing read twice
