"""Sample-quality metrics on feature vectors, whatever network made them: the Frechet distance
between Gaussian fits (FID's formula), k-NN manifold precision and recall (Kynkaanniemi et al.
2019) and classifier accuracy. Features are (N, D) tensors; all arithmetic is in float64 on the CPU.
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


def _radii(features: torch.Tensor, k: int) -> torch.Tensor:
    """Distance of each row of ``features`` (N, D) to its k-th nearest other row: (N,)."""
    distances = torch.cdist(features, features)
    # k + 1: the nearest row is the row itself, at distance zero
    return distances.kthvalue(min(k + 1, features.shape[0]), dim=1).values


def _covered(points: torch.Tensor, centres: torch.Tensor, radii: torch.Tensor) -> torch.Tensor:
    """Fraction of ``points`` (N, D) inside at least one ball (``centres`` (M, D), ``radii`` (M,))."""
    inside = torch.cdist(points, centres) <= radii.unsqueeze(0)
    return inside.any(dim=1).double().mean()


def precision_recall(real: torch.Tensor, fake: torch.Tensor, *, k: int = 3) -> tuple[float, float]:
    """k-NN manifold precision (the share of ``fake`` (M, D) inside the real manifold: balls around
    each real row reaching its k-th nearest real neighbour) and recall (the share of ``real``
    (N, D) inside the fake manifold)."""
    real = real.detach().double().cpu()
    fake = fake.detach().double().cpu()
    precision = _covered(fake, real, _radii(real, k))
    recall = _covered(real, fake, _radii(fake, k))
    return float(precision), float(recall)


def accuracy(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """Share of rows whose highest logit (``logits`` (N, K)) is the label (``labels`` (N,))."""
    if logits.shape[0] == 0:
        return float("nan")
    return float((logits.argmax(dim=1).cpu() == labels.cpu()).double().mean())
