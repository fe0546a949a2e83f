"""Demonstration episodes for policies: loading, checks, training windows and normalisation.

Specs (``data.source``):

* ``builtin`` or ``builtin:reach2d``: scripted two-mode demonstrations of the built-in environment (envs/reach2d.py);
  ``builtin:reach2d-routes``: its three-route variant, demonstrated 50 / 30 / 20 %.
* ``npz:PATH``: a ``.npz`` file with ``obs`` (N, O), ``action`` (N, A) and optionally
  ``episode_ends`` (E,) (without it, one episode), or a folder of such files.
* ``zarr:PATH[:KEYS]``: the replay-buffer layout of the diffusion-policy code: ``data/<key>``
  arrays and ``meta/episode_ends``. Observations are ``data/obs`` (else ``data/state``), or
  the ``+``-joined keys given, concatenated per step (``zarr:pusht.zarr:keypoint+state``).
* ``lerobot:PATH[:COLUMNS]``: a LeRobot data set stored as Parquet on disk (``data/**/*.parquet``
  under PATH, or one file): ``observation.state`` (or the ``+``-joined columns given),
  ``action`` and ``episode_index``, ordered by ``frame_index``. Video frames are not read.

Every problem a user's data can have ends in one ``UserError`` naming the file and the fix,
before anything is trained or written.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from diffscale.data.locations import path_option_split
from diffscale.errors import UserError, closest
from diffscale.tasks.policy import episode_formats as formats
from diffscale.tasks.policy.episode_formats import RawEpisode

KINDS = ("builtin", "npz", "zarr", "lerobot")
BUILTIN = ("reach2d", "reach2d-routes")
BUILTIN_EPISODES = 200
"""Scripted demonstrations in ``builtin:reach2d`` (about 7,000 steps)."""
SPECS = "builtin[:reach2d|reach2d-routes], npz:PATH, zarr:PATH[:KEYS] or lerobot:PATH[:COLUMNS]"


@dataclass(frozen=True)
class Episodes:
    """Episodes concatenated along time: ``obs`` (N, O) and ``action`` (N, A) float32, episode
    ``e`` spanning rows ``ends[e-1]:ends[e]`` (``ends`` (E,) int64, exclusive)."""

    obs: np.ndarray
    action: np.ndarray
    ends: np.ndarray
    source: str

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.ends, prepend=0)

    def describe(self) -> str:
        lengths = self.lengths
        return (f"{self.source} ({len(self.ends)} episodes of {lengths.min()}-{lengths.max()} steps, "
                f"obs {self.obs.shape[1]}, action {self.action.shape[1]})")


def split_spec(spec: str) -> tuple[str, str, str]:
    """``kind:PATH[:OPTION]`` -> (kind, path, option). The option is the part after the last
    ``:`` when the whole rest is not an existing path (paths may hold ``:``)."""
    kind, _, rest = spec.partition(":")
    kind = kind.strip().lower()
    if kind not in KINDS:
        raise UserError(f"unknown episode source '{spec}'{closest(kind, KINDS)}", f"use {SPECS}")
    if kind == "builtin" and not rest.strip():
        return kind, "reach2d", ""  # plain ``builtin`` is each task's own built-in data
    if not rest:
        raise UserError(f"data source '{spec}' has no path", f"write {kind}:PATH")
    if kind == "builtin":
        return kind, rest, ""
    return (kind, *path_option_split(rest))


def load_episodes(spec: str, *, min_length: int, max_episodes: int = 0) -> Episodes:
    """Read and check the episodes ``spec`` names; at most ``max_episodes`` (0: all). Each must
    have at least ``min_length`` steps (the prediction horizon)."""
    kind, path, option = split_spec(spec)
    if kind == "builtin":
        if path not in BUILTIN:
            raise UserError(f"unknown built-in episodes '{path}'{closest(path, BUILTIN)}",
                            "for task policy use builtin:reach2d, builtin:reach2d-routes, npz:PATH, zarr:PATH or "
                            "lerobot:PATH (data.source, or --data)")
        raw = formats.read_reach2d(BUILTIN_EPISODES, path)
    else:
        where = Path(path).expanduser()
        if not where.exists():
            raise UserError(f"episode data '{where}' does not exist", f"check the path given to --data {kind}:PATH")
        reader = {"npz": formats.read_npz, "zarr": formats.read_zarr, "lerobot": formats.read_lerobot}[kind]
        raw = reader(where, option)
    if max_episodes:
        raw = raw[:max_episodes]
    return assemble(raw, spec, min_length=min_length)


def _as_steps(array: np.ndarray, where: str, name: str) -> np.ndarray:
    """(T,) or (T, ...) -> (T, D) float32: per-step values flattened (keypoints (T, 9, 2) -> (T, 18))."""
    array = np.asarray(array)
    if array.dtype.kind not in "biuf":
        raise UserError(f"{where}: '{name}' holds {array.dtype} values, not numbers",
                        f"store '{name}' as a numeric array of shape (steps, values)")
    if array.ndim == 0:
        raise UserError(f"{where}: '{name}' is a single number", f"store '{name}' with one row per step")
    return array.reshape(len(array), -1).astype(np.float32)


def assemble(raw: list[RawEpisode], source: str, *, min_length: int) -> Episodes:
    """Check the episodes and concatenate them: no episodes, mismatched lengths or dimensions,
    NaN/inf and too-short episodes each end in a ``UserError`` naming the episode's file."""
    if not raw:
        raise UserError(f"'{source}' holds no episodes",
                        "point data.source at demonstrations with at least one episode")
    obs: list[np.ndarray] = []
    action: list[np.ndarray] = []
    for episode in raw:
        o, a = _as_steps(episode.obs, episode.where, "obs"), _as_steps(episode.action, episode.where, "action")
        if len(o) != len(a):
            raise UserError(f"{episode.where}: {len(o)} observations but {len(a)} actions",
                            "store one observation and one action per step")
        for name, values, first in (("obs", o, obs), ("action", a, action)):
            if first and values.shape[1] != first[0].shape[1]:
                raise UserError(f"{episode.where}: '{name}' has {values.shape[1]} values per step but {raw[0].where} "
                                f"has {first[0].shape[1]}", f"give every episode the same {name} dimensions")
            if not np.isfinite(values).all():
                step = int(np.argwhere(~np.isfinite(values))[0, 0])
                raise UserError(f"{episode.where}: '{name}' holds NaN or infinite values (first at step {step})",
                                "fix or drop that episode")
        if len(o) < min_length:
            raise UserError(f"{episode.where}: {len(o)} steps, fewer than the prediction horizon "
                            f"model.pred_horizon={min_length}",
                            "drop episodes that short, or lower model.pred_horizon (and action_horizon)")
        obs.append(o)
        action.append(a)
    ends = np.cumsum([len(o) for o in obs]).astype(np.int64)
    return Episodes(np.concatenate(obs), np.concatenate(action), ends, source)


