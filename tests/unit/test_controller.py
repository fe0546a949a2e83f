"""The policy controller (``diffscale.policy.Controller``): one observation per step, the history and
the queue of planned actions, re-planning every ``action_horizon`` steps, fresh seeded noise, DDPM as
diffusers' ancestral sampler computes it, the bad inputs it refuses; the reach2d-routes variant and
its route summary; and the controller loaded from a run as ``diffscale eval`` uses it."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from diffscale.cli import main
from diffscale.config import ConfigSources, resolve_config
from diffscale.errors import UserError
from diffscale.policy import Controller
from diffscale.tasks.policy.controller import Controller as LoopController
from diffscale.tasks.policy.envs.reach2d import ROUTES, TWO_WAYS, Reach2D, route_demonstrations
from diffscale.tasks.policy.envs.rollout import Rollout, environment_for, rollouts, summarize
from diffscale.tasks.registry import build_task

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def task_and_net():
    torch.manual_seed(0)
    task = build_task(resolve_config(ConfigSources(preset="policy-tiny", device="cpu")), CPU)
    return task, task.build_network().eval()


class CountingController(LoopController):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.plans: list[torch.Tensor] = []

    def plan(self, history: torch.Tensor) -> torch.Tensor:
        self.plans.append(history.clone())
        return super().plan(history)


def test_ddpm_loop_is_diffusers_ancestral_sampler_and_ddim_its_deterministic_one(task_and_net):
    """The controller's one loop (DDIM's step, eta 1 and noise drawn before it for DDPM) gives
    what diffusers' DDPMScheduler / DDIMScheduler give from the same generator draws."""
    task, net = task_and_net
    history = task.preview_obs[:3]
    plans = {}
    for sampler in ("ddpm", "ddim", "dpmsolver"):
        controller = LoopController(task, net, sampler=sampler, steps=10)
        controller.reset(5)
        reference = task.plan(net, history, steps=10, sampler=sampler, generator=torch.Generator().manual_seed(5))
        plans[sampler] = controller.plan(history)
        assert torch.allclose(plans[sampler], reference.samples, atol=1e-5), sampler
    assert not torch.allclose(plans["dpmsolver"], plans["ddim"], atol=1e-3)  # its own solver, not DDIM's


def test_ddpm_follows_the_visited_timesteps_where_a_trailing_spacing_visits_them_unevenly():
    """7 of 100 trailing timesteps are not evenly spaced: DDPM steps to the next timestep visited,
    as DDPMScheduler (and sampling) does, not by DDIM's fixed stride."""
    torch.manual_seed(0)
    cfg = resolve_config(ConfigSources(preset="policy-tiny", device="cpu",
                                       overrides=["diffusion.timestep_spacing=trailing"]))
    task = build_task(cfg, CPU)
    net = task.build_network().eval()
    history = task.preview_obs[:3]
    controller = LoopController(task, net, sampler="ddpm", steps=7)
    controller.reset(5)
    reference = task.plan(net, history, steps=7, sampler="ddpm", generator=torch.Generator().manual_seed(5))
    assert torch.allclose(controller.plan(history), reference.samples, atol=1e-5)


def test_select_action_keeps_history_and_queue_and_replans_every_action_horizon(task_and_net):
    task, net = task_and_net
    controller = CountingController(task, net, steps=3)
    controller.reset(0)
    env = Reach2D()
    obs = env.reset(1)
    first = obs.copy()
    actions = []
    for _ in range(17):
        action = controller.select_action(obs)
        assert action.shape == (2,) and action.dtype == np.float32
        actions.append(action)
        obs, *_ = env.step(action)
    horizon = task.model.action_horizon
    assert len(controller.plans) == 3  # steps 0, 8 and 16 (Ta 8)
    assert torch.equal(controller.plans[0][0], torch.from_numpy(np.stack([first, first])))  # first obs repeated
    assert not torch.equal(controller.plans[1], controller.plans[2])  # the history moves on
    # the actions of one plan are its chunk from index obs_horizon - 1, in order
    controller.reset(0)
    chunk = controller.plan(torch.from_numpy(np.stack([first, first]))[None])[0]
    start = task.model.obs_horizon - 1
    assert np.allclose(np.stack(actions[:horizon]), chunk[start: start + horizon].numpy(), atol=1e-6)


