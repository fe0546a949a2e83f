"""Plots of generated fields (PNG, matplotlib's Agg canvas: no display or pyplot state needed).

A field of D values is drawn as a square image when D is a square number and there is one
field (a fine grid), else as a line over its D values (field 0 of several).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from diffscale.evaluation import probabilistic as P
from diffscale.io.atomic import atomic_path

if TYPE_CHECKING:
    from diffscale.tasks.fields.scores import Forecasts

MEMBERS_SHOWN = 3
"""Members drawn per preview condition (the mean and spread use every member)."""


def _as_grid(values: torch.Tensor) -> np.ndarray | None:
    """(D,) -> (s, s) when D is a square number, else None."""
    side = math.isqrt(values.numel())
    return values.reshape(side, side).numpy() if values.dim() == 1 and side * side == values.numel() else None


def _draw(ax: Axes, values: torch.Tensor, title: str, limits: tuple[float, float], cmap: str = "viridis") -> None:
    values = values if values.dim() == 1 else values[:, 0]
    grid = _as_grid(values)
    if grid is None:
        ax.plot(values.numpy(), lw=0.8)
        ax.set_ylim(*limits)
    else:
        ax.imshow(grid, vmin=limits[0], vmax=limits[1], cmap=cmap)
        ax.set_xticks([])
        ax.set_yticks([])
    ax.set_title(title, fontsize=8)


def _save(fig: Figure, path: Path) -> Path:
    """Write atomically: a reader (a dashboard, ``latest.png``) never sees half a file."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    return path


def plot_preview(samples: torch.Tensor, truth: torch.Tensor, path: Path) -> Path:
    """samples (S, *F): sample i belongs to condition i mod G; truth (G, *F) the true field of each
    of the G conditions. One row per condition: truth, a few members, ensemble mean and std."""
    groups = truth.shape[0]
    columns = 1 + MEMBERS_SHOWN + 2
    fig = Figure(figsize=(1.8 * columns, 1.9 * groups), layout="constrained")
    axes = fig.subplots(groups, columns, squeeze=False)
    for g in range(groups):
        members = samples[g::groups].float()
        limits = (float(truth[g].min().minimum(members.min())), float(truth[g].max().maximum(members.max())))
        _draw(axes[g, 0], truth[g], "data" if g == 0 else "", limits)
        for j in range(MEMBERS_SHOWN):
            if j < len(members):
                _draw(axes[g, 1 + j], members[j], f"member {j + 1}" if g == 0 else "", limits)
            else:
                axes[g, 1 + j].axis("off")
        _draw(axes[g, -2], members.mean(0), f"mean of {len(members)}" if g == 0 else "", limits)
        spread = members.std(0) if len(members) > 1 else torch.zeros_like(members[0])
        _draw(axes[g, -1], spread, "std" if g == 0 else "", (0.0, float(spread.max()) or 1.0), cmap="magma")
    return _save(fig, path)


def plot_evaluation(f: Forecasts, scores: dict[str, float], path: Path) -> Path:
    """CRPS of each forecast, rank histogram, binned spread against error, and one case."""
    fig = Figure(figsize=(12, 7), layout="constrained")
    grid = fig.subplots(2, 3)
    _crps_bars(grid[0, 0], scores)
    _rank_bars(grid[0, 1], P.rank_histogram(f.ensemble, f.truth))
    _spread_error(grid[0, 2], f.ensemble, f.truth)
    case = f.truth[0]
    limits = (float(case.min()), float(case.max()))
    _draw(grid[1, 0], case, "case 1: data", limits)
    _draw(grid[1, 1], f.ensemble[0, 0], "case 1: diffusion member", limits)
    _draw(grid[1, 2], f.deterministic[0], "case 1: deterministic MLP", limits)
    return _save(fig, path)


def _crps_bars(ax: Axes, scores: dict[str, float]) -> None:
    names = [("climatology", "crps_climatology"), ("MLP", "crps_mlp"), ("diffusion", "crps"), ("ideal", "crps_ideal")]
    shown = [(label, scores[key]) for label, key in names if key in scores]
    ax.bar([label for label, _ in shown], [value for _, value in shown], color=["0.6", "C1", "C0", "C2"][:len(shown)])
    ax.set_title(f"CRPS (lower is better); spread/skill {scores['spread_skill']:.2f}", fontsize=9)


def _rank_bars(ax: Axes, counts: torch.Tensor) -> None:
    freq = (counts.double() / counts.sum() * len(counts)).numpy()
    ax.bar(np.arange(len(counts)), freq, width=1.0, color="C0")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_title("rank histogram (flat = calibrated)", fontsize=9)
    ax.set_xlabel("rank of the data among the members")


def _spread_error(ax: Axes, ensemble: torch.Tensor, truth: torch.Tensor, bins: int = 10) -> None:
    """RMSE of the ensemble mean against RMS spread, values binned by their spread (deciles)."""
    spread = ensemble.std(1).flatten()
    error = (ensemble.mean(1) - truth).flatten()
    order = spread.argsort()
    chunks = [order[i * len(order) // bins:(i + 1) * len(order) // bins] for i in range(bins)]
    members = ensemble.shape[1]
    xs = [float(spread[c].pow(2).mean().sqrt()) for c in chunks]
    ys = [float(error[c].pow(2).mean().sqrt() / math.sqrt((members + 1) / members)) for c in chunks]
    ax.plot(xs, ys, "o-", color="C0")
    top = max(xs + ys)
    ax.plot([0, top], [0, top], "k--", lw=0.8)
    ax.set_xlabel("RMS spread")
    ax.set_ylabel("RMSE of the mean x sqrt(M / (M + 1))")
    ax.set_title("spread against error (on the diagonal = calibrated)", fontsize=9)
