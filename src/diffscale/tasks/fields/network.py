"""The field denoiser: a residual MLP over a flattened field, conditioned on the diffusion
timestep and a condition vector through FiLM (scale and shift of each block's hidden layer).

Single-device code: DDP, compile and precision are applied from outside.
"""

from __future__ import annotations

import torch
from diffusers.models.embeddings import TimestepEmbedding, Timesteps
from torch import nn

from diffscale.config import FieldModelConfig


class ResidualBlock(nn.Module):
    """h + W2 dropout(silu(FiLM(W1 norm(h), emb))): (B, hidden) -> (B, hidden)."""

    def __init__(self, hidden: int, embed_dim: int, dropout: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.inner = nn.Linear(hidden, hidden)
        self.film = nn.Linear(embed_dim, 2 * hidden)
        self.drop = nn.Dropout(dropout)
        self.outer = nn.Linear(hidden, hidden)
        # Each block starts as the identity, so a deep stack trains from the first step.
        nn.init.zeros_(self.outer.weight)
        nn.init.zeros_(self.outer.bias)

    def forward(self, h: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        scale, shift = self.film(emb).chunk(2, dim=-1)
        inner = self.inner(self.norm(h)) * (1 + scale) + shift
        return h + self.outer(self.drop(nn.functional.silu(inner)))


class FieldMLP(nn.Module):
    """``eps_theta(x_t, t, cond)`` for fields.

    x: (B, D) or (B, D, K) noised fields; t: (B,) integer timesteps; cond: (B, C) conditions
    (all standardised by the task) -> a prediction shaped like x.
    """

    def __init__(self, cfg: FieldModelConfig, *, cond_dim: int, x_dim: int) -> None:
        super().__init__()
        width = x_dim * cfg.fields
        self.time_proj = Timesteps(cfg.embed_dim, flip_sin_to_cos=True, downscale_freq_shift=0)
        self.time_embed = TimestepEmbedding(cfg.embed_dim, cfg.embed_dim)
        self.cond_embed = TimestepEmbedding(cond_dim, cfg.embed_dim)  # Linear -> SiLU -> Linear
        self.inp = nn.Linear(width, cfg.hidden)
        self.blocks = nn.ModuleList(ResidualBlock(cfg.hidden, cfg.embed_dim, cfg.dropout) for _ in range(cfg.depth))
        self.out_norm = nn.LayerNorm(cfg.hidden)
        self.out = nn.Linear(cfg.hidden, width)

    def forward(self, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        # The sinusoids are fp32; under autocast the linear layers cast them themselves.
        emb = self.time_embed(self.time_proj(t)) + self.cond_embed(cond)
        emb = nn.functional.silu(emb)
        h = self.inp(x.flatten(1))
        for block in self.blocks:
            h = block(h, emb)
        return self.out(self.out_norm(h)).view(x.shape)
