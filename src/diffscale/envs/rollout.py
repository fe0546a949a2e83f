"""Closed-loop rollouts of a policy with a receding horizon, their summary and their GIFs.

Every episode plans from its last ``obs_horizon`` observations (the first one repeated at
the start, as training windows are padded), executes ``action_horizon`` actions of the
chunk starting at the current step (index ``obs_horizon - 1``, the step the newest
observation belongs to), and plans again. All episodes plan in one batch.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from ..errors import UserError
from .reach2d import ACTION_DIM, MODES, OBS_DIM, Reach2D

Policy = Callable[[np.ndarray], np.ndarray]
"""Observation histories (B, To, O) -> action chunks (B, T, A), in the data's units."""


@dataclass
class Rollout:
    """One finished episode."""

    success: bool
    mode: str | None
    """``left``/``right`` (the side the robot passed the obstacle on), or None."""
    length: int
    """Environment steps taken."""
    frames: list[np.ndarray] = field(default_factory=list)
    """Rendered RGB frames (H, W, 3) when recorded."""


def environment_for(source: str, obs_dim: int, action_dim: int) -> Callable[[], Reach2D]:
    """The environment the data source ``source`` was recorded in, checked against the policy's sizes."""
    if source.strip().lower() not in ("builtin", "builtin:reach2d"):
        raise UserError(f"no environment to roll out a policy trained on '{source}'",
                        "evaluate policies trained on builtin:reach2d; for other data, run the policy in your "
                        "own environment (task.plan gives action chunks)")
    if (obs_dim, action_dim) != (OBS_DIM, ACTION_DIM):
        raise UserError(f"the policy takes {obs_dim} observation and gives {action_dim} action values per step, "
                        f"reach2d has {OBS_DIM} and {ACTION_DIM}", "evaluate a policy trained on builtin:reach2d")
    return Reach2D


def rollouts(make_env: Callable[[], Reach2D], policy: Policy, *, episodes: int, seed: int, obs_horizon: int,
             action_horizon: int, record: int = 0) -> list[Rollout]:
    """Run ``episodes`` episodes (episode i reset with seed ``seed + i``) to their end; the first
    ``record`` are rendered every step."""
    envs = [make_env() for _ in range(episodes)]
    history = [deque([env.reset(seed + i)] * obs_horizon, maxlen=obs_horizon) for i, env in enumerate(envs)]
    frames: list[list[np.ndarray]] = [[env.render()] for env in envs[:record]]
    running = list(range(episodes))
    while running:
        # Ended episodes plan too: one batch shape throughout (a compiled sampling network
        # records its CUDA graphs once) and the same noise for an episode whichever others end.
        chunks = policy(np.stack([np.stack(h) for h in history]))
        still = []
        for i in running:
            chunk, ended = chunks[i], False
            for action in chunk[obs_horizon - 1: obs_horizon - 1 + action_horizon]:
                obs, _, terminated, truncated, _ = envs[i].step(action)
                history[i].append(obs)
                if i < record:
                    frames[i].append(envs[i].render())
                ended = terminated or truncated
                if ended:
                    break
            if not ended:
                still.append(i)
        running = still
    return [Rollout(env.success, env.mode, env.steps, frames[i] if i < record else [])
            for i, env in enumerate(envs)]


def summarize(results: list[Rollout]) -> dict[str, float]:
    """``episodes``, ``success`` (rate), ``mode_<name>`` (share of all episodes passing on that
    side) and ``length`` (mean environment steps per episode)."""
    n = len(results)
    summary = {"episodes": float(n), "success": sum(r.success for r in results) / n}
    for mode in MODES:
        summary[f"mode_{mode}"] = sum(r.mode == mode for r in results) / n
    summary["length"] = float(np.mean([r.length for r in results]))
    return summary


def write_gifs(results: list[Rollout], out_dir: Path, *, fps: int = 15) -> list[Path]:
    """One GIF per recorded rollout, named by its index and outcome (``rollout_0_left_success.gif``)."""
    import imageio.v2 as imageio

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for i, result in enumerate(results):
        if not result.frames:
            continue
        path = out_dir / f"rollout_{i}_{result.mode or 'none'}_{'success' if result.success else 'failure'}.gif"
        stills: list[npt.ArrayLike] = [*result.frames, *[result.frames[-1]] * fps]  # hold the end a second
        imageio.mimsave(path, stills, duration=1.0 / fps, loop=0)
        written.append(path)
    return written
