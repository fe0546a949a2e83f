"""Each task's network section (``model:`` in a config). Which class a config's ``model``
section is read as follows its ``task`` (``MODEL_CONFIGS``); everything else in a
``RunConfig`` is shared by every task."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar

from diffscale.config.errors import fail as _fail


@dataclass(kw_only=True)
class ModelConfig:
    """The denoising network (a diffusers ``UNet2DModel``)."""

    FOLLOW_DATA: ClassVar[tuple[str, ...]] = ("channels",)
    """Sizes that 0 leaves to the data."""
    KEYED_AS_BEFORE: ClassVar[dict[str, object]] = {"class_conditional": False, "label_dropout": 0.1}
    """Fields added after kernel caches and compiled-graph keys hashed this section: left out of
    those keys at these values (``RunConfig.model_key``), so runs that do not use them keep theirs."""
    sample_size: int = 28
    """Image side in pixels; data is resized/cropped to it."""
    channels: int = 0
    """Image channels; 0 follows the data (1 for grayscale, 3 for RGB)."""
    block_out_channels: tuple[int, ...] = (32, 64, 128)
    """Width of each UNet level, from the highest resolution down."""
    attention: tuple[bool, ...] = (False, True, True)
    """Self-attention at each level (same length as ``block_out_channels``)."""
    layers_per_block: int = 2
    """ResNet layers per UNet level."""
    norm_num_groups: int = 32
    """GroupNorm groups; must divide every width in ``block_out_channels``."""
    dropout: float = 0.0
    """Dropout in the ResNet blocks."""
    class_conditional: bool = False
    """Train a class-conditional model on the data's labels (the built-in glyphs, an image folder
    with one folder per class, EMNIST/MNIST with their labels file, npz with ``labels``) with
    classifier-free guidance: the UNet gets a class embedding with one extra "no class" entry,
    which ``label_dropout`` of the training examples see instead of their label. Sampled with
    ``diffscale sample --class A --guidance W``."""
    label_dropout: float = 0.1
    """Share of training examples whose label is replaced by "no class" (class-conditional runs):
    what teaches the unconditional prediction that guidance extrapolates from."""

    def __post_init__(self) -> None:
        self.block_out_channels = tuple(int(c) for c in self.block_out_channels)
        self.attention = tuple(bool(a) for a in self.attention)
        if self.sample_size < 4:
            _fail("model.sample_size", f"{self.sample_size} is too small", "use 8 pixels or more")
        if not self.block_out_channels:
            _fail("model.block_out_channels", "is empty", "give one width per UNet level, e.g. [32, 64, 128]")
        if len(self.attention) != len(self.block_out_channels):
            _fail(
                "model.attention",
                f"has {len(self.attention)} entries but model.block_out_channels has {len(self.block_out_channels)}",
                "give one true/false per UNet level",
            )
        for width in self.block_out_channels:
            if width <= 0 or width % self.norm_num_groups:
                _fail(
                    "model.block_out_channels",
                    f"width {width} is not a positive multiple of model.norm_num_groups={self.norm_num_groups}",
                    "use widths divisible by norm_num_groups, or lower norm_num_groups",
                )
        downsamples = 2 ** (len(self.block_out_channels) - 1)
        if self.sample_size % downsamples:
            _fail(
                "model.sample_size",
                f"{self.sample_size} px cannot be halved {len(self.block_out_channels) - 1} times "
                f"by a {len(self.block_out_channels)}-level UNet",
                f"use a size divisible by {downsamples} "
                f"(e.g. {max(downsamples, self.sample_size // downsamples * downsamples)}) or fewer levels",
            )
        if self.channels not in (0, 1, 3, 4):
            _fail("model.channels", f"{self.channels} is not supported", "use 0 (follow the data), 1, 3 or 4")
        if self.layers_per_block < 1:
            _fail("model.layers_per_block", "must be at least 1", "set it to 1 or 2")
        if not 0.0 <= self.dropout < 1.0:
            _fail("model.dropout", f"{self.dropout} is outside [0, 1)", "use e.g. 0.0 or 0.1")
        if not 0.0 <= self.label_dropout < 1.0:
            _fail("model.label_dropout", f"{self.label_dropout} is outside [0, 1)", "use e.g. 0.1")

    def summary(self) -> str:
        attention = "/".join("yes" if a else "no" for a in self.attention)
        classes = ", class-conditional" if self.class_conditional else ""
        widths = _widths(self.block_out_channels)
        return f"UNet2D {self.sample_size} px, widths {widths}, attention {attention}{classes}"


def _widths(values: tuple[int, ...]) -> str:
    return "/".join(str(v) for v in values)


@dataclass(kw_only=True)
class FieldModelConfig:
    """The field denoiser: a residual MLP mapping a noised field ``x`` (D values, or D x K for
    K fields, flattened) to its noise, given the condition ``c`` (C values) and the timestep."""

    FOLLOW_DATA: ClassVar[tuple[str, ...]] = ("cond_dim", "x_dim")
    """Sizes that 0 leaves to the data."""
    cond_dim: int = 0
    """Condition values C per sample (e.g. 7: a coarse cell and its six neighbours); 0 follows the data."""
    x_dim: int = 0
    """Fine values D per field (e.g. 256); 0 follows the data."""
    fields: int = 1
    """Fields K per sample (x has shape D x K; 1: one field)."""
    hidden: int = 256
    """Width of the residual blocks."""
    depth: int = 4
    """Residual blocks."""
    embed_dim: int = 128
    """Width of the timestep and condition embeddings."""
    dropout: float = 0.0
    """Dropout inside the residual blocks."""
    coarse_index: int = 0
    """Which condition value is the coarse (cell-mean) value of the fine field (of field 0 when
    there are several): evaluation reports how far the mean of the generated values drifts
    from it (conservation error). -1: the condition holds none; the metric is left out."""

    def __post_init__(self) -> None:
        if self.coarse_index < -1:
            _fail("model.coarse_index", f"{self.coarse_index} is below -1",
                  "use the position of the coarse value in the condition (e.g. 0), or -1 for none")
        for name in ("cond_dim", "x_dim"):
            if getattr(self, name) < 0:
                _fail(f"model.{name}", f"{getattr(self, name)} is negative",
                      "use 0 (follow the data) or a positive size")
        for name in ("fields", "hidden", "depth", "embed_dim"):
            if getattr(self, name) < 1:
                _fail(f"model.{name}", f"must be at least 1 (got {getattr(self, name)})",
                      f"set model.{name} to a positive number")
        if not 0.0 <= self.dropout < 1.0:
            _fail("model.dropout", f"{self.dropout} is outside [0, 1)", "use e.g. 0.0 or 0.1")

    def summary(self) -> str:
        fields = f" x {self.fields}" if self.fields > 1 else ""
        return f"MLP {self.cond_dim or '?'} -> {self.x_dim or '?'}{fields}, {self.depth} blocks of {self.hidden}"


class ConvImpl(str, enum.Enum):
    """How the policy UNet's temporal convolutions run (``PolicyModelConfig.conv``)."""

    AUTO = "auto"
    CUDNN = "cudnn"
    MATMUL = "matmul"


