"""The per-call fast paths of online field training, checked on the CPU against the plain
ones: batches drawn straight into a recorded step's inputs, the cheap check of the task's
storages before a replay, ``push`` as a copy into a queue, and ``sample`` through staging
buffers (the same samples as ``FieldTask.sample_for``)."""

import copy
import re

import numpy as np
import pytest
import torch
from test_online import FakeSimulation, _cfg, checkpoint_and_resume

from diffscale.errors import UserError
from diffscale.online import OnlineTrainer
from diffscale.tasks.fields.buffer import as_arrays, as_chunk
from diffscale.training import step_graph
from diffscale.training.step import step_seed
from diffscale.training.step_graph import WholeStepGraph, _StorageWatch, _task_storages


def _trainer(tmp_path, name="run", **kw):
    trainer = OnlineTrainer(tmp_path / name, _cfg(), capacity=480, ready_at=240, **kw)
    sim = FakeSimulation()
    for _ in range(4):
        trainer.push(*sim.output())
    assert trainer.ready()
    return trainer, sim


def test_a_draw_into_a_recorded_steps_inputs_is_the_same_draw(tmp_path):
    trainer, _ = _trainer(tmp_path)
    task, batcher = trainer.task, trainer.runner.batcher
    gen = torch.Generator().manual_seed(step_seed(3, 7))
    fresh_batcher = copy.deepcopy(batcher)
    fresh = task.draw(fresh_batcher.next_indices(), gen)
    inputs = {k: torch.full_like(v, -1) for k, v in fresh.items()}
    gen.manual_seed(step_seed(3, 7))
    drawn = task.draw(batcher.next_indices(inputs["indices"]), gen, out=inputs)
    assert all(drawn[k] is inputs[k] and torch.equal(drawn[k], fresh[k]) for k in fresh)
    assert batcher.position == fresh_batcher.position


class _FakeGraph:
    """Stands in for a recorded CUDA graph on the CPU: a replay keeps the inputs it saw."""

    def __init__(self, inputs: dict[str, torch.Tensor]) -> None:
        self.inputs, self.seen = inputs, []

    def replay(self) -> None:
        self.seen.append({k: v.clone() for k, v in self.inputs.items()})


def test_recorded_steps_replay_the_batches_eager_steps_would_draw(tmp_path):
    trainer, _ = _trainer(tmp_path)
    runner, task = trainer.runner, trainer.task
    expected_batcher, generator = copy.deepcopy(runner.batcher), torch.Generator()
    expected = []
    for step in range(trainer.run_state.step, trainer.run_state.step + 5):
        generator.manual_seed(step_seed(trainer.run_state.cfg.train.seed, step))
        expected.append(task.draw(expected_batcher.next_indices(), generator))
    whole = WholeStepGraph(trainer.run_state, runner._whole_step)
    whole.batch = {k: torch.zeros_like(v) for k, v in expected[0].items()}
    whole.graph = fake = _FakeGraph(whole.batch)  # type: ignore[assignment]
    whole._watch = _StorageWatch(task)
    runner.whole = whole
    for _ in range(5):
        runner.step()
    assert whole.lr.item() == pytest.approx(trainer.run_state.opt.param_groups[0]["lr"])
    assert len(fake.seen) == 5 and all(torch.equal(seen[k], want[k])
                                       for seen, want in zip(fake.seen, expected, strict=True) for k in want)


def test_the_storage_watch_answers_as_the_full_walk(monkeypatch):
    monkeypatch.setattr(step_graph, "_watched", lambda item: isinstance(item, torch.Tensor))  # CPU tensors count

    class Stats:
        def __init__(self) -> None:
            self.mean, self.std = torch.zeros(3), torch.ones(3)

    class Task:
        def __init__(self) -> None:
            self.data, self.stats, self.name = torch.arange(6.0), Stats(), "fields"

    task = Task()
    watch = _StorageWatch(task)
    assert watch.unchanged()
    task.name = "renamed"  # rebound, but no tensor moved: the same answer as the walk, no re-record
    assert watch.unchanged() and _task_storages(task) == watch.storages
    task.data = task.data[:]  # a new tensor object on the same storage
    assert watch.unchanged()
    task.stats.mean = torch.zeros(3)  # a tensor the step reads moved
    assert not watch.unchanged()
    watch = _StorageWatch(task)
    task.data.set_(torch.arange(6.0).untyped_storage())  # the same object, another storage
    assert not watch.unchanged()
    watch = _StorageWatch(task)
    task.stats = Stats()  # a new holder object
    assert not watch.unchanged()
    watch = _StorageWatch(task)
    task.extra = torch.ones(2)  # a tensor the walk did not see before
    assert not watch.unchanged()


