"""Closed-loop rollouts of a policy controller, their summary and their GIFs.

All episodes run as one batch of environments through one controller (the policy's
``Controller``: it keeps each episode's observation history and queue of planned actions,
and plans again every ``action_horizon`` steps); a step passes every episode's newest
observation and executes one action each. Episodes that ended keep passing their last
observation, so the batch keeps its shape (a compiled network records its graphs once) and
an episode's noise does not depend on when the others end.

The environment is named, never guessed from a file name: ``auto`` is reach2d (or
reach2d-routes) for the built-in data and nothing otherwise; ``reach2d``,
``reach2d-routes`` and ``pusht`` (gym-pusht) are the others.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from diffscale.errors import UserError, closest
from diffscale.io.atomic import atomic_path, write_text
from diffscale.io.stages import stage
from diffscale.tasks.policy.envs import pusht
from diffscale.tasks.policy.envs.reach2d import ACTION_DIM, LAYOUTS, MAX_STEPS, OBS_DIM, TWO_WAYS, Layout, Reach2D

ENVIRONMENTS = ("auto", "reach2d", "reach2d-routes", "pusht")
"""The names ``diffscale eval --env`` takes."""


class ActionController(Protocol):
    """What ``rollouts`` drives (the policy's ``Controller``): ``reset(seed)`` before an episode
    batch, then one ``select_action`` per control step, observations (B, O) -> actions (B, A)
    in the data's units."""

    def reset(self, seed: int | None = None) -> None: ...

    def select_action(self, obs: np.ndarray) -> np.ndarray: ...


class RolloutEnv(Protocol):
    """What ``rollouts`` needs of an environment (``Reach2D``, ``pusht.PushT``): gymnasium's
    ``step``, a seeded ``reset`` and an RGB ``render``; the episode's outcome as attributes."""

    success: bool
    steps: int
    mode: str | None

    def reset(self, seed: int | None = None) -> np.ndarray: ...

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]: ...

    def render(self) -> np.ndarray: ...


@dataclass
class Rollout:
    """One finished episode."""

    success: bool
    mode: str | None
    """The route the robot took (reach2d: ``left``/``right``; reach2d-routes: also ``middle``), or None."""
    length: int
    """Environment steps taken."""
    frames: list[np.ndarray] = field(default_factory=list)
    """Rendered RGB frames (H, W, 3) when recorded."""
    coverage: float | None = None
    """PushT: the largest share of the target area the block covered (None elsewhere)."""
    score: float | None = None
    """PushT: the reference's score, ``min(coverage / success threshold, 1)`` (None elsewhere)."""


@dataclass(frozen=True)
class Environment:
    """Where a policy is rolled out: a fresh environment per episode, and the episodes' summary."""

    name: str
    make: Callable[[], RolloutEnv]
    summarize: Callable[[list[Rollout]], dict[str, float]]


def _check_sizes(name: str, obs_dim: int, action_dim: int, wanted: tuple[int, int], layout: str, fix: str) -> None:
    if (obs_dim, action_dim) != wanted:
        raise UserError(f"the policy takes {obs_dim} observation and gives {action_dim} action values per step, "
                        f"{name} has {wanted[0]} and {wanted[1]} ({layout})", fix)


def environment_for(source: str, obs_dim: int, action_dim: int, env: str = "auto",
                    max_episode_steps: int | None = None) -> Environment:
    """The environment ``env`` (``auto``: the one the data source ``source`` was recorded in),
    checked against the policy's sizes; episodes cut off after ``max_episode_steps`` (None: the
    environment's own limit)."""
    name = env.strip().lower()
    if name == "auto":
        builtin = {"builtin": "reach2d", "builtin:reach2d": "reach2d", "builtin:reach2d-routes": "reach2d-routes"}
        if source.strip().lower() not in builtin:
            raise UserError(f"no environment to roll out a policy trained on '{source}'",
                            "name one with --env (pusht: gym-pusht's PushT, for policies trained on the PushT "
                            "zarr's state), or run the policy in your own environment (diffscale.policy.Controller "
                            "gives an action per step)")
        name = builtin[source.strip().lower()]
    if name in LAYOUTS:
        _check_sizes(name, obs_dim, action_dim, (OBS_DIM, ACTION_DIM), "robot x, y, goal x, y; the target x, y",
                     f"evaluate a policy trained on builtin:{name}")
        reach_steps, layout = max_episode_steps or MAX_STEPS, LAYOUTS[name]
        return Environment(name, lambda: Reach2D(max_steps=reach_steps, layout=layout), route_summary(layout))
    if name == "pusht":
        _check_sizes(name, obs_dim, action_dim, (pusht.OBS_DIM, pusht.ACTION_DIM),
                     "agent x, y, block x, y, block angle; the agent's target x, y",
                     "evaluate a policy trained on the PushT zarr's state (--data zarr:PATH reads data/state); "
                     "keypoint observations (zarr:PATH:keypoint+state) cannot be evaluated: the zarr's 9 keypoints "
                     "are not gym-pusht's 8")
        pusht.env_class()  # refused now, before any episode, where gym-pusht is missing
        push_steps = max_episode_steps or pusht.MAX_STEPS
        return Environment(name, lambda: pusht.PushT(max_steps=push_steps), summarize_coverage)
    raise UserError(f"unknown environment '{env}'{closest(name, ENVIRONMENTS)}",
                    f"use one of: {', '.join(ENVIRONMENTS)}")


