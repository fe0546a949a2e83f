"""PushT (gym-pusht, the optional extra ``pusht``) behind the interface ``rollouts`` uses.

The agent, a disk, pushes a T-shaped block onto a fixed target pose. Observations are
gym-pusht's ``state`` layout, which is the diffusion-policy PushT zarr's ``data/state``:
agent x, y, block x, y (pixels of the 512 x 512 arena) and block angle (radians in
[0, 2 pi)). An action is the agent's target position x, y in the same pixels, tracked by a
PD controller for one control step (10 physics steps).

Scored as the references score it: per step gym-pusht measures the share of the target area
the block covers; an episode's score is its best ``min(coverage / 0.95, 1)`` (the reward
diffusion policy's runner and LeRobot take the maximum of); it succeeds once coverage
exceeds 0.95, which ends it, and is cut off after 300 steps.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from diffscale.errors import UserError

OBS_DIM = 5
"""Observation values per step: agent x, y, block x, y, block angle."""
ACTION_DIM = 2
"""Action values per step: the agent's target position x, y."""
MAX_STEPS = 300
"""Steps before an episode is cut off, as the reference evaluation runs PushT."""
RENDER_SIZE = 192
"""Side of a rendered frame in pixels (the arena is 512; gym-pusht's own default is 680)."""
INSTALL = "pip install 'diffscale[pusht]'"


def env_class() -> Callable[..., Any]:
    """gym-pusht's ``PushTEnv``, or one ``UserError`` saying how to install it."""
    # pygame prints a greeting on stdout when it is imported: it would precede `--json`'s line
    os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
    try:
        from gym_pusht.envs.pusht import PushTEnv
    except ImportError as exc:  # gym-pusht or one of its dependencies (pygame, pymunk, shapely, cv2)
        raise UserError(f"--env pusht needs gym-pusht, which cannot be imported here ({exc})", INSTALL) from None
    return PushTEnv


class PushT:
    """One episode at a time, as ``rollouts`` drives it: ``reset(seed)``, then ``step`` until
    ``terminated or truncated``; ``success``, ``steps``, ``coverage`` (the best so far) after."""

    mode: str | None = None
    """PushT has no named ways of solving it (reach2d's left/right)."""

    def __init__(self, max_steps: int = MAX_STEPS, render_size: int = RENDER_SIZE) -> None:
        self.env = env_class()(obs_type="state", render_mode="rgb_array", visualization_width=render_size,
                               visualization_height=render_size)
        self.threshold = float(self.env.success_threshold)
        self.max_steps = max_steps
        self.steps, self.success, self.coverage = 0, False, 0.0

    def reset(self, seed: int | None = None, state: np.ndarray | None = None) -> np.ndarray:
        """Start an episode from a start drawn by ``seed`` (gym-pusht's generator) or from
        ``state`` (5 values, as an observation); returns the first observation (5,) float32."""
        obs, _ = self.env.reset(seed=seed, options=None if state is None else {"reset_to_state": state})
        self.steps, self.success, self.coverage = 0, False, 0.0
        return np.asarray(obs, dtype=np.float32)

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Track the target position ``action`` (2,) for one control step."""
        obs, reward, terminated, _, info = self.env.step(np.asarray(action, dtype=np.float64)[:ACTION_DIM])
        self.steps += 1
        self.coverage = max(self.coverage, float(info["coverage"]))
        self.success = bool(info["is_success"])
        truncated = not terminated and self.steps >= self.max_steps
        return np.asarray(obs, dtype=np.float32), float(reward), bool(terminated), truncated, info

    def render(self) -> np.ndarray:
        """The arena as an RGB image (RENDER_SIZE, RENDER_SIZE, 3) uint8, the last action marked."""
        return np.asarray(self.env.render())

    @property
    def score(self) -> float:
        """The reference's score of the episode so far: the best coverage over the success threshold, at most 1."""
        return min(self.coverage / self.threshold, 1.0)