def test_noise_is_fresh_per_plan_and_a_seeded_episode_repeats(task_and_net):
    task, net = task_and_net
    controller = LoopController(task, net, steps=3)
    history = task.preview_obs[:1]
    controller.reset(7)
    a, b = controller.plan(history), controller.plan(history)
    assert not torch.allclose(a, b)  # repeated calls draw new noise
    controller.reset(7)
    assert torch.equal(controller.plan(history), a)  # reset(seed) repeats the episode
    controller.reset(8)
    assert not torch.allclose(controller.plan(history), a)
    controller.reset()  # no seed: the generator goes on
    assert not torch.allclose(controller.plan(history), a)


def test_a_batch_of_environments_steps_together(task_and_net):
    task, net = task_and_net
    controller = LoopController(task, net, sampler="ddim", steps=2)
    controller.reset(0)
    obs = np.stack([Reach2D().reset(i) for i in range(5)])
    assert controller.select_action(obs).shape == (5, 2)
    tensor = controller.select_action(torch.from_numpy(obs))
    assert isinstance(tensor, torch.Tensor) and tensor.shape == (5, 2)


def _message(call) -> str:
    with pytest.raises(UserError) as info:
        call()
    return info.value.message


def test_bad_inputs_each_end_in_one_error_naming_the_fix(task_and_net):
    task, net = task_and_net
    controller = LoopController(task, net, steps=2)
    obs = np.zeros(4, np.float32)
    assert _message(lambda: controller.select_action(obs)) == (
        "select_action before the controller was reset with a seed -- call reset(seed) at the start of every "
        "episode (the first with a seed)")
    assert _message(controller.reset) == (
        "the controller's first reset() has no seed -- call reset(seed) with an int before the first episode "
        "(later resets may omit it)")
    controller.reset(0)
    assert _message(lambda: controller.select_action(np.zeros(5, np.float32))) == (
        "an observation of shape (5,) does not fit this policy -- pass one observation of 4 values (4,) or a "
        "batch of environments (B, 4)")
    assert _message(lambda: controller.select_action(np.zeros((2, 2, 4), np.float32))).startswith(
        "an observation of shape (2, 2, 4) does not fit this policy")
    nan = np.zeros((3, 4), np.float32)
    nan[1, 2] = np.nan
    assert _message(lambda: controller.select_action(nan)) == (
        "the observation of environment 1 holds NaN or infinite values -- pass the environment's finite "
        "observation (check its sensors or its reset)")
    controller.select_action(np.zeros((3, 4), np.float32))
    assert _message(lambda: controller.select_action(np.zeros((2, 4), np.float32))) == (
        "2 observations where this episode started with 3 -- keep one batch size per episode: call reset() "
        "before a batch of another size")
    controller.reset()
    assert controller.select_action(np.zeros((2, 4), np.float32)).shape == (2, 2)
    assert _message(lambda: LoopController(task, net, sampler="euler")) == (
        "unknown sampler 'euler' -- use ddpm, ddim or dpmsolver")
    assert _message(lambda: LoopController(task, net, steps=0)) == (
        "steps=0: a plan needs a whole number of denoising steps, at least one -- pass steps >= 1, or leave steps "
        "out for the run's train.sample_steps")
    # arguments out of range are ValueErrors (what a Python caller catches) naming the argument
    for seed, said in ((-1, "reset(seed=-1)"), (float("nan"), "reset(seed=nan)"), (2**70, f"reset(seed={2**70})"),
                       (True, "reset(seed=True)")):
        with pytest.raises(ValueError, match=re.escape(said) + ": a seed is a whole number from 0 to 2\\*\\*63 - 1"):
            controller.reset(seed)
    with pytest.raises(ValueError, match=re.escape("select_action(obs) got an array of <U1 values, not numbers")):
        controller.select_action(np.array(["a", "b", "c", "d"]))