def window_positions(ends: np.ndarray, horizon: int, *, pad_before: int, pad_after: int) -> np.ndarray:
    """Row indices (W, horizon) of every training window, as diffusion policy's SequenceSampler
    cuts them: windows start from ``pad_before`` steps before each episode to ``pad_after``
    steps past its last full window, and positions outside the episode repeat its first or
    last step (so the first observations and the last actions are trained on too)."""
    windows = []
    start = 0
    for end in ends.tolist():
        offsets = np.arange(-pad_before, end - start - horizon + pad_after + 1)
        rows = start + offsets[:, None] + np.arange(horizon)[None, :]
        windows.append(np.clip(rows, start, end - 1))
        start = end
    return np.concatenate(windows).astype(np.int64)


@dataclass
class MinMax:
    """Per-dimension min/max normalisation to [-1, 1]: ``lo`` and ``hi`` (D,). A dimension that
    never changes maps to 0 (dividing by its zero range would blow it up)."""

    lo: torch.Tensor
    hi: torch.Tensor

    @classmethod
    def fit(cls, values: torch.Tensor) -> MinMax:
        """Statistics of ``values`` (N, D)."""
        return cls(values.amin(dim=0), values.amax(dim=0))

    def _centre_scale(self) -> tuple[torch.Tensor, torch.Tensor]:
        half = (self.hi - self.lo) / 2
        return (self.hi + self.lo) / 2, torch.where(half > 1e-4, half, torch.ones_like(half))

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """(..., D) in the data's units -> (..., D), [-1, 1] over the data."""
        centre, scale = self._centre_scale()
        return (x - centre.to(x.device)) / scale.to(x.device)

    def unnormalize(self, x: torch.Tensor) -> torch.Tensor:
        """Inverse of ``normalize``."""
        centre, scale = self._centre_scale()
        return x * scale.to(x.device) + centre.to(x.device)
