"""Probabilistic scores against values known in closed form or by brute force."""

import math

import pytest
import torch

from diffscale.evaluation import probabilistic as P


def _brute_crps(ensemble: torch.Tensor, truth: torch.Tensor, fair: bool) -> torch.Tensor:
    m = ensemble.shape[1]
    skill = (ensemble - truth[:, None]).abs().mean(1)
    pairs = (ensemble[:, :, None] - ensemble[:, None, :]).abs().sum((1, 2))
    return skill - pairs / (2 * (m * (m - 1) if fair else m * m))


def test_crps_of_small_ensembles_by_hand():
    truth = torch.tensor([[0.0]])
    assert P.crps_ensemble(torch.tensor([[[3.0]]]), truth).item() == 3.0  # one member: the absolute error
    two = torch.tensor([[[1.0], [3.0]]])  # mean |x - y| = 2, |x1 - x2| = 2
    assert P.crps_ensemble(two, truth, fair=True).item() == pytest.approx(2 - 2 / 2)
    assert P.crps_ensemble(two, truth, fair=False).item() == pytest.approx(2 - 2 / 4)


def test_crps_matches_the_pairwise_definition():
    gen = torch.Generator().manual_seed(0)
    ensemble, truth = torch.randn((5, 9, 3, 2), generator=gen), torch.randn((5, 3, 2), generator=gen)
    for fair in (True, False):
        measured = P.crps_ensemble(ensemble, truth, fair=fair)
        assert torch.allclose(measured, _brute_crps(ensemble, truth, fair), atol=1e-6)


def test_gaussian_crps_closed_form_against_numerical_integration():
    mean, std, truth = (torch.tensor(v, dtype=torch.float64) for v in (0.3, 1.7, -1.1))
    normal = torch.distributions.Normal(mean, std)
    below = torch.linspace(-20, -1.1, 200_001, dtype=torch.float64)
    above = torch.linspace(-1.1, 20, 200_001, dtype=torch.float64)
    # CRPS = integral of (F(x) - 1{x >= y})^2, split at y where the step is
    integral = torch.trapezoid(normal.cdf(below) ** 2, below) + torch.trapezoid((1 - normal.cdf(above)) ** 2, above)
    assert P.crps_gaussian(mean, std, truth).item() == pytest.approx(integral.item(), rel=1e-6)
    at_mean = std.item() * (math.sqrt(2) - 1) / math.sqrt(math.pi)
    assert P.crps_gaussian(mean, std, mean).item() == pytest.approx(at_mean)


def test_fair_crps_of_a_gaussian_ensemble_estimates_the_closed_form():
    gen = torch.Generator().manual_seed(1)
    truth = torch.linspace(-2.5, 2.5, 41).repeat(200)  # fixed observations, many cases each
    members = 1.5 * torch.randn((len(truth), 8), generator=gen)  # N(0, 1.5^2), only 8 members
    measured = P.crps_ensemble(members, truth).mean().item()
    expected = P.crps_gaussian(torch.zeros_like(truth), torch.full_like(truth, 1.5), truth).mean().item()
    assert measured == pytest.approx(expected, rel=0.02)
    biased = P.crps_ensemble(members, truth, fair=False).mean().item()
    assert biased > expected * 1.03  # the plain estimator penalises a small ensemble


def test_spread_skill_ratio_of_calibrated_and_under_dispersed_ensembles():
    gen = torch.Generator().manual_seed(2)
    centre = 3 * torch.randn((4000, 1), generator=gen)
    truth = centre + torch.randn((4000, 1), generator=gen)
    calibrated = centre[:, None] + torch.randn((4000, 8, 1), generator=gen)
    narrow = centre[:, None] + 0.5 * torch.randn((4000, 8, 1), generator=gen)
    assert P.spread_skill_ratio(calibrated, truth) == pytest.approx(1.0, abs=0.04)
    # spread 0.5 against an ensemble-mean error of sqrt(1 + 0.25 / 8): sqrt(9/8) * 0.5 / 1.0155 = 0.522
    assert P.spread_skill_ratio(narrow, truth) == pytest.approx(0.522, abs=0.03)
    with pytest.raises(ValueError, match="at least 2 members"):
        P.spread_skill_ratio(calibrated[:, :1], truth)


def test_rank_histogram_is_flat_for_calibrated_members_and_u_shaped_when_too_narrow():
    gen = torch.Generator().manual_seed(3)
    truth = torch.randn((3000, 4), generator=gen)
    calibrated = torch.randn((3000, 9, 4), generator=gen)
    counts = P.rank_histogram(calibrated, truth)
    assert counts.shape == (10,) and counts.sum() == 3000 * 4
    assert P.rank_histogram_deviation(counts) < 0.1
    narrow = P.rank_histogram(0.3 * calibrated, truth)
    assert narrow[0] > 2 * narrow[5] and narrow[-1] > 2 * narrow[5]
    assert P.rank_histogram_deviation(narrow) > 1.0


def test_rank_histogram_breaks_ties_at_random():
    truth = torch.zeros((4000, 1))
    counts = P.rank_histogram(torch.zeros((4000, 3, 1)), truth, generator=torch.Generator().manual_seed(0))
    assert P.rank_histogram_deviation(counts) < 0.1  # all members tie with the truth: every rank equally likely


def test_quantile_and_conservation_errors():
    gen = torch.Generator().manual_seed(4)
    truth = torch.randn((20000, 3), generator=gen)
    assert P.quantile_error(torch.randn((20000, 3), generator=gen), truth) < 0.1
    assert P.quantile_error(truth + 1.0, truth) == pytest.approx(1.0)
    fields = torch.tensor([[1.0, 3.0], [0.0, 0.0]])  # means 2 and 0
    assert P.conservation_error(fields, torch.tensor([2.5, 1.0])) == pytest.approx((0.5 + 1.0) / 2)


def test_roughness_ratio_sees_noise_that_marginal_scores_miss():
    gen = torch.Generator().manual_seed(5)
    smooth = torch.cumsum(torch.randn((500, 64), generator=gen), dim=1) / 8  # random walks: correlated neighbours
    assert P.roughness_ratio(smooth.flip(0), smooth) == pytest.approx(1.0)
    shuffled = smooth[:, torch.randperm(64, generator=gen)]  # the same values, neighbours unrelated
    assert P.roughness_ratio(shuffled, smooth) > 3
