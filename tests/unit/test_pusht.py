"""PushT evaluation (gym-pusht, the ``pusht`` extra): the adapter's observations, coverage,
success and cut-off; ``diffscale eval --env pusht`` of a policy trained on a PushT-layout zarr
(episodes rolled in gym-pusht here); and the refusals, which need no gym-pusht.

Outside CI a missing gym-pusht skips the tests that need it, with the reason; under
``CI=true`` they fail (CI installs it with the ``test`` extra).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from diffscale.cli import main
from diffscale.errors import UserError
from diffscale.tasks.base import no_environment

from helpers import REPO

MICRO_POLICY = ["--preset", "policy-tiny", "--set", "model.down_dims=[16,32]", "--set", "model.step_embed_dim=16",
                "--set", "train.batch_per_gpu=16", "--set", "train.log_every=2", "--set", "train.checkpoint_every=2",
                "--set", "train.sample_count=4", "--set", "train.sample_steps=3", "--set", "train.steps=2"]
FOLLOW_DATA = ["--set", "model.obs_dim=0", "--set", "model.action_dim=0"]


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


@pytest.fixture(scope="module")
def gym():
    """gym-pusht's PushTEnv class (through the adapter's import)."""
    from diffscale.tasks.policy.envs.pusht import env_class

    try:
        return env_class()
    except UserError as exc:
        reason = f"gym-pusht is not importable: {exc.message}"
        if _in_ci():
            pytest.fail(f"CI=true: {reason}")
        pytest.skip(reason)


def _train(run, *args: str) -> None:
    assert main(["train", "--out", str(run), *MICRO_POLICY, *args]) == 0


def _pusht_zarr(path, gym, episodes: int = 4, length: int = 20) -> None:
    """The diffusion-policy replay-buffer layout of PushT: ``data/state`` (agent x, y, block x, y,
    angle), ``data/action`` (target x, y) and ``meta/episode_ends``, from gym-pusht rolled with
    a scripted push of the agent towards the block (noisy)."""
    import zarr

    rng = np.random.default_rng(0)
    states, actions, ends = [], [], []
    for episode in range(episodes):
        env = gym(obs_type="state")
        obs, _ = env.reset(seed=episode)
        start, block = obs[:2], obs[2:4]
        for k in range(length):
            target = start + (block - start) * min(1.0, (k + 1) / 12) + rng.normal(0, 5, 2)
            states.append(obs.astype(np.float32))
            actions.append(target.astype(np.float32))
            obs, *_ = env.step(target)
        ends.append(len(states))
    v3 = zarr.__version__.startswith("3")
    root = zarr.open_group(str(path), mode="w", **({"zarr_format": 2} if v3 else {}))  # the reference's format
    create = root.create_array if v3 else root.create_dataset  # zarr 3 renamed it
    create("data/state", data=np.stack(states))
    create("data/action", data=np.stack(actions))
    create("meta/episode_ends", data=np.array(ends))


def test_adapter_observes_the_state_layout_scores_coverage_and_cuts_off(gym):
    from diffscale.tasks.policy.envs.pusht import OBS_DIM, RENDER_SIZE, PushT

    env = PushT(max_steps=4)
    obs = env.reset(seed=3)
    raw, _ = gym(obs_type="state").reset(seed=3)
    assert obs.shape == (OBS_DIM,) and obs.dtype == np.float32 and np.array_equal(obs, raw.astype(np.float32))
    # gym-pusht sets a block's position before its angle, which shifts it: measure the shift,
    # then start with the block exactly on the target pose (256, 256, pi / 4)
    target = np.array([256.0, 256.0, np.pi / 4])
    placed = env.reset(state=np.array([60.0, 60.0, *target]))
    on_target = env.reset(state=np.array([60.0, 60.0, *(2 * target[:2] - placed[2:4]), target[2]]))
    assert np.allclose(on_target[2:], target, atol=1e-3)
    _, reward, terminated, truncated, info = env.step(np.array([60.0, 60.0]))
    assert terminated and not truncated and env.success and env.steps == 1 and reward == 1.0
    assert env.coverage == info["coverage"] > 0.95 and env.score == 1.0
    env.reset(state=np.array([60.0, 60.0, 400.0, 400.0, 0.0]))  # far from the target: never covered
    ended = [env.step(np.array([60.0, 60.0]))[2:4] for _ in range(4)]
    assert ended == [(False, False)] * 3 + [(False, True)]  # cut off at max_steps, not terminated
    assert not env.success and env.steps == 4 and env.coverage == env.score == 0.0
    frame = env.render()
    assert frame.shape == (RENDER_SIZE, RENDER_SIZE, 3) and frame.dtype == np.uint8


def test_eval_on_pusht_of_a_policy_trained_on_a_pusht_zarr(gym, tmp_path, capsys):
    import imageio.v2 as imageio

    from diffscale.tasks.policy.envs.pusht import RENDER_SIZE

    _pusht_zarr(tmp_path / "pusht.zarr", gym)
    run = tmp_path / "run"
    _train(run, "--data", f"zarr:{tmp_path / 'pusht.zarr'}", *FOLLOW_DATA)
    capsys.readouterr()
    assert main(["eval", str(run), "--env", "pusht", "--count", "2", "--steps", "2", "--max-episode-steps", "12",
                 "--json"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1, out  # one JSON line and nothing else
    record = json.loads(out[0])
    assert record["env"] == "pusht" and record["episodes"] == 2 and record["step"] == 2
    assert not {"mode_left", "mode_right"} & record.keys()
    assert 0.0 <= record["coverage"] <= record["score"] <= 1.0 and record["success"] in (0.0, 0.5, 1.0)
    folder = run / "eval" / "step_00000002"
    episodes = [json.loads(line) for line in (folder / "rollouts.jsonl").read_text().splitlines()]
    assert [e["seed"] for e in episodes] == [0, 1]
    assert all(1 <= e["length"] <= 12 and 0.0 <= e["coverage"] <= 1.0 and e["mode"] is None for e in episodes)
    assert np.isclose(np.mean([e["coverage"] for e in episodes]), record["coverage"])
    assert np.isclose(np.mean([e["length"] for e in episodes]), record["length"])
    gifs = sorted(folder.glob("rollout_*.gif"))
    assert [g.name.split("_")[2].startswith("coverage") for g in gifs] == [True, True]
    for gif, episode in zip(gifs, episodes, strict=True):
        frames = imageio.mimread(gif)  # the start and each step (the GIF writer merges identical ones)
        assert 1 < len(frames) <= episode["length"] + 1 and frames[0].shape == (RENDER_SIZE, RENDER_SIZE, 3)
    last = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["kind"] == "eval" and last["coverage"] == pytest.approx(record["coverage"], rel=1e-5)  # printed rounded


def test_the_pusht_import_prints_nothing_on_stdout(gym):
    """pygame greets on stdout at import, which would precede ``--json``'s line; the adapter
    hides it (the bare import shows that the check would see it)."""
    env = {k: v for k, v in os.environ.items() if k != "PYGAME_HIDE_SUPPORT_PROMPT"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")])

    def stdout(code: str) -> str:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "pygame" in stdout("import pygame")
    assert stdout("from diffscale.tasks.policy.envs.pusht import env_class; env_class()") == ""


def _snapshot(root):
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in sorted(root.rglob("*"))}


def _refused(argv: list[str], run, capsys) -> str:
    """Run ``argv``: exit 2, one error line (the last), no traceback, nothing under ``run`` changed."""
    before = _snapshot(run)
    capsys.readouterr()
    assert main(argv) == 2
    out, err = capsys.readouterr()
    lines = [line for line in (out + err).splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and err.rstrip().splitlines()[-1] == lines[0] and "Traceback" not in out + err
    assert _snapshot(run) == before and not (run / "eval").exists()
    return lines[0]


def test_pusht_refuses_other_sizes_and_unknown_environments(tmp_path, capsys):
    run = tmp_path / "reach"
    _train(run, "--set", "data.max_items=20")
    said = _refused(["eval", str(run), "--env", "pusht", "--count", "2"], run, capsys)
    assert ("the policy takes 4 observation and gives 2 action values per step, pusht has 5 and 2 (agent x, y, "
            "block x, y, block angle; the agent's target x, y) -- evaluate a policy trained on the PushT zarr's "
            "state (--data zarr:PATH reads data/state); keypoint observations") in said
    said = _refused(["eval", str(run), "--env", "pushtt"], run, capsys)
    assert ("unknown environment 'pushtt' (did you mean 'pusht'?) -- use one of: auto, reach2d, reach2d-routes, "
            "pusht") in said
    with pytest.raises(UserError, match="fields runs are evaluated without an environment"):
        no_environment("fields", "pusht", None)
    no_environment("fields", "auto", None)


def test_pusht_without_gym_pusht_names_the_extra(tmp_path, capsys, monkeypatch):
    """A policy of PushT's sizes, evaluated where gym-pusht cannot be imported (simulated)."""
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "demo.npz", obs=rng.normal(size=(40, 5)).astype(np.float32),
             action=rng.normal(size=(40, 2)).astype(np.float32), episode_ends=np.array([20, 40]))
    run = tmp_path / "run"
    _train(run, "--data", f"npz:{tmp_path / 'demo.npz'}", *FOLLOW_DATA)
    said = _refused(["eval", str(run)], run, capsys)  # auto: the data names no environment
    assert "no environment to roll out a policy trained on 'npz:" in said and "name one with --env (pusht:" in said
    for name in [m for m in sys.modules if m.split(".")[0] == "gym_pusht"] + ["gym_pusht", "gym_pusht.envs.pusht"]:
        monkeypatch.setitem(sys.modules, name, None)  # `import` of a None entry raises ImportError
    said = _refused(["eval", str(run), "--env", "pusht", "--count", "2"], run, capsys)
    assert said.startswith("error: --env pusht needs gym-pusht, which cannot be imported here (")
    assert said.endswith(" -- pip install 'diffscale[pusht]'")