# -- reach2d-routes --------------------------------------------------------------------------------
def test_route_demonstrations_take_each_route_in_its_share_and_the_mean_crashes():
    modes = []
    for obs, action in route_demonstrations(100):
        env = Reach2D(layout=ROUTES)
        env.reset()
        env.position, env.goal = obs[0, :2].astype(np.float64), obs[0, 2:].astype(np.float64)
        for a in action:
            env.step(a)
        assert env.success
        modes.append(env.mode)
    assert [modes.count(m) for m in ROUTES.modes] == [50, 30, 20]
    env = Reach2D(layout=ROUTES)
    env.reset(3)
    while not env.crashed and env.steps < 40:  # straight at the goal
        env.step(env.goal)
    assert env.crashed and env.layout.mode_at(-0.05) == "middle" and env.layout.hits(
        np.array([-0.05, -0.2]), np.array([-0.05, 0.2]))  # the shares' mean crossing hits the large obstacle


def test_route_summary_reports_each_share_beside_the_demonstrations():
    results = [Rollout(True, "left", 30), Rollout(True, "middle", 30), Rollout(False, None, 100),
               Rollout(True, "left", 30)]
    summary = summarize(results, ROUTES)
    assert summary["mode_left"] == 0.5 and summary["mode_middle"] == 0.25 and summary["mode_right"] == 0.0
    assert summary["demo_left"] == 0.5 and summary["demo_right"] == 0.2
    assert summary["mode_gap"] == pytest.approx(0.2) and summary["success"] == 0.75
    assert summarize(results, TWO_WAYS)["demo_right"] == 0.5
    env = environment_for("builtin:reach2d-routes", 4, 2)
    assert env.name == "reach2d-routes" and env.make().layout is ROUTES


