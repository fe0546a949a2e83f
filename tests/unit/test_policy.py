"""Diffusion policy: the built-in environment, the data's sizes against the model section, the
network, the task's protocol methods, and the quality test (a trained policy-tiny passes the
obstacle on both sides; a regression policy does not). Episode readers and training windows:
test_episodes.py."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from rich.console import Console

from diffscale.cli import main
from diffscale.config import ConfigSources, resolve_config
from diffscale.config.presets import get_preset
from diffscale.errors import UserError
from diffscale.inference.trained import load_trained
from diffscale.runtime import checkpoint as ckpt
from diffscale.runtime.device import resolve_policy
from diffscale.runtime.distributed import DistContext, LaunchInfo
from diffscale.tasks.base import count_parameters
from diffscale.tasks.policy.controller import Controller
from diffscale.tasks.policy.envs.reach2d import MODES, TWO_WAYS, Reach2D, demonstrations
from diffscale.tasks.policy.envs.rollout import rollouts, summarize
from diffscale.tasks.policy.network import ConditionalUnet1D
from diffscale.tasks.registry import build_task
from diffscale.training.loop import train
from diffscale.training.state import RunState
from diffscale.training.step import StepRunner

from helpers import concat_episodes, random_episodes

CPU = torch.device("cpu")


# -- environment ---------------------------------------------------------------------------------
def _replay_mode(obs: np.ndarray, action: np.ndarray) -> tuple[bool, str | None]:
    env = Reach2D()
    env.reset()
    env.position, env.goal = obs[0, :2].astype(np.float64), obs[0, 2:].astype(np.float64)
    for a in action:
        env.step(a)
    return env.success, env.mode


def test_the_policy_presets_are_sized_for_reach2d():
    from diffscale.tasks.policy.envs import reach2d

    for name in ("policy", "policy-tiny"):
        model = get_preset(name).model
        assert (model.obs_dim, model.action_dim) == (reach2d.OBS_DIM, reach2d.ACTION_DIM), name


def test_reach2d_demonstrations_take_both_sides_from_each_start():
    demos = demonstrations(40, seed=3)
    replays = [_replay_mode(obs, action) for obs, action in demos]
    assert all(success for success, _ in replays)
    modes = [mode for _, mode in replays]
    assert modes.count("left") == modes.count("right") == 20
    pairs = zip(modes[::2], modes[1::2], strict=True)
    for (first, _), (second, _), pair in zip(demos[::2], demos[1::2], pairs, strict=True):
        assert np.array_equal(first[0], second[0]) and set(pair) == {"left", "right"}  # one start, both ways


def test_reach2d_straight_line_crashes_and_render_shows_it():
    env = Reach2D()
    env.reset(seed=5)
    terminated = truncated = False
    info: dict = {}
    while not (terminated or truncated):
        _, reward, terminated, truncated, info = env.step(env.goal)
    assert info["crashed"] and not info["success"] and reward == 0.0 and info["mode"] is None
    image = env.render(64)
    assert image.shape == (64, 64, 3) and image.dtype == np.uint8
    assert (image == (220, 40, 40)).all(axis=-1).any()  # the crashed robot is drawn red


# -- data and the model section ------------------------------------------------------------------
def test_data_dimensions_must_match_the_model_section():
    cfg = resolve_config(ConfigSources(preset="policy-tiny", overrides=["model.obs_dim=6"]))
    with pytest.raises(UserError, match=r"builtin:reach2d has 4 values per step where model.obs_dim=6 -- "
                                        r"set model.obs_dim=4 \(or 0 to follow the data\)"):
        build_task(cfg, CPU)


# -- network --------------------------------------------------------------------------------------
def test_reference_size_network_has_the_reference_parameter_count():
    cfg = get_preset("policy").model
    with torch.device("meta"):
        pusht_state = ConditionalUnet1D(2, 5 * cfg.obs_horizon, step_embed_dim=cfg.step_embed_dim,
                                        down_dims=cfg.down_dims, kernel_size=cfg.kernel_size, n_groups=cfg.n_groups)
        preset = build_task(get_preset("policy"), CPU, load_data=False).build_network()
    # diffusion policy's state-based PushT notebook reports 6.535322e+07 parameters
    assert count_parameters(pusht_state) == 65_353_218
    assert 65e6 < count_parameters(preset) < 66e6


def test_network_maps_noised_chunks_to_their_shape():
    net = ConditionalUnet1D(3, 2 * 5, step_embed_dim=16, down_dims=(16, 32, 64), n_groups=4)
    x = torch.randn(7, 16, 3)
    out = net(x, torch.randint(0, 100, (7,)), torch.randn(7, 10))
    assert out.shape == (7, 16, 3)
    assert net(x, torch.tensor(5), torch.randn(7, 10)).shape == (7, 16, 3)  # one timestep for the batch


def test_convolutions_as_matrix_products_give_the_same_chunks():
    from diffscale.tasks.policy.network import MATMUL_MAX_ROWS, TemporalConv, TemporalUpsample, _as_matmul

    torch.manual_seed(0)
    net = ConditionalUnet1D(3, 2 * 5, step_embed_dim=16, down_dims=(16, 32, 64), n_groups=4)
    convs = [m for m in net.modules() if isinstance(m, (TemporalConv, TemporalUpsample))]
    assert {type(m) for m in convs} == {TemporalConv, TemporalUpsample}  # every convolution, strided ones too
    inputs = (torch.randn(4, 16, 3), torch.tensor([1, 5, 50, 99]), torch.randn(4, 10))
    with torch.no_grad():
        cudnn = net(*inputs)
        for module in convs:
            module.impl = "matmul"
        matmul = net(*inputs)
    # the same sums in another order: equal up to float32 rounding
    assert torch.allclose(matmul, cudnn, rtol=0, atol=1e-5) and cudnn.abs().max() > 0.1
    # auto: matrix products for calls of a few rows on a GPU only
    small, large = torch.zeros(1, 8, 16), torch.zeros(256, 8, 16)
    assert not _as_matmul("auto", small) and not _as_matmul("auto", large)  # CPU tensors
    assert _as_matmul("matmul", large) and not _as_matmul("cudnn", small)
    assert 16 <= MATMUL_MAX_ROWS < 256 * 4  # an action chunk at batch 1 qualifies, a training batch does not


def test_conv_setting_is_checked_and_reaches_every_convolution():
    from diffscale.tasks.policy.network import TemporalConv, build_unet1d

    cfg = get_preset("policy-tiny").model
    refused = "model.conv.*'fft' is not one of auto, cudnn, matmul.*set model.conv to one of"
    with pytest.raises(UserError, match=refused):
        resolve_config(ConfigSources(preset="policy-tiny", overrides=["model.conv=fft"]))
    assert resolve_config(ConfigSources(preset="policy-tiny", overrides=["model.conv=matmul"])).model.conv == "matmul"
    net = build_unet1d(type(cfg)(conv="matmul", down_dims=(16, 32)), 4, 2)
    assert {m.impl for m in net.modules() if isinstance(m, TemporalConv)} == {"matmul"}


# -- the task -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_task():
    return build_task(get_preset("policy-tiny"), CPU)


def test_task_draws_normalised_windows_and_a_finite_loss(tiny_task):
    task = tiny_task
    torch.manual_seed(0)
    net = task.build_network()
    batch = task.draw(torch.arange(10), torch.Generator().manual_seed(1))
    examples = task.examples(batch, slice(2, 6))
    assert examples["action"].shape == (4, 16, 2) and examples["obs"].shape == (4, 2 * 4)
    assert examples["action"].abs().max() <= 1.0 + 1e-6 and examples["obs"].abs().max() <= 1.0 + 1e-6
    loss = task.loss(net, batch, slice(2, 6), channels_last=False)
    assert loss.ndim == 0 and torch.isfinite(loss)
    assert net(*task.example_inputs(3)).shape == (3, 16, 2)
    assert task.signature() == {"task": "policy", "obs_dim": 4, "action_dim": 2, "obs_horizon": 2, "pred_horizon": 16,
                                "down_dims": [64], "kernel_size": 5, "n_groups": 8, "step_embed_dim": 32}


def test_generation_from_a_checkpoint_without_data(tiny_task, tmp_path):
    task = tiny_task
    net = task.build_network()
    full = task.generate(net, count=6, steps=4, seed=3, trajectory=True)
    assert full.samples.shape == (6, 16, 2) and len(full.frames) == 4
    part = task.generate(net, count=6, steps=4, seed=3, rows=slice(2, 5))
    assert torch.allclose(part.samples, full.samples[2:5], atol=1e-6)  # ranks sharing a preview agree
    # a process without the data (diffscale sample) rebuilds the task from the checkpoint
    bare = build_task(get_preset("policy-tiny"), CPU, load_data=False, signature=task.signature())
    with pytest.raises(UserError, match="load a checkpoint of the run first"):
        bare.generate(net, count=1, steps=2, seed=0)
    bare.load_state_tensors(task.state_tensors())
    assert torch.allclose(bare.generate(net, count=6, steps=4, seed=3).samples, full.samples, atol=1e-6)
    written = task.write_samples(full, tmp_path / "preview.png")
    assert [p.name for p in written] == ["preview.png", "preview.gif"] and all(p.stat().st_size > 1000 for p in written)


def test_plan_takes_batched_histories_and_names_the_shape_otherwise(tiny_task):
    net = tiny_task.build_network()
    history = np.zeros((2, 4), np.float32)  # one (To, O) history, as an environment gives it
    assert tiny_task.plan(net, history[None], steps=2).samples.shape == (1, 16, 2)
    for wrong in (history, np.zeros((1, 2, 5), np.float32)):
        with pytest.raises(UserError) as info:
            tiny_task.plan(net, wrong, steps=2)
        assert info.value.message == (
            f"an observation history of shape {wrong.shape} does not fit this policy -- pass (B, 2, 4): a batch of "
            "model.obs_horizon=2 observations of 4 values (one history: obs_history[None])")


def test_checkpoint_statistics_of_other_data_are_refused(tiny_task):
    state = tiny_task.state_tensors()
    state["obs_min"] = torch.zeros(6)
    with pytest.raises(UserError, match="the checkpoint normalises 6 obs values per step, this run's data has 4"):
        tiny_task.load_state_tensors(state)


def test_export_loads_into_a_fresh_network(tiny_task, tmp_path):
    from safetensors.torch import load_file

    net = tiny_task.build_network()
    how = tiny_task.export(net, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    fresh = ConditionalUnet1D(config["unet"].pop("input_dim"), config["unet"].pop("global_cond_dim"),
                              step_embed_dim=config["unet"].pop("diffusion_step_embed_dim"), **config["unet"])
    fresh.load_state_dict(load_file(tmp_path / "unet.safetensors"))
    inputs = tiny_task.example_inputs(2)
    assert torch.equal(fresh(*inputs), net(*inputs)) and "ConditionalUnet1D" in how
    assert set(load_file(tmp_path / "normalizer.safetensors")) >= {"obs_min", "obs_max", "action_min", "action_max"}


def test_evaluation_needs_the_environment_of_the_data(tmp_path):
    obs, action, ends = concat_episodes(random_episodes())
    np.savez(tmp_path / "demo.npz", obs=obs, action=action, episode_ends=ends)
    cfg = resolve_config(ConfigSources(preset="policy-tiny", data=f"npz:{tmp_path / 'demo.npz'}",
                                       overrides=["model.obs_dim=0", "model.action_dim=0"]))
    task = build_task(cfg, CPU)
    with pytest.raises(UserError, match="no environment to roll out a policy trained on 'npz:"):
        task.evaluate(task.build_network(), tmp_path / "eval", count=2, steps=2, seed=0)


# -- through the loop and the verbs ---------------------------------------------------------------
MICRO_POLICY = ["--preset", "policy-tiny", "--set", "model.down_dims=[16,32]", "--set", "model.step_embed_dim=16",
                "--set", "train.batch_per_gpu=16", "--set", "train.log_every=2", "--set", "train.checkpoint_every=2",
                "--set", "train.sample_count=4", "--set", "train.sample_steps=3", "--set", "data.max_items=20"]


def _final_tensors(run_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    last = ckpt.list_checkpoints(run_dir)[-1]
    return {f"{name}/{k}": v for name in ("model", "ema", "optimizer", "task")
            for k, v in load_file(str(last / f"{name}.safetensors")).items()}


def test_train_sample_eval_and_export_verbs_on_a_policy_run(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--out", str(run), *MICRO_POLICY, "--set", "train.steps=4"]) == 0
    assert "builtin:reach2d (20 episodes" in capsys.readouterr().err
    assert (run / "samples" / "latest.png").is_file()
    assert main(["sample", str(run), "--n", "4", "--steps", "3", "--out", str(tmp_path / "chunks.png")]) == 0
    assert (tmp_path / "chunks.png").stat().st_size > 1000
    assert main(["sample", str(run), "--n", "4", "--steps", "3", "--sampler", "dpmsolver",
                 "--out", str(tmp_path / "fast.png")]) == 0
    assert (tmp_path / "fast.png").stat().st_size > 1000
    capsys.readouterr()
    assert main(["eval", str(run), "--count", "3", "--steps", "2", "--json"]) == 0
    captured = capsys.readouterr()
    record = json.loads(captured.out)  # the one JSON line alone on stdout: the progress is on stderr
    assert "rollouts: 3 episodes at once" in captured.err and "rollouts: 3 of 3 ended (" in captured.err
    assert record["task"] == "policy" and record["episodes"] == 3 and 0 <= record["success"] <= 1
    assert isinstance(record["episodes"], int)
    assert {"mode_left", "mode_right", "length"} <= record.keys()
    gifs = run / "eval" / "step_00000004"
    assert sorted(p.name[:9] for p in gifs.glob("rollout_*.gif")) == ["rollout_0", "rollout_1", "rollout_2"]
    assert main(["eval", str(run), "--count", "1", "--steps", "2", "--json"]) == 0  # a re-eval with fewer rollouts
    assert main(["eval", str(run), "--count", "1", "--steps", "2", "--sampler", "dpmsolver", "--json"]) == 0
    assert [p.name[:9] for p in gifs.glob("rollout_*.gif")] == ["rollout_0"]  # the earlier eval's GIFs are gone
    assert main(["export", str(run), "--diffusers", str(tmp_path / "export")]) == 0
    assert (tmp_path / "export" / "unet.safetensors").is_file()


def test_stop_and_resume_of_a_policy_run_is_exact(tmp_path, capsys):
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert main(["train", "--out", str(straight), *MICRO_POLICY, "--set", "train.steps=6"]) == 0
    assert main(["train", "--out", str(split), "--max-steps", "4", *MICRO_POLICY, "--set", "train.steps=6"]) == 0
    assert main(["train", "--out", str(split), "--resume", "auto", *MICRO_POLICY, "--set", "train.steps=6"]) == 0
    assert "resumed from step 4" in capsys.readouterr().err
    a, b = _final_tensors(straight), _final_tensors(split)
    assert a.keys() == b.keys() and {"task/obs_min", "task/action_max", "task/preview_obs"} <= a.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_resume_on_other_episodes_is_refused(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--out", str(run), *MICRO_POLICY, "--set", "train.steps=2"]) == 0
    obs, action, ends = concat_episodes(random_episodes(obs_dim=5))
    np.savez(tmp_path / "other.npz", obs=obs, action=action, episode_ends=ends)
    assert main(["train", "--out", str(run), "--resume", "auto", *MICRO_POLICY, "--set", "train.steps=4",
                 "--data", f"npz:{tmp_path / 'other.npz'}", "--set", "model.obs_dim=0"]) == 2
    assert "obs_dim: checkpoint 4 vs config 5" in capsys.readouterr().err


# -- quality --------------------------------------------------------------------------------------
@pytest.fixture
def one_thread():
    """policy-tiny's kernels are too small to gain from intra-op threads, and threads spinning on a
    busy CI machine cost several times the work (measured: 57 ms a step on one thread, 450 ms on
    two, with other jobs running). One thread keeps the test's cost that of one core."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class RegressionTask:
    """The policy task with a deterministic regression loss: the same network maps the observation
    history (a zero chunk and step 0 as its other inputs) straight to the normalised action chunk."""

    def __init__(self, task) -> None:
        self.task = task

    def __getattr__(self, name: str):
        return getattr(self.task, name)

    def predict(self, network: torch.nn.Module, obs: torch.Tensor) -> torch.Tensor:
        """obs (B, To * O) normalised -> action chunks (B, T, A) normalised."""
        zero = torch.zeros(len(obs), self.task.model.pred_horizon, self.task.action_dim)
        return network(zero, torch.zeros(len(obs), dtype=torch.long), obs)

    def loss(self, network, batch, rows, *, channels_last):
        ex = self.task.examples(batch, rows)
        return torch.nn.functional.mse_loss(self.predict(network, ex["obs"]), ex["action"])


