"""The micro image config the suite's runner tests train with, as ``--set`` arguments."""

from __future__ import annotations

# tests/helpers.py's micro image config (a 2-level UNet on 8 px: a step takes milliseconds)
MICRO = ["model.sample_size=8", "model.block_out_channels=[8,16]", "model.attention=[false,true]",
         "model.layers_per_block=1", "model.norm_num_groups=8", "train.batch_per_gpu=8", "train.checkpoint_every=4",
         "train.sample_count=4", "train.sample_steps=3"]


def set_args(items: list[str]) -> list[str]:
    """``--set ITEM`` for each item."""
    return [arg for item in items for arg in ("--set", item)]