@dataclass(kw_only=True)
class PolicyModelConfig:
    """The action denoiser: a 1-D temporal convolutional UNet over the action chunk, conditioned
    by FiLM on the observation history and the timestep (ConditionalUnet1D of diffusion policy)."""

    FOLLOW_DATA: ClassVar[tuple[str, ...]] = ("obs_dim", "action_dim")
    """Sizes that 0 leaves to the data."""
    obs_dim: int = 0
    """Observation values O per time step; 0 follows the data."""
    action_dim: int = 0
    """Action values A per time step; 0 follows the data."""
    obs_horizon: int = 2
    """Observation steps the policy sees (To)."""
    pred_horizon: int = 16
    """Action steps each sample predicts (T); a multiple of 2 ** (levels - 1)."""
    action_horizon: int = 8
    """Predicted action steps executed before the policy is asked again (Ta <= T - To + 1)."""
    down_dims: tuple[int, ...] = (256, 512, 1024)
    """Channel width of each UNet level."""
    kernel_size: int = 5
    """Temporal convolution kernel size (odd)."""
    n_groups: int = 8
    """GroupNorm groups; must divide every width in ``down_dims``."""
    step_embed_dim: int = 256
    """Width of the diffusion-step embedding."""
    conv: ConvImpl = ConvImpl.AUTO
    """How the temporal convolutions run: ``cudnn`` (torch's conv1d), ``matmul`` (the windows
    unfolded and multiplied by the weights as one matrix product: the same weights and results)
    or ``auto``: matmul for calls of a few rows on a GPU (an action chunk at batch 1), cudnn otherwise
    (training batches), each where it measured faster (docs/decisions.md, "Policy convolutions as
    matrix products for small calls"). Checkpoints load either way."""

    def __post_init__(self) -> None:
        self.down_dims = tuple(int(d) for d in self.down_dims)
        for name in ("obs_dim", "action_dim"):
            if getattr(self, name) < 0:
                _fail(f"model.{name}", f"{getattr(self, name)} is negative",
                      "use 0 (follow the data) or a positive size")
        for name in ("obs_horizon", "pred_horizon", "action_horizon", "n_groups"):
            if getattr(self, name) < 1:
                _fail(f"model.{name}", f"must be at least 1 (got {getattr(self, name)})",
                      f"set model.{name} to a positive number")
        if not self.down_dims:
            _fail("model.down_dims", "is empty", "give one width per UNet level, e.g. [256, 512, 1024]")
        for width in self.down_dims:
            if width <= 0 or width % self.n_groups:
                _fail("model.down_dims", f"width {width} is not a positive multiple of model.n_groups={self.n_groups}",
                      "use widths divisible by n_groups, or lower n_groups")
        levels = 2 ** (len(self.down_dims) - 1)
        if self.pred_horizon % levels:
            _fail("model.pred_horizon", f"{self.pred_horizon} steps cannot be halved {len(self.down_dims) - 1} times",
                  f"use a multiple of {levels} (e.g. 16) or fewer down_dims")
        if self.action_horizon > self.pred_horizon - self.obs_horizon + 1:
            _fail("model.action_horizon", f"{self.action_horizon} > pred_horizon - obs_horizon + 1 "
                  f"= {self.pred_horizon - self.obs_horizon + 1}",
                  "lower model.action_horizon or raise model.pred_horizon")
        if self.kernel_size < 1 or self.kernel_size % 2 == 0:
            _fail("model.kernel_size", f"{self.kernel_size} is not a positive odd number", "use 3 or 5")
        # The sinusoidal step embedding is a sine and a cosine per frequency, half the width each,
        # its frequencies spaced over half - 1 intervals: an odd width or one below 4 cannot be built.
        if self.step_embed_dim < 4 or self.step_embed_dim % 2:
            _fail("model.step_embed_dim", f"{self.step_embed_dim} is not an even number of at least 4",
                  f"use an even width such as {max(4, self.step_embed_dim + self.step_embed_dim % 2)} (the presets "
                  "use 32 and 256)")

    def summary(self) -> str:
        return (f"UNet1D To {self.obs_horizon} / T {self.pred_horizon} / Ta {self.action_horizon}, "
                f"widths {_widths(self.down_dims)}")


TaskModelConfig = ModelConfig | FieldModelConfig | PolicyModelConfig

MODEL_CONFIGS: dict[str, type] = {"images": ModelConfig, "fields": FieldModelConfig, "policy": PolicyModelConfig}
"""The ``model`` section's class for each task."""