class RegressionController(Controller):
    """The controller's history, queue and schedule around a regression network's one chunk."""

    def plan(self, history: torch.Tensor) -> torch.Tensor:
        obs = self.obs_norm.normalize(history).flatten(1)
        return self.action_norm.unnormalize(self.task.predict(self.network, obs))


def regression_baseline(cfg, run_dir: Path, layout=TWO_WAYS, episodes: int = 100) -> dict[str, float]:
    """Train ``RegressionTask`` with the loop's own optimizer step (AdamW, schedule, clipping, EMA)
    on ``cfg``'s data for as many steps, and roll out its EMA network as the policy is."""
    device = torch.device("cpu")
    trainer = RunState(cfg, run_dir, DistContext(LaunchInfo(launcher="single"), device),
                      resolve_policy(cfg.runtime, device), Console(quiet=True))
    task = trainer.task = RegressionTask(trainer.task)
    runner = StepRunner(trainer, trainer.net, trainer.make_batcher())
    for _ in range(cfg.train.steps):
        runner.step()

    controller = RegressionController(task, trainer.ema)
    with torch.no_grad():
        results = rollouts(lambda: Reach2D(layout=layout), controller, episodes=episodes, seed=1000)
    return summarize(results, layout)


def test_policy_tiny_passes_on_both_sides_where_regression_crashes(tmp_path, one_thread):
    """The issue's quality bar on the built-in task (CPU, seeded): ``policy-tiny`` as it ships,
    trained by the loop, evaluated as ``diffscale eval`` does. A deterministic regression policy
    of the same network and data predicts the mean chunk, which drives into the obstacle."""
    cfg = resolve_config(ConfigSources(preset="policy-tiny", device="cpu"))
    start, cpu = time.perf_counter(), time.process_time()
    assert train(cfg, tmp_path / "run", console=Console(quiet=True)).finished
    trained = time.perf_counter()
    run = load_trained(tmp_path / "run", "cpu")
    metrics = run.task.evaluate(run.network, tmp_path / "eval", count=100, steps=10, seed=1000, gifs=2)
    evaluated = time.perf_counter()
    baseline = regression_baseline(cfg, tmp_path / "regression")
    print(f"\npolicy-tiny {cfg.train.steps} steps: trained in {trained - start:.1f} s, evaluated in "
          f"{evaluated - trained:.1f} s: {metrics}; regression baseline {baseline}; "
          f"total {time.perf_counter() - start:.1f} s ({time.process_time() - cpu:.1f} s of CPU)")
    assert metrics["success"] >= 0.9, metrics
    assert all(metrics[f"mode_{mode}"] >= 0.25 for mode in MODES), metrics
    assert baseline["success"] < 0.5, baseline
    gifs = sorted((tmp_path / "eval").glob("rollout_*.gif"))
    assert len(gifs) == 2 and all(g.stat().st_size > 1000 for g in gifs)

