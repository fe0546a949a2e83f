"""ConditionalUnet1D: the temporal convolutional UNet of diffusion policy (Chi et al., 2023).

An action chunk (B, T, A) is treated as A channels over T time steps. Every residual block
is modulated by FiLM (a per-channel scale and bias) computed from one global condition:
the diffusion-step embedding concatenated with the flattened observation history. The
down path halves T at every level but the last, the up path doubles it back.

Module and parameter names follow the reference implementation
(``diffusion_policy/model/diffusion/conditional_unet1d.py``), so its ``ConditionalUnet1D``
loads a state dict exported from here and the other way round. Single-device code:
parallelism and compilation are applied from outside.
"""

from __future__ import annotations

import math
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from diffscale.config import PolicyModelConfig
from diffscale.config.models import ConvImpl

MATMUL_MAX_ROWS = 64
"""``conv: auto`` runs a call as a matrix product up to this many rows (batch x length) on a GPU."""


def _as_matmul(impl: str, x: torch.Tensor) -> bool:
    if impl == "auto":  # decided per input shape and device: a constant inside a compiled graph
        return x.is_cuda and x.shape[0] * x.shape[-1] <= MATMUL_MAX_ROWS
    return impl == "matmul"


def _geometry(conv: nn.Conv1d | nn.ConvTranspose1d) -> tuple[int, int, int]:
    """(kernel size, stride, padding) of a 1-D convolution built with numeric padding."""
    padding = conv.padding
    assert not isinstance(padding, str), "the UNet's convolutions take numeric padding"
    return conv.kernel_size[0], conv.stride[0], padding[0]


class TemporalConv(nn.Conv1d):
    """``nn.Conv1d`` (same parameters, same results) that can run as one matrix product over the
    unfolded windows (``impl``: see ``PolicyModelConfig.conv``). At batch 1 cuDNN's bf16 1-D
    convolutions convert the layout around every call (much of an action chunk's kernel time;
    docs/decisions.md, "Policy convolutions as matrix products for small calls"); a matrix product
    needs no layout change, but at training batches cuDNN is faster."""

    impl = "cudnn"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not _as_matmul(self.impl, x):
            return super().forward(x)
        k, stride, pad = _geometry(self)
        if pad:
            x = F.pad(x, (pad, pad))
        windows = x.unfold(2, k, stride)  # (B, C_in, T_out, k)
        cols = windows.permute(0, 2, 1, 3).reshape(x.shape[0], windows.shape[2], -1)
        return F.linear(cols, self.weight.reshape(self.out_channels, -1), self.bias).transpose(1, 2)


class TemporalUpsample(nn.ConvTranspose1d):
    """``nn.ConvTranspose1d`` that can run as a matrix product followed by an overlap-add,
    chosen as :class:`TemporalConv` chooses."""

    impl = "cudnn"

    def forward(self, x: torch.Tensor, output_size: list[int] | None = None) -> torch.Tensor:
        if not _as_matmul(self.impl, x):
            return super().forward(x, output_size)
        k, stride, pad = _geometry(self)
        length = x.shape[-1]
        # every input step contributes weight[:, :, j] @ x_t to output step t * stride - pad + j
        cols = F.linear(x.transpose(1, 2), self.weight.flatten(1).t())  # (B, T, C_out * k)
        out_len = (length - 1) * stride - 2 * pad + k
        out = F.fold(cols.transpose(1, 2), output_size=(1, out_len + 2 * pad), kernel_size=(1, k),
                     stride=(1, stride))[:, :, 0, pad:pad + out_len]
        return out + self.bias[:, None] if self.bias is not None else out