def test_push_checks_and_copies_as_as_chunk_did():
    rng = np.random.default_rng(0)
    cond, x = rng.normal(size=(80, 7)), rng.normal(size=(80, 256))
    x[3, 5], cond[9, 0], x[11, 0] = np.nan, np.inf, -np.inf
    c, v, dropped = as_arrays(cond, x, 7, (256,))
    good = np.ones(80, bool)
    good[[3, 9, 11]] = False
    assert dropped == 3 and c.dtype == v.dtype == np.float32
    assert torch.equal(torch.from_numpy(v), torch.as_tensor(x, dtype=torch.float32)[torch.from_numpy(good)])
    huge = np.full((2, 256), 3e38)  # finite rows whose sum overflows: kept
    assert as_arrays(np.ones((2, 7)), huge, 7, (256,))[2] == 0
    tc, tv, times, d = as_chunk(cond, x, 5.0, 7, (256,))
    assert d == 3 and tc.shape == (77, 7) and times.dtype == torch.float64 and times.tolist() == [5.0] * 77
    with pytest.raises(UserError, match="do not fit the task"):
        as_arrays(np.ones((4, 6)), np.ones((4, 256)), 7, (256,))


def test_pushed_arrays_are_copied_at_once(tmp_path):
    trainer = OnlineTrainer(tmp_path / "run", _cfg(), capacity=160, ready_at=80)
    cond, x, t = FakeSimulation().output()
    expected = torch.tensor(x, dtype=torch.float32)  # a copy of what was pushed
    trainer.push(cond, x, t)
    x[:] = 0.0  # the simulation reuses its output buffer
    assert trainer.ready() and torch.equal(trainer.buffer.x[:80], expected)


def test_sample_gives_sample_for_ensembles_and_fresh_arrays(tmp_path):
    trainer, _ = _trainer(tmp_path)
    trainer.train_for(steps=3)
    cond = np.random.default_rng(1).normal(size=(5, 7))
    first = trainer.sample(cond, n_members=4, steps=6, seed=2)
    sampler = trainer.sampler
    assert sampler is not None and set(sampler.last_split) == {"prepare_ms", "launch_ms", "wait_ms", "finish_ms"}
    reference = trainer.task.sample_for(sampler.network, torch.as_tensor(cond, dtype=torch.float32), members=4,
                                        steps=6, seed=2).numpy()
    assert first.shape == (5, 4, 256) and np.array_equal(first, reference)
    kept = first.copy()
    other = trainer.sample(cond, n_members=4, steps=6, seed=3)
    assert np.array_equal(first, kept) and not np.array_equal(other, first)  # a result is not the next call's buffer
    tensor = torch.tensor(cond, requires_grad=True)  # of the simulation's autograd graph
    assert np.array_equal(trainer.sample(tensor, n_members=4, steps=6, seed=2), first)
    one = trainer.sample(cond[0], n_members=4, steps=6, seed=2)  # one cell's C values
    assert one.shape == (1, 4, 256) and np.array_equal(one, trainer.sample(cond[:1], n_members=4, steps=6, seed=2))
    for shape in [(35,), (7, 5), (2, 6), (1, 5, 7), (0, 7)]:  # flattened, transposed, too narrow, 3-D, empty
        with pytest.raises(UserError, match=re.escape(
                f"conditions of shape {shape} (float64) do not fit this model -- pass an N x 7 array of numbers "
                "(one row per cell), or 7 numbers for one cell")):
            trainer.sample(np.zeros(shape), n_members=4, steps=6)


