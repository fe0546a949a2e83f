"""Field data sets unlike ``builtin:fields``, whose fine values given the condition are Gaussian.

Each generator is ``make(rng, n) -> (cond, x)``, float32 (n, C) and (n, D), the arrays
``npz:PATH`` holds for ``task: fields`` (tasks/fields/data.py).

* ``fronts`` (bimodal): the condition is the built-in one (a coarse cell and its six hexagonal
  neighbours, correlated Gaussian), so field-icon's sizes fit (7 -> 16 x 16). Inside the cell runs a
  sharp front across the coarse gradient; which side is high is a coin flip weighted by the
  gradient's strength, so each fine value is a mixture of two separated modes. The field's cell mean
  is the centre value (``model.coarse_index`` 0 holds).
* ``rain`` (heavy-tailed, intermittent): 5 large-scale predictors -> 8 x 8 non-negative
  intensities. Points are dry (exactly 0) on a smooth random region whose share the predictors
  set; wet points are log-normal (log standard deviation about 1.2 around a level the predictors
  set), so the top 0.1 % of values are tens of times the median. No condition value is the fine
  mean (``model.coarse_index`` -1).
"""

from __future__ import annotations

import numpy as np
from scipy.stats import norm


def _hex_conditions(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Conditions (n, 7): a cell and its six neighbours, exponentially correlated over their
    centres; and the neighbours' unit directions (6, 2)."""
    angles = np.arange(6) * np.pi / 3
    points = np.concatenate([np.zeros((1, 2)), np.stack([np.cos(angles), np.sin(angles)], axis=1)])
    distance = np.linalg.norm(points[:, None] - points[None], axis=-1)
    factor = np.linalg.cholesky(np.exp(-distance / 1.5))
    return (rng.standard_normal((n, 7)) @ factor.T).astype(np.float32), points[1:]


def _smooth_noise(rng: np.random.Generator, n: int, side: int, length: float) -> np.ndarray:
    """(n, side * side) Gaussian noise with a squared-exponential correlation of ``length`` cell widths."""
    ticks = (np.arange(side) + 0.5) / side
    grid = np.stack(np.meshgrid(ticks, ticks, indexing="ij"), axis=-1).reshape(-1, 2)
    kernel = np.exp(-((grid[:, None] - grid[None]) ** 2).sum(-1) / (2 * length**2)) + 1e-6 * np.eye(len(grid))
    return rng.standard_normal((n, len(grid))) @ np.linalg.cholesky(kernel).T


def fronts(rng: np.random.Generator, n: int, side: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """Bimodal fine fields: cond (n, 7), x (n, side * side)."""
    cond, neighbours = _hex_conditions(rng, n)
    gradient = (cond[:, 1:] - cond[:, :1]) @ neighbours / 3  # least squares over the six directions
    strength = np.linalg.norm(gradient, axis=1, keepdims=True)
    normal = gradient / np.maximum(strength, 1e-6)
    ticks = (np.arange(side) + 0.5) / side - 0.5
    grid = np.stack(np.meshgrid(ticks, ticks, indexing="ij"), axis=-1).reshape(-1, 2)
    along = grid @ normal.T  # (D, n): position across the front
    offset = rng.uniform(-0.2, 0.2, (1, n))
    high_side = np.where(rng.random(n) < 1 / (1 + np.exp(-2 * strength[:, 0])), 1.0, -1.0)
    step = np.tanh((along - offset) / 0.03).T * high_side[:, None]  # (n, D), +-1 either side
    field = (1.0 + strength) * step + 0.15 * _smooth_noise(rng, n, side, 0.2)
    field += cond[:, :1] - field.mean(axis=1, keepdims=True)  # conserve the coarse value
    return cond, field.astype(np.float32)


def rain(rng: np.random.Generator, n: int, side: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """Heavy-tailed, intermittent fine fields: cond (n, 5), x (n, side * side), x >= 0."""
    mixing = np.array([[1.0, 0.0, 0.0, 0.0, 0.0], [0.5, 0.9, 0.0, 0.0, 0.0], [0.0, 0.3, 1.0, 0.0, 0.0],
                       [0.2, 0.0, 0.4, 0.9, 0.0], [0.0, 0.0, 0.0, 0.5, 0.9]])
    cond = (rng.standard_normal((n, 5)) @ mixing.T).astype(np.float32)
    wet_share = 1 / (1 + np.exp(-(1.2 * cond[:, 0] + 0.8 * cond[:, 1] - 0.5)))
    wet = _smooth_noise(rng, n, side, 0.25) < norm.ppf(wet_share)[:, None]  # unit-variance noise: wet_share wet
    storm = 0.5 * rng.standard_normal((n, 1))  # what the predictors do not tell
    log_intensity = 0.6 * cond[:, 2:3] + 0.4 * cond[:, 3:4] + storm + 0.8 * _smooth_noise(rng, n, side, 0.15)
    return cond, np.where(wet, np.exp(log_intensity), 0.0).astype(np.float32)


GENERATORS = {"fronts": fronts, "rain": rain}