def rollouts(make_env: Callable[[], RolloutEnv], controller: ActionController, *, episodes: int, seed: int,
             record: int = 0) -> list[Rollout]:
    """Run ``episodes`` episodes (episode i reset with seed ``seed + i``; the controller reset
    with ``seed``) to their end as one batch; the first ``record`` are rendered every step."""
    envs = [make_env() for _ in range(episodes)]
    obs = np.stack([env.reset(seed + i) for i, env in enumerate(envs)])
    frames: list[list[np.ndarray]] = [[env.render()] for env in envs[:record]]
    running = np.ones(episodes, dtype=bool)
    controller.reset(seed)
    started, said = time.perf_counter(), 0
    stage(f"rollouts: {episodes} episodes at once")
    while running.any():
        actions = controller.select_action(obs)
        for i in np.flatnonzero(running).tolist():
            obs[i], _, terminated, truncated, _ = envs[i].step(actions[i])
            if i < record:
                frames[i].append(envs[i].render())
            running[i] = not (terminated or truncated)
        ended = episodes - int(running.sum())
        if ended * 4 // episodes > said:  # a line per quarter of the episodes ended
            said = ended * 4 // episodes
            stage(f"rollouts: {ended} of {episodes} ended ({sum(env.success for env in envs)} succeeded), "
                  f"{time.perf_counter() - started:.1f} s")
    # environments that score partial progress (PushT's coverage) say so beside success
    return [Rollout(env.success, env.mode, env.steps, frames[i] if i < record else [],
                    coverage=getattr(env, "coverage", None), score=getattr(env, "score", None))
            for i, env in enumerate(envs)]


def summarize(results: list[Rollout], layout: Layout = TWO_WAYS) -> dict[str, float]:
    """``episodes``, ``success`` (rate), ``mode_<name>`` (share of all episodes taking that
    route), ``demo_<name>`` (the demonstrations' share of it), ``mode_gap`` (the largest
    difference between the two, in shares: 0.1 is 10 points) and ``length`` (mean
    environment steps per episode)."""
    n = len(results)
    summary: dict[str, float] = {"episodes": n, "success": sum(r.success for r in results) / n}
    for mode, share in zip(layout.modes, layout.shares, strict=True):
        summary[f"mode_{mode}"] = sum(r.mode == mode for r in results) / n
        summary[f"demo_{mode}"] = share
    summary["mode_gap"] = max(abs(summary[f"mode_{m}"] - summary[f"demo_{m}"]) for m in layout.modes)
    summary["length"] = float(np.mean([r.length for r in results]))
    return summary


def route_summary(layout: Layout) -> Callable[[list[Rollout]], dict[str, float]]:
    """``summarize`` for the routes of ``layout``."""
    return lambda results: summarize(results, layout)


def summarize_coverage(results: list[Rollout]) -> dict[str, float]:
    """PushT's summary, as the references report it: ``episodes``, ``success`` (rate),
    ``coverage`` (mean of each episode's largest coverage of the target area), ``score``
    (mean of each episode's best reward, diffusion policy's ``mean_score``) and ``length``."""
    n = len(results)
    return {"episodes": n, "success": sum(r.success for r in results) / n,
            "coverage": float(np.mean([r.coverage or 0.0 for r in results])),
            "score": float(np.mean([r.score or 0.0 for r in results])),
            "length": float(np.mean([r.length for r in results]))}


def write_episodes(results: list[Rollout], path: Path, *, seed: int) -> Path:
    """One JSON line per episode (its seed, outcome, length, and coverage and score where scored)."""
    lines = []
    for i, r in enumerate(results):
        line: dict[str, Any] = {"episode": i, "seed": seed + i, "success": r.success, "length": r.length,
                                "mode": r.mode}
        line.update({k: v for k, v in (("coverage", r.coverage), ("score", r.score)) if v is not None})
        lines.append(json.dumps(line) + "\n")
    return write_text(path, "".join(lines))


def write_gifs(results: list[Rollout], out_dir: Path, *, fps: int = 15) -> list[Path]:
    """One GIF per recorded rollout, named by its index, mode or coverage (percent) and outcome
    (``rollout_0_left_success.gif``, ``rollout_1_coverage87_failure.gif``). An earlier evaluation's
    rollout GIFs in ``out_dir`` are removed first: their names carry outcomes, so the new ones would
    not replace them, and the folder would show rollouts this evaluation did not run."""
    import imageio.v2 as imageio

    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.glob("rollout_*.gif"):
        stale.unlink()
    written = []
    for i, result in enumerate(results):
        if not result.frames:
            continue
        label = result.mode or ("none" if result.coverage is None else f"coverage{round(100 * result.coverage)}")
        path = out_dir / f"rollout_{i}_{label}_{'success' if result.success else 'failure'}.gif"
        stills: list[npt.ArrayLike] = [*result.frames, *[result.frames[-1]] * fps]  # hold the end a second
        with atomic_path(path) as tmp:
            imageio.mimsave(tmp, stills, duration=1.0 / fps, loop=0)
        written.append(path)
    return written
