"""Per-feature standardisation of a field run's conditions and fields: fitted once from the data,
kept as task state, applied to every training batch and undone on every generated sample."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Standardiser:
    """Per-feature statistics: cond (C,) and x (D,) or (D, K) means and standard deviations."""

    cond_mean: torch.Tensor
    cond_std: torch.Tensor
    x_mean: torch.Tensor
    x_std: torch.Tensor

    @classmethod
    def fit(cls, cond: torch.Tensor, x: torch.Tensor) -> Standardiser:
        # A constant feature would divide by zero: its standardised value is then simply 0.
        return cls(cond.mean(0), cond.std(0).clamp_min(1e-6), x.mean(0), x.std(0).clamp_min(1e-6))

    def cond(self, cond: torch.Tensor) -> torch.Tensor:
        return (cond - self.cond_mean) / self.cond_std

    def x(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.x_mean) / self.x_std

    def x_back(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.x_std.to(x.device) + self.x_mean.to(x.device)


class StandardiseCollate:
    """Stack (cond, x) pairs and standardise them on the CPU, as a hand-written loader does."""

    def __init__(self, stats: Standardiser) -> None:
        self.stats = Standardiser(*(t.cpu() for t in (stats.cond_mean, stats.cond_std, stats.x_mean, stats.x_std)))

    def __call__(self, items: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, torch.Tensor]:
        cond = torch.stack([item[0] for item in items])
        x = torch.stack([item[1] for item in items])
        return {"cond": self.stats.cond(cond), "x": self.stats.x(x)}