def test_rollouts_run_through_the_controller(task_and_net):
    task, net = task_and_net
    controller = CountingController(task, net, sampler="ddim", steps=2)
    results = rollouts(lambda: Reach2D(max_steps=10), controller, episodes=3, seed=4, record=1)
    lengths = [r.length for r in results]
    assert all(1 <= n <= 10 for n in lengths) and len(results[0].frames) == lengths[0] + 1
    assert len(controller.plans) == -(-max(lengths) // 8)  # one batch, a plan every 8 steps while any runs
    assert all(h.shape == (3, 2, 4) for h in controller.plans)  # ended episodes keep their place


# -- from a run ------------------------------------------------------------------------------------
MICRO = ["--preset", "policy-tiny", "--set", "model.down_dims=[16]", "--set", "model.step_embed_dim=16",
         "--set", "train.batch_per_gpu=16", "--set", "train.checkpoint_every=4", "--set", "train.sample_every=0",
         "--set", "train.sample_steps=3", "--set", "data.max_items=20", "--device", "cpu", "--set", "train.steps=4"]


def test_a_run_loads_as_a_controller_and_eval_rolls_out_through_it(tmp_path, capsys):
    """The run's settings reach the loaded controller and eval. The run trains with compile off so
    the controller loads eager: the CPU compile ``Controller.load`` runs under ``auto`` (most of this
    test's time otherwise) is checked by the compiled-controller and policy-tiny tests below."""
    run = tmp_path / "run"
    assert main(["train", "--data", "builtin:reach2d-routes", "--out", str(run), *MICRO,
                 "--set", "runtime.compile=off"]) == 0
    controller = Controller.load(run, device="cpu")
    assert controller.kind.value == "ddpm" and controller.steps == 3  # the run's sample_steps
    assert Controller.load(run, device="cpu", sampler="ddim", steps=2).steps == 2
    with pytest.raises(ValueError, match=re.escape("Controller.load(steps=0): a plan needs a whole number")):
        Controller.load(run, device="cpu", steps=0)  # 0 once meant the run's default, silently
    controller.reset(0)
    assert controller.select_action(Reach2D(layout=ROUTES).reset(0)).shape == (2,)
    capsys.readouterr()
    assert main(["eval", str(run), "--count", "4", "--json", "--device", "cpu", "--max-episode-steps", "12"]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert record["env"] == "reach2d-routes" and record["demo_middle"] == 0.3 and "mode_gap" in record


def test_a_run_trained_before_policies_named_ddpm_still_plans_with_ddpm(tmp_path, capsys):
    """A policy run whose train.sample_sampler is DPM-Solver++ (the default before the policy
    presets named DDPM): its loaded controller, as ``diffscale eval``, plans with DDPM (the
    task's ``evaluation_sampler``), while ``diffscale sample`` follows the run's own sampler."""
    run = tmp_path / "run"
    assert main(["train", "--out", str(run), *MICRO, "--set", "runtime.compile=off",
                 "--set", "train.sample_sampler=dpmsolver"]) == 0
    assert Controller.load(run, device="cpu").kind.value == "ddpm"
    capsys.readouterr()
    assert main(["sample", str(run), "--n", "2", "--device", "cpu"]) == 0
    assert capsys.readouterr().out.split() == [str(run / "samples" / "sample_step00000004_seed0_dpmsolver3.png")]


def test_a_controller_compiled_on_the_cpu_plans_what_the_eager_one_plans(task_and_net):
    """``sampling_network(..., many_calls=True)`` (what ``Controller.load`` runs) compiles on the
    CPU under ``runtime.compile auto``, and its plans are the eager network's for the same seed."""
    from diffscale.diffusion.inference import sampling_network
    from diffscale.io.stages import saying

    task, net = task_and_net
    runtime = resolve_config(ConfigSources(preset="policy-tiny", device="cpu")).runtime
    compiled = sampling_network(net, runtime, many_calls=True)
    assert compiled.policy.compile and not sampling_network(net, runtime).policy.compile
    two, one = task.preview_obs[:2], task.preview_obs[2:3]
    said: list[str] = []
    for sampler in ("ddpm", "ddim"):
        plans = []
        for network in (net, compiled):
            controller = LoopController(task, network, sampler=sampler, steps=4)
            controller.reset(3)
            # re-plans of a shape seen before skip the guards; a new batch size compiles its own entry
            # and switching back picks the right one
            with saying(said.append):
                plans.append(torch.cat([controller.plan(h).flatten() for h in (two, two, one, one, two)]))
        assert torch.allclose(plans[0], plans[1], atol=1e-4), (sampler, (plans[0] - plans[1]).abs().max())
    # the first compiled call says it compiles and how long it took; the eager network and later calls say nothing
    assert len(said) == 2, said
    assert said[0] == ("sampling network: compiling for cpu (the network; kernels are cached for later runs on "
                       "this machine)")
    assert re.fullmatch(r"sampling network: compiled in \d+\.\d s \(the network\)", said[1]), said


# -- quality -------------------------------------------------------------------------------------
def test_policy_tiny_through_the_controller_takes_every_route_of_reach2d_routes(tmp_path):
    """policy-tiny as it ships, trained by the loop on the three-route variant (CPU, seeded, one
    thread) and rolled out through ``Controller.load`` with its defaults (DDPM, 10 steps): it takes
    each route, not always one. (The full bar, >= 0.9 success and each share within 10 points of
    the demonstrations', needs more training steps: docs/measurements/2026-11-27.md, "Policies that keep every
    mode".)"""
    from rich.console import Console

    from diffscale.training.loop import train

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # policy-tiny's kernels gain nothing from threads on a busy machine
    try:
        cfg = resolve_config(ConfigSources(preset="policy-tiny", device="cpu", data="builtin:reach2d-routes"))
        assert train(cfg, tmp_path / "run", console=Console(quiet=True)).finished
        controller = Controller.load(tmp_path / "run", device="cpu")
        summary = summarize(rollouts(lambda: Reach2D(layout=ROUTES), controller, episodes=100, seed=1000), ROUTES)
    finally:
        torch.set_num_threads(threads)
    print(f"\npolicy-tiny on reach2d-routes through the controller: {summary}")
    assert all(summary[f"mode_{mode}"] >= 0.05 for mode in ROUTES.modes), summary
    assert summary["success"] >= 0.5, summary
