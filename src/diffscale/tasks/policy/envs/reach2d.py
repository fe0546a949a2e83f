"""``reach2d``: a 2-D point robot that must reach a goal past a round obstacle (pure numpy).

The robot starts just below the obstacle and the goal lies above it, both near the
vertical centre line, so there are two equally good ways round: left or right. The
scripted demonstrations come in pairs from one start, one each way. A policy that
regresses the mean action chunk heads straight up and hits the obstacle within its
first chunk (before closed-loop feedback could break the tie); one that models the
action distribution (a diffusion policy) commits to one side. That is what this
environment tests.

Coordinates lie in the square [-1, 1]^2. An observation is (robot x, robot y, goal x,
goal y); an action is the position the robot should move to next (absolute, as the
reference diffusion policies command), reached at most ``MAX_STEP`` per step.

``reach2d-routes`` (``ROUTES``) is the harder variant: two obstacles of unequal size leave
three routes of unequal width (left wide, middle narrow, right medium), and the scripted
demonstrations take them in known shares (``ROUTES.shares``). A straight line and the
shares' mean both run into the larger obstacle, so a policy reaches the goal only by
committing to one route, and keeps every mode only if it takes each in its share.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

OBS_DIM = 4
"""Observation values per step: robot x, y and goal x, y."""
ACTION_DIM = 2
"""Action values per step: the target position x, y."""
OBSTACLE = np.array([0.0, 0.0])
"""Centre of the obstacle."""
RADIUS = 0.35
"""Obstacle radius; touching it ends the episode as a failure."""
MAX_STEP = 0.08
"""Farthest the robot moves in one step (actions farther away are approached at this speed)."""
GOAL_TOLERANCE = 0.06
"""Distance to the goal that counts as reached."""
MAX_STEPS = 100
"""Steps before an episode is cut off (a demonstration needs 28-43)."""
MODES = ("left", "right")
"""The two ways round the obstacle, as ``Reach2D.mode`` reports them."""


@dataclass(frozen=True)
class Layout:
    """Obstacles (round) and the named routes between them, crossed at the obstacles' height.

    ``route_x``: where demonstrations cross (x at the obstacles' height), jittered by up to
    ``route_jitter``; ``shares``: the fraction of demonstrations on each route. The route an
    episode took is the gap between obstacle centres its path crossed (``modes`` left to right)."""

    name: str
    centres: tuple[tuple[float, float], ...]
    radii: tuple[float, ...]
    modes: tuple[str, ...]
    route_x: tuple[float, ...]
    route_jitter: tuple[float, ...]
    shares: tuple[float, ...]

    def hits(self, a: np.ndarray, b: np.ndarray) -> bool:
        """Whether the step a -> b touches any obstacle."""
        return any(_segment_hits_circle(a, b, np.asarray(c), r) for c, r in zip(self.centres, self.radii, strict=True))

    def mode_at(self, x: float) -> str:
        """The route of a path crossing the obstacles' height at ``x``."""
        return self.modes[int(np.searchsorted(np.array([c[0] for c in self.centres]), x, side="right"))]


TWO_WAYS = Layout("reach2d", ((0.0, 0.0),), (RADIUS,), MODES, (-RADIUS - 0.16, RADIUS + 0.16), (0.04, 0.04),
                  (0.5, 0.5))
"""The original task: one obstacle, left or right, half the demonstrations each."""
ROUTES = Layout("reach2d-routes", ((-0.15, 0.0), (0.55, 0.0)), (0.3, 0.15), ("left", "middle", "right"),
                (-0.725, 0.275, 0.85), (0.1, 0.03, 0.05), (0.5, 0.3, 0.2))
"""Three routes: left of the large obstacle (0.55 wide), between the two (0.25), right of the
small one (0.3); demonstrated 50 / 30 / 20 %. The shares' mean crossing (x -0.05) and the
straight line (x 0) both hit the large obstacle."""
LAYOUTS = {layout.name: layout for layout in (TWO_WAYS, ROUTES)}


def _segment_hits_circle(a: np.ndarray, b: np.ndarray, centre: np.ndarray, radius: float) -> bool:
    """Whether the segment a -> b passes within ``radius`` of ``centre`` (a whole step is checked,
    so a fast step cannot jump through the obstacle)."""
    ab = b - a
    length2 = float(ab @ ab)
    s = 0.0 if length2 == 0.0 else float(np.clip((centre - a) @ ab / length2, 0.0, 1.0))
    closest = a + s * ab
    return float(np.linalg.norm(centre - closest)) < radius


@dataclass
class Reach2D:
    """One episode at a time. ``reset`` then ``step`` until ``terminated or truncated`` (the
    gymnasium convention: ``step`` returns obs, reward, terminated, truncated, info)."""

    max_steps: int = MAX_STEPS
    """Steps before the episode is truncated."""
    layout: Layout = TWO_WAYS
    """The obstacles and the routes between them."""
    position: np.ndarray = field(default_factory=lambda: np.zeros(2))
    goal: np.ndarray = field(default_factory=lambda: np.zeros(2))
    path: list[np.ndarray] = field(default_factory=list)
    steps: int = 0
    crashed: bool = False
    success: bool = False
    mode: str | None = None
    """The route (``layout.modes``: ``left`` or ``right`` round one obstacle) on which the robot first
    passed the obstacles' centre height."""

    def reset(self, seed: int | None = None) -> np.ndarray:
        """Start a new episode (start and goal jittered by ``seed``); returns the first observation (4,)."""
        rng = np.random.default_rng(seed)
        self.position = np.array([rng.uniform(-0.1, 0.1), -0.6])
        self.goal = np.array([rng.uniform(-0.1, 0.1), 0.8])
        self.path = [self.position.copy()]
        self.steps, self.crashed, self.success, self.mode = 0, False, False, None
        return self.observation()

    def observation(self) -> np.ndarray:
        return np.concatenate([self.position, self.goal]).astype(np.float32)

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Move towards the target position ``action`` (2,), at most ``MAX_STEP``."""
        delta = np.asarray(action, dtype=np.float64)[:2] - self.position
        distance = float(np.linalg.norm(delta))
        if distance > MAX_STEP:
            delta *= MAX_STEP / distance
        before, after = self.position, np.clip(self.position + delta, -1.0, 1.0)
        self.crashed = self.layout.hits(before, after)
        self.position = after
        self.path.append(after.copy())
        self.steps += 1
        if self.mode is None and before[1] < OBSTACLE[1] <= after[1]:
            self.mode = self.layout.mode_at(float(after[0]))
        self.success = not self.crashed and float(np.linalg.norm(self.goal - after)) < GOAL_TOLERANCE
        terminated = self.crashed or self.success
        truncated = not terminated and self.steps >= self.max_steps
        info = {"success": self.success, "crashed": self.crashed, "mode": self.mode}
        return self.observation(), float(self.success), terminated, truncated, info

    def render(self, size: int = 128) -> np.ndarray:
        """The arena as an RGB image (size, size, 3) uint8: obstacle grey, goal green, path and robot blue."""
        pixels = (np.arange(size) + 0.5) / size * 2.0 - 1.0
        x, y = np.meshgrid(pixels, -pixels)  # image rows run top to bottom, y runs bottom to top
        image = np.full((size, size, 3), 255, dtype=np.uint8)

        def disk(centre: np.ndarray, radius: float, colour: tuple[int, int, int]) -> None:
            image[(x - centre[0]) ** 2 + (y - centre[1]) ** 2 <= radius**2] = colour

        for centre, radius in zip(self.layout.centres, self.layout.radii, strict=True):
            disk(np.asarray(centre), radius, (150, 150, 150))
        disk(self.goal, GOAL_TOLERANCE, (60, 180, 75))
        dot = 1.5 * 2.0 / size
        for point in self.path[:-1]:
            disk(point, dot, (150, 190, 240))
        disk(self.position, 3 * dot, (220, 40, 40) if self.crashed else (30, 90, 200))
        return image


def demonstration(rng: np.random.Generator, side: int, start_seed: int,
                  route_x: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """One scripted episode from the start and goal of ``reset(start_seed)``, passing the obstacle
    on ``side`` (-1 left, +1 right), or, with ``route_x``, crossing the obstacles' height near
    that x (``ROUTES``).

    The robot follows start -> two jittered waypoints beside the obstacle -> goal at a
    jittered constant speed; each action is the next position on that path. Returns
    obs (T, 4) and action (T, 2), float32.
    """
    env = Reach2D(layout=TWO_WAYS if route_x is None else ROUTES)
    env.reset(start_seed)
    x = side * (RADIUS + rng.uniform(0.12, 0.2)) if route_x is None else route_x
    waypoints = np.array([
        env.position,
        [x, -0.1 + rng.uniform(-0.05, 0.05)],
        [x, 0.25 + rng.uniform(-0.05, 0.05)],
        env.goal,
    ])
    lengths = np.linalg.norm(np.diff(waypoints, axis=0), axis=1)
    along = np.concatenate([[0.0], np.cumsum(lengths)])
    speed = rng.uniform(0.045, 0.06)
    arc = np.append(np.arange(speed, along[-1], speed), along[-1])
    path = np.stack([np.interp(arc, along, waypoints[:, 0]), np.interp(arc, along, waypoints[:, 1])], axis=1)
    observations, actions = [], []
    for target in path:
        observations.append(env.observation())
        actions.append(target.astype(np.float32))
        _, _, terminated, _, _ = env.step(target)
        if terminated:
            break
    assert env.success, "a scripted demonstration must reach the goal"
    return np.stack(observations), np.stack(actions)


def demonstrations(count: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """``count`` scripted episodes (seeded), in pairs that share a start and a goal: one goes
    left, the other right. So every start is seen with both modes, and no observation tells
    which one a demonstrator took (a regression policy cannot learn to pick one)."""
    rng = np.random.default_rng(seed)
    episodes: list[tuple[np.ndarray, np.ndarray]] = []
    while len(episodes) < count:
        start_seed = int(rng.integers(2**31))
        for side in rng.permutation([-1, 1])[: count - len(episodes)]:
            episodes.append(demonstration(rng, int(side), start_seed))
    return episodes


def route_demonstrations(count: int, seed: int = 0, layout: Layout = ROUTES) -> list[tuple[np.ndarray, np.ndarray]]:
    """``count`` scripted episodes (seeded) of ``layout``, each from its own start, taking the
    routes in ``layout.shares`` exactly (rounded), in a seeded order: the start does not tell
    which route a demonstrator took."""
    rng = np.random.default_rng(seed)
    counts = np.floor(np.asarray(layout.shares) * count).astype(int)
    counts[: count - counts.sum()] += 1  # rounding's remainder to the first routes
    routes = rng.permutation(np.repeat(np.arange(len(layout.modes)), counts))
    episodes = []
    for route in routes.tolist():
        x = layout.route_x[route] + rng.uniform(-1.0, 1.0) * layout.route_jitter[route]
        episodes.append(demonstration(rng, 0, int(rng.integers(2**31)), route_x=x))
    return episodes
