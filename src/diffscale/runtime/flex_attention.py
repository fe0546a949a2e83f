"""Self-attention of diffusers' UNet through PyTorch's FlexAttention (``runtime.attention=flex``).

The presets' UNets use diffusers' default 8-channel heads. The fused SDPA kernels tile the head
dimension at 64 (cuDNN) or 32 (flash), so most of their work is padding: attention took a large
share of small's step (docs/benchmarks.md, "Attention kernels"). FlexAttention is compiled by inductor into a Triton
kernel sized for the call; Triton's matrix instructions need 16 channels, so heads are zero-padded
to 16 (zeros add nothing to the scores and produce output columns that are dropped). Same weights,
same function: applied from outside the network, like DDP and torch.compile.

Heads go into the batch dimension, (batch x heads, 1, tokens, 16): inductor's layout optimisation
(on for training, docs/benchmarks.md, "Defaults and why") stores 4-D tensors that feed or follow a convolution
channels-last (in a UNet, nearly all of them), which for (batch, heads, tokens, d) puts the heads
innermost and made each attention read 8-channel-strided
rows (far slower kernels; docs/decisions.md, "FlexAttention for the 8-channel heads"); with one "channel" that layout
is the contiguous one.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from diffusers.models.attention_processor import Attention

MIN_HEAD_DIM = 16
MAX_GRID_BATCH = 65_535
"""CUDA's limit on a launch grid's second dimension, where FlexAttention puts the batch."""
SMALL_HEAD_BACKWARD = {"bwd_BLOCK_M1": 32, "bwd_BLOCK_N1": 64, "bwd_BLOCK_M2": 64, "bwd_BLOCK_N2": 32,
                       "bwd_num_stages": 1, "bwd_num_warps": 4}
"""Backward tiles inductor's own autotuning chose for 16-channel heads on an H100 (both of small's
attention shapes): small's compiled attention layers ran faster with them than with inductor's
default tiles (docs/benchmarks.md, "Attention kernels")."""


class FlexAttnProcessor:
    """diffusers attention processor: self-attention through ``flex_attention``.

    Calls this processor cannot take (cross-attention, masks, spatial or q/k norms, which the
    UNet2DModel presets never use, or more rows than a launch grid holds) and calls of fewer than
    ``min_rows`` (batch x heads) rows go to diffusers' own SDPA processor.
    """

    def __init__(self, kernel_options: dict | None = None, min_rows: int = 0) -> None:
        from diffusers.models.attention_processor import AttnProcessor2_0
        from torch.nn.attention.flex_attention import flex_attention

        self._fallback = AttnProcessor2_0()
        self._flex = flex_attention
        self.kernel_options = kernel_options
        self.min_rows = min_rows

    def __call__(self, attn: Attention, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor | None = None,
                 attention_mask: torch.Tensor | None = None, temb: torch.Tensor | None = None,
                 *args: Any, **kwargs: Any) -> torch.Tensor:
        batch = hidden_states.shape[0]
        unsupported = (encoder_hidden_states is not None or attention_mask is not None or args or kwargs
                       or attn.spatial_norm is not None or attn.norm_q is not None or attn.norm_k is not None
                       or not self.min_rows <= batch * attn.heads <= MAX_GRID_BATCH)
        if unsupported:
            return self._fallback(attn, hidden_states, encoder_hidden_states, attention_mask, temb, *args, **kwargs)
        residual = hidden_states
        four_d = hidden_states.ndim == 4
        if four_d:
            batch, channel, height, width = hidden_states.shape
            hidden_states = hidden_states.view(batch, channel, height * width).transpose(1, 2)
        if attn.group_norm is not None:
            hidden_states = attn.group_norm(hidden_states.transpose(1, 2)).transpose(1, 2)
        query, key, value = attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)
        head_dim = key.shape[-1] // attn.heads
        out = self.attend(*(x.view(batch, -1, attn.heads, head_dim).transpose(1, 2) for x in (query, key, value)))
        hidden_states = out.transpose(1, 2).reshape(batch, -1, attn.heads * head_dim).to(query.dtype)
        hidden_states = attn.to_out[1](attn.to_out[0](hidden_states))
        if four_d:
            hidden_states = hidden_states.transpose(-1, -2).reshape(batch, channel, height, width)
        if attn.residual_connection:
            hidden_states = hidden_states + residual
        return hidden_states / attn.rescale_output_factor

    def attend(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        """softmax(q k^T / sqrt(d)) v over (batch, heads, tokens, d): one head per batch row, heads
        padded to 16 channels."""
        batch, heads, tokens, head_dim = query.shape
        pad = max(0, MIN_HEAD_DIM - head_dim)

        def one_head_rows(x: torch.Tensor) -> torch.Tensor:
            x = x.reshape(batch * heads, 1, tokens, head_dim)
            return F.pad(x, (0, pad)) if pad else x

        options = self.kernel_options
        if options is None and head_dim <= MIN_HEAD_DIM:
            options = SMALL_HEAD_BACKWARD
        # flex_attention takes the bwd_-prefixed tile keys, which its FlexKernelOptions type does not list
        out = self._flex(one_head_rows(query), one_head_rows(key), one_head_rows(value),
                         scale=1.0 / math.sqrt(head_dim), kernel_options=options)  # type: ignore[arg-type]
        return out[..., :head_dim].reshape(batch, heads, tokens, head_dim)


def use_flex_attention(net: torch.nn.Module, min_rows: int = 0) -> int:
    """Route ``net``'s diffusers attention layers through FlexAttention (calls of at least
    ``min_rows`` batch x heads rows); returns how many layers."""
    from diffusers.models.attention_processor import Attention

    layers = [m for m in net.modules() if isinstance(m, Attention)]
    processor = FlexAttnProcessor(min_rows=min_rows)
    for layer in layers:
        layer.set_processor(processor)
    return len(layers)


@contextlib.contextmanager
def sdpa_attention(net: torch.nn.Module) -> Iterator[None]:
    """Within the block, ``net``'s FlexAttention layers run diffusers' SDPA processor: the same
    function, in the form eager tools (the FLOP counter) can trace; the padding is not counted."""
    from diffusers.models.attention_processor import AttnProcessor2_0

    swapped: list[Any] = [m for m in net.modules() if isinstance(getattr(m, "processor", None), FlexAttnProcessor)]
    flex = [m.processor for m in swapped]
    sdpa = AttnProcessor2_0()
    for layer in swapped:
        layer.set_processor(sdpa)
    try:
        yield
    finally:
        for layer, processor in zip(swapped, flex, strict=True):
            layer.set_processor(processor)