class SinusoidalPosEmb(nn.Module):
    """Diffusion step (B,) -> (B, dim) sinusoidal features."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        half = self.dim // 2
        freqs = torch.exp(torch.arange(half, device=t.device) * -(math.log(10000) / (half - 1)))
        angles = t.float()[:, None] * freqs[None, :]
        return torch.cat((angles.sin(), angles.cos()), dim=-1)


class Conv1dBlock(nn.Module):
    """Conv1d -> GroupNorm -> Mish, keeping the length: (B, C_in, T) -> (B, C_out, T)."""

    def __init__(self, inp: int, out: int, kernel_size: int, n_groups: int) -> None:
        super().__init__()
        self.block = nn.Sequential(TemporalConv(inp, out, kernel_size, padding=kernel_size // 2),
                                   nn.GroupNorm(n_groups, out), nn.Mish())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


class ConditionalResidualBlock1D(nn.Module):
    """Two conv blocks with FiLM between them and a residual connection.
    x (B, C_in, T), cond (B, cond_dim) -> (B, C_out, T)."""

    def __init__(self, inp: int, out: int, cond_dim: int, kernel_size: int, n_groups: int) -> None:
        super().__init__()
        self.out_channels = out
        self.blocks = nn.ModuleList([Conv1dBlock(inp, out, kernel_size, n_groups),
                                     Conv1dBlock(out, out, kernel_size, n_groups)])
        # One scale and one bias per output channel, broadcast over time.
        self.cond_encoder = nn.Sequential(nn.Mish(), nn.Linear(cond_dim, 2 * out), nn.Unflatten(-1, (-1, 1)))
        self.residual_conv = TemporalConv(inp, out, 1) if inp != out else nn.Identity()

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        h = self.blocks[0](x)
        film = self.cond_encoder(cond).reshape(x.shape[0], 2, self.out_channels, 1)
        h = film[:, 0] * h + film[:, 1]
        h = self.blocks[1](h)
        return h + self.residual_conv(x)


class Downsample1d(nn.Module):
    """Halve the length: (B, C, T) -> (B, C, T / 2)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.conv = TemporalConv(dim, dim, 3, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


class Upsample1d(nn.Module):
    """Double the length: (B, C, T) -> (B, C, 2 T)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.conv = TemporalUpsample(dim, dim, 4, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


class ConditionalUnet1D(nn.Module):
    """Noise (or sample) prediction for action chunks.

    ``forward(x_t, t, obs_cond)``: x_t (B, T, A) noised actions, t (B,) integer diffusion
    steps, obs_cond (B, To * O) the flattened observation history. Returns (B, T, A).
    """

    def __init__(self, input_dim: int, global_cond_dim: int, *, step_embed_dim: int = 256,
                 down_dims: tuple[int, ...] = (256, 512, 1024), kernel_size: int = 5, n_groups: int = 8) -> None:
        super().__init__()
        all_dims = [input_dim, *down_dims]
        self.diffusion_step_encoder = nn.Sequential(
            SinusoidalPosEmb(step_embed_dim), nn.Linear(step_embed_dim, step_embed_dim * 4), nn.Mish(),
            nn.Linear(step_embed_dim * 4, step_embed_dim))
        cond_dim = step_embed_dim + global_cond_dim
        in_out = list(zip(all_dims[:-1], all_dims[1:], strict=True))

        def block(inp: int, out: int) -> ConditionalResidualBlock1D:
            return ConditionalResidualBlock1D(inp, out, cond_dim, kernel_size, n_groups)

        self.down_modules = nn.ModuleList([
            nn.ModuleList([block(dim_in, dim_out), block(dim_out, dim_out),
                           Downsample1d(dim_out) if i < len(in_out) - 1 else nn.Identity()])
            for i, (dim_in, dim_out) in enumerate(in_out)])
        self.mid_modules = nn.ModuleList([block(all_dims[-1], all_dims[-1]), block(all_dims[-1], all_dims[-1])])
        # The up path mirrors the down path without its first level: the skip input of the
        # highest resolution stays unused, as in the reference (so checkpoints load both ways).
        self.up_modules = nn.ModuleList([
            nn.ModuleList([block(dim_out * 2, dim_in), block(dim_in, dim_in), Upsample1d(dim_in)])
            for dim_in, dim_out in reversed(in_out[1:])])
        self.final_conv = nn.Sequential(Conv1dBlock(down_dims[0], down_dims[0], kernel_size, n_groups),
                                        TemporalConv(down_dims[0], input_dim, 1))

    def forward(self, x_t: torch.Tensor, t: torch.Tensor, obs_cond: torch.Tensor) -> torch.Tensor:
        step = self.diffusion_step_encoder(t.expand(x_t.shape[0]))
        cond = torch.cat([step, obs_cond.to(step.dtype)], dim=-1)
        x = x_t.transpose(1, 2)  # (B, A, T): actions are channels, time is the convolved axis
        skips = []
        for level in self.down_modules:
            res1, res2, down = cast(nn.ModuleList, level)
            x = res2(res1(x, cond), cond)
            skips.append(x)
            x = down(x)
        for mid in self.mid_modules:
            x = mid(x, cond)
        for level in self.up_modules:
            res1, res2, up = cast(nn.ModuleList, level)
            x = torch.cat((x, skips.pop()), dim=1)
            x = up(res2(res1(x, cond), cond))
        return self.final_conv(x).transpose(1, 2)


def build_unet1d(cfg: PolicyModelConfig, obs_dim: int, action_dim: int) -> ConditionalUnet1D:
    """The network ``cfg`` describes for observations of ``obs_dim`` and actions of ``action_dim`` values."""
    net = ConditionalUnet1D(action_dim, obs_dim * cfg.obs_horizon, step_embed_dim=cfg.step_embed_dim,
                            down_dims=cfg.down_dims, kernel_size=cfg.kernel_size, n_groups=cfg.n_groups)
    for module in net.modules():
        if isinstance(module, (TemporalConv, TemporalUpsample)):
            module.impl = ConvImpl(cfg.conv).value
    return net