def test_sample_refuses_arguments_out_of_range_and_gives_nan_for_a_nan_condition(tmp_path):
    trainer, _ = _trainer(tmp_path)
    trainer.train_for(steps=1)
    cond = np.random.default_rng(1).normal(size=(3, 7))
    for wrong, message in [
            ({"steps": 51}, "sample's steps=51 is not a whole number from 1 to 50 -- pass steps from 1 to 50"),
            ({"steps": 0}, "sample's steps=0 is not a whole number from 1 to 50"),
            ({"n_members": -1}, "sample's n_members=-1 is not a whole number of at least 1 -- pass n_members=1"),
            ({"n_members": 2.0}, "sample's n_members=2.0 is not a whole number of at least 1"),
            ({"seed": None}, "sample's seed=None is not a whole number from 0 to 2**63 - 1 -- pass seed= an integer"),
            ({"seed": -1}, "sample's seed=-1 is not a whole number from 0 to 2**63 - 1"),
            ({"seed": 2**64}, "sample's seed=18446744073709551616 is not a whole number from 0 to 2**63 - 1"),
            ({"n_members": 10**12}, "sample's 3 x 1000000000000 members needs about"),
            ({"n_members": 10**12}, "-- ask for fewer members per call (n_members=, or fewer cells at a time)")]:
        with pytest.raises(UserError, match=re.escape(message)):
            trainer.sample(cond, **{"n_members": 2, "steps": 3, **wrong})
    assert trainer.sample(cond, n_members=np.int64(2), steps=np.int32(3), seed=np.uint8(4)).shape == (3, 2, 256)
    cond[1, 2], cond[2, 0] = np.nan, np.inf
    fields = trainer.sample(cond, n_members=2, steps=3)
    assert np.isnan(fields[1:]).all() and np.isfinite(fields[0]).all()  # as the docstring says


def test_pushes_while_training_in_the_background_resume_bit_for_bit(tmp_path):
    trainer, sim = _trainer(tmp_path)
    trainer.start(steps_per_round=2)
    for _ in range(3):
        trainer.push(*sim.output())  # folded into the buffer by the training thread
    trainer.stop()
    trainer.push(*sim.output())  # still queued: the checkpoint takes it into the buffer first
    checkpoint_and_resume(trainer, sim, tmp_path / "run", steps=5)
    assert trainer.buffer.pushes == 10


@pytest.mark.parametrize("preset", ["tiny", "policy-tiny"])
def test_every_task_draws_into_a_recorded_steps_inputs_as_it_draws_anew(preset):
    from diffscale.config import merge
    from diffscale.config.presets import get_preset
    from diffscale.tasks.registry import build_task

    cfg = get_preset(preset)
    if preset == "tiny":
        cfg = merge(cfg, {"model": {"sample_size": 16}})
    task = build_task(cfg, torch.device("cpu"))
    fresh = task.draw(torch.arange(8), torch.Generator().manual_seed(4))
    inputs = {k: torch.zeros_like(v) for k, v in fresh.items()}
    drawn = task.draw(torch.arange(8), torch.Generator().manual_seed(4), out=inputs)
    assert set(drawn) == set(fresh) and all(drawn[k] is inputs[k] and torch.equal(drawn[k], fresh[k]) for k in fresh)


def test_start_noise_drawn_ahead_or_kept_gives_the_same_ensembles(tmp_path):
    trainer, _ = _trainer(tmp_path)
    trainer.train_for(steps=3)
    cond = np.random.default_rng(2).normal(size=(3, 7))
    how = []
    for seed in (5, 6, 7, 7, 3, 4, 4, 9):  # numbered output steps, repeats, and jumps
        got = trainer.sample(cond, n_members=2, steps=4, seed=seed)
        sampler = trainer.sampler
        assert sampler is not None
        how.append(sampler.last_noise)
        reference = trainer.task.sample_for(sampler.network, torch.as_tensor(cond, dtype=torch.float32),
                                            members=2, steps=4, seed=seed).numpy()
        assert np.array_equal(got, reference), seed
    assert how == ["drawn", "ahead", "ahead", "kept", "drawn", "ahead", "kept", "drawn"]
