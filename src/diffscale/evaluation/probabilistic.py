"""Scores of probabilistic forecasts: ensembles of M members against one observed truth.

Shapes: an ensemble is (N, M, *F) (N cases, M members, F the values of one sample: D or D x K),
the truth (N, *F). Scores are per value and averaged over every case and value unless said
otherwise. References: Gneiting & Raftery (2007) for the CRPS, Ferro (2014) for its fair
ensemble estimator, Fortin et al. (2014) for the spread-skill ratio of finite ensembles.
"""

from __future__ import annotations

import math

import torch


def crps_ensemble(ensemble: torch.Tensor, truth: torch.Tensor, *, fair: bool = True) -> torch.Tensor:
    """Continuous ranked probability score of each value, (N, *F).

    CRPS = E|X - y| - 1/2 E|X - X'|. ``fair`` estimates the second term without the M zero
    self-pairs (divides by M (M - 1), not M^2): its mean is then the CRPS of the distribution
    the members are drawn from, whatever M, so ensembles of different sizes compare fairly.
    A one-member ensemble scores its absolute error.
    """
    members = ensemble.shape[1]
    skill = (ensemble - truth.unsqueeze(1)).abs().mean(1)
    if members == 1:
        return skill
    # sum_{i,j} |x_i - x_j| = 2 sum_i (2 i - M - 1) x_(i) over the sorted members (i = 1..M): O(M log M).
    ranked = ensemble.sort(dim=1).values
    shape = (1, members) + (1,) * (ensemble.dim() - 2)
    weights = (2 * torch.arange(1, members + 1, dtype=ensemble.dtype, device=ensemble.device) - members - 1).view(shape)
    pair_sum = 2 * (weights * ranked).sum(1)
    pairs = members * (members - 1) if fair else members * members
    return skill - pair_sum / (2 * pairs)


def crps_gaussian(mean: torch.Tensor, std: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """Closed-form CRPS of N(mean, std^2) at ``truth`` (all the same shape; std > 0)."""
    z = (truth - mean) / std
    normal = torch.distributions.Normal(torch.zeros_like(z), torch.ones_like(z))
    return std * (z * (2 * normal.cdf(z) - 1) + 2 * normal.log_prob(z).exp() - 1 / math.sqrt(math.pi))


def spread_skill_ratio(ensemble: torch.Tensor, truth: torch.Tensor) -> float:
    """sqrt((M + 1) / M) x RMS spread / RMSE of the ensemble mean: 1 for a calibrated ensemble.

    The spread is the unbiased member variance averaged over every value; the factor corrects
    for a finite ensemble's mean being itself uncertain (Fortin et al. 2014). Needs M >= 2.
    """
    members = ensemble.shape[1]
    if members < 2:
        raise ValueError("the spread-skill ratio needs at least 2 members")
    spread = ensemble.var(dim=1, unbiased=True).mean().sqrt()
    rmse = (ensemble.mean(1) - truth).pow(2).mean().sqrt()
    return float(math.sqrt((members + 1) / members) * spread / rmse)


def rank_histogram(ensemble: torch.Tensor, truth: torch.Tensor, *,
                   generator: torch.Generator | None = None) -> torch.Tensor:
    """Counts (M + 1,) of the truth's rank among the members over every case and value.

    Flat for a calibrated ensemble; U-shaped when under-dispersed, domed when over-dispersed.
    Ties (members equal to the truth) are broken at random so discrete data stays flat.
    """
    members = ensemble.shape[1]
    below = (ensemble < truth.unsqueeze(1)).sum(1)
    ties = (ensemble == truth.unsqueeze(1)).sum(1)
    if bool(ties.any()):
        uniform = torch.rand(ties.shape, generator=generator).to(ensemble.device)
        below = below + (uniform * (ties + 1)).floor().long()
    return torch.bincount(below.flatten(), minlength=members + 1)


def rank_histogram_deviation(counts: torch.Tensor) -> float:
    """RMS of the relative deviation of rank frequencies from flat: 0 for a perfectly flat histogram."""
    freq = counts.double() / counts.sum()
    return float(((freq * len(counts) - 1).pow(2).mean()).sqrt())


def quantile_error(samples: torch.Tensor, truth: torch.Tensor, q: float = 0.99) -> float:
    """Mean over values of |q-quantile of the generated values - q-quantile of the true values|.

    ``samples`` (S, *F) and ``truth`` (N, *F) are pooled over their first dimension per value,
    so it measures whether the tails (extremes) of each value's distribution are reproduced.
    """
    generated = torch.quantile(samples.flatten(1).double(), q, dim=0)
    observed = torch.quantile(truth.flatten(1).double(), q, dim=0)
    return float((generated - observed).abs().mean())


def conservation_error(fields: torch.Tensor, coarse: torch.Tensor) -> float:
    """Mean |average of a field's D values - its coarse value|. fields (..., D); coarse broadcast
    against (...), e.g. an ensemble (N, M, D) with coarse values (N, 1): every member counts."""
    return float((fields.mean(-1) - coarse).abs().mean())


def roughness_ratio(samples: torch.Tensor, truth: torch.Tensor) -> float:
    """RMS difference of neighbouring values (along D, the second dimension) in ``samples`` over
    that in ``truth``: 1 where generated fields are as smooth as the data, above 1 where they
    carry extra small-scale noise. Marginal scores (CRPS, spread) cannot see this: a field of
    independent values with the right spread scores as well as a correctly correlated one.
    samples (S, D, ...), truth (N, D, ...), D ordered in space (e.g. a grid flattened row by row)."""
    def increments(x: torch.Tensor) -> torch.Tensor:
        return (x[:, 1:] - x[:, :-1]).pow(2).mean().sqrt()

    return float(increments(samples) / increments(truth))
