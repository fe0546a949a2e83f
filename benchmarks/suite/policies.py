"""Policy demonstration sets recorded in diffscale's reach2d environments, by demonstrators unlike
the built-in scripted ones, so ``diffscale eval RUN --env reach2d|reach2d-routes`` rolls the
trained policy out where its data came from.

Each generator is ``make(rng, n) -> [(obs (T, 4), action (T, 2)), ...]`` float32, ``n`` episodes;
they are written as ``npz:PATH`` (``obs``, ``action``, ``episode_ends``; tasks/policy/episodes.py).

* ``wobbly`` (two ways, uneven): the one-obstacle layout of ``builtin:reach2d``, passed left in
  70 % and right in 30 % of the episodes, each from its own start. The demonstrator's path sways
  sideways (a smooth sine of random phase, up to 0.05) and its speed varies along the way
  (0.03-0.07 per step), like a human's teleoperation rather than a script's constant speed.
* ``routes`` (several routes): the three-route layout of ``builtin:reach2d-routes`` taken in equal
  shares, with wider crossings, swaying paths and varied speed. Three modes of equal weight; the
  mean of any two of them hits an obstacle.

A sway that would touch an obstacle or miss the goal is drawn again (the episode is checked by
stepping the environment), so every demonstration succeeds.
"""

from __future__ import annotations

import numpy as np

from diffscale.tasks.policy.envs.reach2d import RADIUS, ROUTES, TWO_WAYS, Layout, Reach2D

Episode = tuple[np.ndarray, np.ndarray]


def _path(rng: np.random.Generator, start: np.ndarray, goal: np.ndarray, cross_x: float) -> np.ndarray:
    """Positions (T, 2) from ``start`` past the obstacles' height at ``cross_x`` to ``goal``: through
    two jittered waypoints, with a sideways sway and a speed that varies along the way."""
    waypoints = np.array([start, [cross_x, -0.1 + rng.uniform(-0.05, 0.05)],
                          [cross_x, 0.25 + rng.uniform(-0.05, 0.05)], goal])
    along = np.concatenate([[0.0], np.cumsum(np.linalg.norm(np.diff(waypoints, axis=0), axis=1))])
    fine = np.linspace(0.0, along[-1], 400)
    points = np.stack([np.interp(fine, along, waypoints[:, 0]), np.interp(fine, along, waypoints[:, 1])], axis=1)
    sway = rng.uniform(0.02, 0.05) * np.sin(np.pi * fine / along[-1] * rng.integers(1, 4) + rng.uniform(0, np.pi))
    points[:, 0] += sway * np.sin(np.pi * fine / along[-1])  # no sway at the start and the goal
    speed = rng.uniform(0.03, 0.07) * (1 + 0.3 * np.sin(2 * np.pi * fine / along[-1] + rng.uniform(0, 2 * np.pi)))
    arc = np.concatenate([[0.0], np.cumsum(np.linalg.norm(np.diff(points, axis=0), axis=1))])
    steps, position = [], 0.0
    while position < arc[-1]:
        position = min(position + float(np.interp(position, arc, speed)), arc[-1])
        steps.append(position)
    return np.stack([np.interp(steps, arc, points[:, 0]), np.interp(steps, arc, points[:, 1])], axis=1)


def _demonstration(rng: np.random.Generator, layout: Layout, route: int, jitter: float) -> Episode:
    """One successful episode from a seeded start of ``layout`` on ``route``, drawn again until the
    environment says it reached the goal without touching an obstacle."""
    while True:
        env = Reach2D(layout=layout)
        env.reset(int(rng.integers(2**31)))
        cross_x = layout.route_x[route] + rng.uniform(-1.0, 1.0) * jitter
        observations, actions = [], []
        for target in _path(rng, env.position.copy(), env.goal.copy(), cross_x):
            observations.append(env.observation())
            actions.append(target.astype(np.float32))
            _, _, terminated, _, _ = env.step(target)
            if terminated:
                break
        if env.success:
            return np.stack(observations), np.stack(actions)


def _episodes(rng: np.random.Generator, n: int, layout: Layout, shares: tuple[float, ...],
              jitter: tuple[float, ...]) -> list[Episode]:
    """``n`` episodes taking the routes of ``layout`` in ``shares`` (rounded), in a seeded order."""
    counts = np.floor(np.asarray(shares) * n).astype(int)
    counts[: n - counts.sum()] += 1
    routes = rng.permutation(np.repeat(np.arange(len(shares)), counts))
    return [_demonstration(rng, layout, int(route), jitter[route]) for route in routes]


def wobbly(rng: np.random.Generator, n: int) -> list[Episode]:
    """Two ways round one obstacle, 70 / 30, swaying human-like paths."""
    cross = RADIUS + 0.16
    layout = Layout("reach2d", TWO_WAYS.centres, TWO_WAYS.radii, TWO_WAYS.modes, (-cross, cross), (0.04, 0.04),
                    (0.7, 0.3))
    return _episodes(rng, n, layout, layout.shares, layout.route_jitter)


def routes(rng: np.random.Generator, n: int) -> list[Episode]:
    """Three routes in equal shares, wider crossings than the built-in demonstrations."""
    return _episodes(rng, n, ROUTES, (1 / 3, 1 / 3, 1 / 3), (0.12, 0.05, 0.07))


GENERATORS = {"wobbly": (wobbly, "reach2d"), "routes": (routes, "reach2d-routes")}
"""Each set's generator and the environment ``diffscale eval --env`` rolls its policies out in."""
