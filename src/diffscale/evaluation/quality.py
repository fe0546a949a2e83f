"""Sample-quality metrics on feature vectors, whatever network made them: the Frechet distance
between Gaussian fits (FID's formula), k-NN manifold precision, recall, density and coverage
(Kynkaanniemi et al. 2019, Naeem et al. 2020) and classifier accuracy. Features are (N, D) tensors;
all arithmetic is in float64 on the CPU.
"""

from __future__ import annotations

import numpy as np
import torch


def gaussian_fit(features: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Mean (D,) and unbiased covariance (D, D) of ``features`` (N, D), N >= 2."""
    x = features.detach().double().cpu().numpy()
    if x.ndim != 2 or x.shape[0] < 2:
        raise ValueError(f"need (N, D) features with N >= 2, got shape {tuple(x.shape)}")
    return x.mean(axis=0), np.cov(x, rowvar=False).reshape(x.shape[1], x.shape[1])


def frechet_distance(a: torch.Tensor, b: torch.Tensor) -> float:
    """||mu_a - mu_b||^2 + tr(S_a + S_b - 2 (S_a S_b)^(1/2)) between Gaussian fits of ``a`` (N, D)
    and ``b`` (M, D). S_a S_b is similar to the symmetric S_a^(1/2) S_b S_a^(1/2), so the trace of its
    square root is the sum of the square roots of that matrix's eigenvalues: exact for singular
    covariances too, with no complex round-off to drop (as a general ``sqrtm`` leaves)."""
    mu_a, cov_a = gaussian_fit(a)
    mu_b, cov_b = gaussian_fit(b)
    root_a = _symmetric_sqrt(cov_a)
    inner = np.linalg.eigvalsh(root_a @ cov_b @ root_a)
    trace_root = float(np.sqrt(np.clip(inner, 0.0, None)).sum())
    diff = mu_a - mu_b
    distance = float(diff @ diff + np.trace(cov_a) + np.trace(cov_b) - 2.0 * trace_root)
    return max(distance, 0.0)  # round-off can take identical sets a hair below zero


def _symmetric_sqrt(matrix: np.ndarray) -> np.ndarray:
    """The positive semi-definite square root of a symmetric PSD ``matrix`` (D, D)."""
    values, vectors = np.linalg.eigh(matrix)
    return (vectors * np.sqrt(np.clip(values, 0.0, None))) @ vectors.T


def _radii(distances: torch.Tensor, k: int) -> torch.Tensor:
    """Each row's distance to its k-th nearest other row, of a set's (N, N) distances: (N,)."""
    # k + 1: the nearest row is the row itself, at distance zero
    return distances.kthvalue(min(k + 1, distances.shape[0]), dim=1).values


def manifold_scores(real: torch.Tensor, fake: torch.Tensor, *, k: int = 3) -> dict[str, float]:
    """k-NN manifold scores of ``fake`` (M, D) against ``real`` (N, D), each real (fake) row's
    ball reaching its k-th nearest real (fake) neighbour:

    - ``precision``: the share of fake rows inside a real ball (Kynkaanniemi et al. 2019);
    - ``recall``: the share of real rows inside a fake ball;
    - ``density``: real balls holding each fake row, over k, averaged (Naeem et al. 2020): 1 for
      samples spread like the data, above 1 where they crowd into its dense regions;
    - ``coverage``: the share of real rows whose ball holds a fake row (Naeem et al. 2020), which
      an outlier among the samples cannot raise.

    The same formulas as the paper's own code (the ``prdc`` package), in float64 torch: that
    package prints to stdout and computes in eight threads (docs/decisions.md, "Precision, recall,
    density and coverage written here, checked against prdc")."""
    real = real.detach().double().cpu()
    fake = fake.detach().double().cpu()
    real_radii = _radii(torch.cdist(real, real), k)
    fake_radii = _radii(torch.cdist(fake, fake), k)
    between = torch.cdist(real, fake)  # (N, M)
    in_real_ball = between < real_radii.unsqueeze(1)
    return {"precision": float(in_real_ball.any(dim=0).double().mean()),
            "recall": float((between < fake_radii.unsqueeze(0)).any(dim=1).double().mean()),
            "density": float(in_real_ball.sum(dim=0).double().mean() / k),
            "coverage": float((between.min(dim=1).values < real_radii).double().mean())}


def accuracy(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """Share of rows whose highest logit (``logits`` (N, K)) is the label (``labels`` (N,))."""
    if logits.shape[0] == 0:
        return float("nan")
    return float((logits.argmax(dim=1).cpu() == labels.cpu()).double().mean())
