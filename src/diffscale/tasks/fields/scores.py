"""The scores of a field model's forecasts: its ensembles against climatology, a deterministic
MLP and (where known) the ideal forecast, in the data's own units (see evaluation/probabilistic.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from diffscale.evaluation import probabilistic as P


@dataclass
class Forecasts:
    """Everything scored, in data units on the CPU: N cases, M members, F = x_shape."""

    cond: torch.Tensor
    """(N, C) conditions."""
    truth: torch.Tensor
    """(N, *F) observed fields."""
    ensemble: torch.Tensor
    """(N, M, *F) the diffusion model's members."""
    climatology: torch.Tensor
    """(N, M, *F) training fields drawn at random, whatever the condition."""
    deterministic: torch.Tensor
    """(N, *F) the MLP baseline's prediction."""
    ideal: tuple[torch.Tensor, torch.Tensor] | None
    """Mean and std (N, *F) of the ideal Gaussian forecast, where known."""


def score(f: Forecasts, coarse_index: int) -> dict[str, float]:
    """The scores of ``f``; the conservation error where the condition holds the coarse value."""
    point = f.deterministic.unsqueeze(1)
    out = {
        "crps": float(P.crps_ensemble(f.ensemble, f.truth).mean()),
        "crps_climatology": float(P.crps_ensemble(f.climatology, f.truth).mean()),
        "crps_mlp": float(P.crps_ensemble(point, f.truth).mean()),
        "spread_skill": P.spread_skill_ratio(f.ensemble, f.truth),
        "rank_histogram_deviation": P.rank_histogram_deviation(P.rank_histogram(f.ensemble, f.truth)),
        "rmse_ensemble_mean": float((f.ensemble.mean(1) - f.truth).pow(2).mean().sqrt()),
        "rmse_mlp": float((f.deterministic - f.truth).pow(2).mean().sqrt()),
        "p99_error": P.quantile_error(f.ensemble.flatten(0, 1), f.truth, 0.99),
        "p99_error_mlp": P.quantile_error(f.deterministic, f.truth, 0.99),
        "p99_error_climatology": P.quantile_error(f.climatology.flatten(0, 1), f.truth, 0.99),
        "roughness_ratio": P.roughness_ratio(f.ensemble.flatten(0, 1), f.truth),
        "roughness_ratio_mlp": P.roughness_ratio(f.deterministic, f.truth),
    }
    out["crps_skill_vs_climatology"] = 1 - out["crps"] / out["crps_climatology"]
    out["crps_skill_vs_mlp"] = 1 - out["crps"] / out["crps_mlp"]
    if f.ideal is not None:
        out["crps_ideal"] = float(P.crps_gaussian(f.ideal[0], f.ideal[1], f.truth).mean())
    if coarse_index >= 0:
        coarse = f.cond[:, coarse_index]
        several = f.truth.dim() == 3  # (N, D, K): the coarse value belongs to field 0

        def field0(x: torch.Tensor) -> torch.Tensor:
            return x[..., 0] if several else x

        out["conservation_error"] = P.conservation_error(field0(f.ensemble), coarse[:, None])
        out["conservation_error_mlp"] = P.conservation_error(field0(f.deterministic), coarse)
        out["conservation_error_data"] = P.conservation_error(field0(f.truth), coarse)
    return out
