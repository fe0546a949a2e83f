"""The typed run configuration: keyword-only dataclasses, one per section (their choices: choices.py).

Every field has a doc comment; ``__post_init__`` validation names the field
(``train.batch_per_gpu``) and the fix."""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any

import yaml

from diffscale.config.choices import (
    BetaSchedule,
    LossWeighting,
    LrScaling,
    LrSchedule,
    Prediction,
    SamplerName,
    TimestepSpacing,
    Toggle,
)
from diffscale.config.errors import fail as _fail
from diffscale.config.models import ModelConfig, TaskModelConfig
from diffscale.config.runtime import RUNTIME_OUTSIDE_GRAPH, RuntimeConfig
from diffscale.config.trackers import LoggingConfig


@dataclass(kw_only=True)
class DiffusionConfig:
    """The forward (noising) process, shared by training and sampling."""

    num_train_timesteps: int = 1000
    """Number of diffusion steps the network is trained on."""
    beta_schedule: BetaSchedule = BetaSchedule.LINEAR
    """Noise schedule."""
    beta_start: float = 1e-4
    """First beta of the linear schedules."""
    beta_end: float = 0.02
    """Last beta of the linear schedules."""
    prediction_type: Prediction = Prediction.EPSILON
    """Training target: ``epsilon`` (the noise), ``v_prediction`` or ``sample``. The image presets
    train ``v_prediction``, which reached a given quality sooner (docs/benchmarks.md, "Time to
    quality (images)")."""
    loss_weighting: LossWeighting = LossWeighting.NONE
    """``none``: every timestep's error counts alike (the common recipe). ``min-snr``: Min-SNR-gamma
    weighting (Hang et al. 2023, as diffusers' training examples apply it): each sample's error
    weighted by min(SNR_t, gamma) / SNR_t for epsilon prediction (/(SNR_t + 1) for v-prediction,
    min(SNR_t, gamma) for sample prediction), so low-noise timesteps stop dominating the loss. Off
    by default: it sped up noise prediction's time to quality but not v-prediction's, which the
    image presets train (docs/benchmarks.md, "Time to quality (images)")."""
    min_snr_gamma: float = 5.0
    """gamma of ``loss_weighting: min-snr`` (the paper's and diffusers' 5)."""
    clip_sample: bool = True
    """Clip each sampling step's clean-sample estimate to [-1, 1] (data scaled to that range:
    images, min/max-normalised actions); off for standardised data such as fields."""
    timestep_spacing: TimestepSpacing = TimestepSpacing.LEADING
    """Which trained timesteps DDIM and strided DDPM sampling visit. ``leading`` (diffusers'
    default) starts N steps at timestep (N-1) x (T // N), ``trailing`` at the last one, T-1, for
    every N: with few trained timesteps leading starts far from pure noise (20 of 50 start at 38)
    and loses quality, so the field presets use trailing (docs/measurements/2026-11-27.md, "Each CPU
    preset trained to its full step count"). DPM-Solver++ starts at T-1 either way."""

    def __post_init__(self) -> None:
        if self.num_train_timesteps < 2:
            _fail("diffusion.num_train_timesteps", "must be at least 2", "use 1000")
        if not 0 < self.beta_start < self.beta_end < 1:
            _fail("diffusion.beta_start/beta_end", "need 0 < beta_start < beta_end < 1", "use 1e-4 and 0.02")
        if not self.min_snr_gamma > 0:
            _fail("diffusion.min_snr_gamma", f"must be positive (got {self.min_snr_gamma})", "use 5")


@dataclass(kw_only=True)
class DataConfig:
    """Where training data comes from and how images are augmented (shift_px, hflip: images only)."""

    source: str = "builtin"
    """Data spec; each task reads its own kinds, and plain ``builtin`` is each task's built-in data
    (images: glyphs; fields: the coarse -> fine generator; policy: reach2d).
    Images: builtin[:glyphs|numerals|digits|mix], imagefolder:PATH, npz:PATH, emnist:ROOT[:split],
    mnist:ROOT (see the README for fields and policy)."""
    shift_px: int = 1
    """Random translation of up to this many pixels (on the device), 0 to disable."""
    hflip: bool = False
    """Random horizontal flips (off by default: they turn letters into mirror glyphs)."""
    max_items: int = 0
    """Use at most this many images (0: all)."""
    fraction: float = 1.0
    """Train on this fraction of the training examples (0 < fraction <= 1): a subset drawn with
    ``subset_seed``, the same on every rank, at every resume and for every ``train.seed``; a smaller
    fraction's subset lies inside a larger one's."""
    subset_seed: int = 0
    """Seed of the ``fraction`` subset (independent of ``train.seed``, so seeds vary training only)."""
    max_bad_fraction: float = 0.01
    """Images that cannot be read are skipped with a warning naming a few, up to this fraction of
    the data set (0 <= fraction < 1); more ends the run (images: imagefolder, webdataset, parquet)."""
    resident: Toggle = Toggle.AUTO
    """Where the training data lives: ``on``: all of it on the training device; ``off``: streamed
    from the decoded cache on disk by loader workers; ``auto``: on the device when it fits a share of
    the device's memory beside the model (on the CPU: of host memory), else streamed."""
    workers: int = 0
    """Loader workers per rank on the streaming path (0: decide from the CPUs and host memory the
    ranks of a node share)."""

    def __post_init__(self) -> None:
        if not 0 < self.fraction <= 1:
            _fail("data.fraction", f"is {self.fraction}, outside (0, 1]", "use e.g. 0.1 for 10 % of the data")
        if not self.source.strip():
            _fail("data.source", "is empty", "use builtin, imagefolder:PATH, npz:PATH, emnist:ROOT or mnist:ROOT")
        if self.shift_px < 0:
            _fail("data.shift_px", "is negative", "use 0 (off) or a few pixels")
        if self.max_items < 0:
            _fail("data.max_items", "is negative", "use 0 for all images")
        if not 0 <= self.max_bad_fraction < 1:
            _fail("data.max_bad_fraction", f"is {self.max_bad_fraction}, outside [0, 1)",
                  "use e.g. 0.01 to skip up to 1 % unreadable images, 0 to skip none")
        if self.workers < 0:
            _fail("data.workers", f"is {self.workers}", "use 0 (decide) or a number of loader workers per rank")


@dataclass(kw_only=True)
class OptimConfig:
    """AdamW with linear warm-up, clipping and an optional LR scaling rule."""

    lr: float = 2e-4
    """Peak learning rate (at ``base_batch``; see ``lr_scaling``)."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay."""
    beta1: float = 0.9
    """AdamW beta1."""
    beta2: float = 0.999
    """AdamW beta2."""
    warmup_steps: int = 200
    """Linear warm-up from 0 to the peak learning rate."""
    schedule: LrSchedule = LrSchedule.CONSTANT
    """Learning rate after warm-up."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this (0 disables clipping)."""
    lr_scaling: LrScaling = LrScaling.NONE
    """Scale ``lr`` with effective batch / ``base_batch``."""
    base_batch: int = 256
    """The effective batch that ``lr`` was tuned for (used by ``lr_scaling``)."""

    def __post_init__(self) -> None:
        if not 0 < self.lr < 1:
            _fail("optim.lr", f"{self.lr} is outside (0, 1)", "use e.g. 2e-4")
        if self.warmup_steps < 0:
            _fail("optim.warmup_steps", "is negative", "use 0 or more")
        if self.grad_clip < 0:
            _fail("optim.grad_clip", "is negative", "use 0 (off) or e.g. 1.0")
        if self.base_batch < 1:
            _fail("optim.base_batch", "must be positive", "use the batch your lr was tuned at")


@dataclass(kw_only=True)
class TrainConfig:
    """Loop length, batching, EMA, logging and checkpoint cadence."""

    steps: int = 10_000
    """Optimizer steps to train (the run's target; resumes continue to it)."""
    batch_per_gpu: int = 64
    """Micro-batch per process (per GPU)."""
    grad_accum: int = 1
    """Micro-batches accumulated per optimizer step. Effective batch = batch_per_gpu x world size x grad_accum."""
    ema_decay: float = 0.999
    """EMA decay of the weights used for sampling."""
    seed: int = 0
    """Seed of data order, noise and sampling; a run is reproducible for a given world size."""
    log_every: int = 25
    """Log metrics every N steps (the only host synchronisation of the loop)."""
    checkpoint_every: int = 500
    """Write a checkpoint every N steps (and at the end)."""
    keep_checkpoints: int = 3
    """Keep the newest K checkpoints."""
    sample_every: int = 0
    """Write a sample grid every N steps (0: only at the end)."""
    sample_count: int = 64
    """Images in each sample grid."""
    sample_steps: int = 15
    """Denoising steps of the run's sampling: the grids and quality evaluations written during
    training, and ``diffscale sample`` / ``eval`` unless ``--steps`` is given."""
    sample_sampler: SamplerName = SamplerName.DPMSOLVER
    """Reverse process of the run's sampling (``ddim``, ``dpmsolver`` or ``ddpm``), as
    ``sample_steps``. DPM-Solver++ at 15 steps matched or beat DDIM at 50 on trained image and
    field runs at a third of the cost (docs/benchmarks.md, "Sampling at equal quality")."""
    sample_guidance: float = 2.0
    """Classifier-free guidance scale w of class-conditional image runs (``model.class_conditional``):
    each step predicts eps_u + w (eps_c - eps_u) from the unconditional and the class-conditional
    prediction; 1: the conditional prediction alone, 0: the unconditional one. Used by the grids and
    quality evaluations written during training, and as ``diffscale sample --guidance``'s default;
    other runs ignore it."""
    eval_every: int = 0
    """Compute the task's quality metrics (images: Frechet distance, precision/recall in a feature
    network's space) every N steps into metrics.jsonl and TensorBoard (0: never while training)."""
    eval_count: int = 256
    """Samples generated (from a fixed seed, shared over the ranks) for each quality evaluation."""
    eval_features: str = ""
    """``module:function`` returning a torch module that maps images (B, C, H, W) in [-1, 1] to
    features (B, D), used for the quality metrics instead of the classifier diffscale trains per data set."""
    max_nonfinite_steps: int = 3
    """Consecutive non-finite losses tolerated (steps skipped) before going back to the last good state
    (the divergence guard's; with it off, the newest checkpoint) with the learning rate halved."""
    divergence_guard: bool = True
    """Watch the loss for a divergence: a logged window's loss ``divergence_rise`` times above its
    recent level (the median of the last healthy windows) for ``divergence_patience`` windows in a
    row (or non-finite) sends the run back to its last good state with the learning rate halved,
    and says so in the log,
    metrics.jsonl, TensorBoard, ``status`` and the report (docs/decisions.md, "The divergence guard").
    A run that never diverges trains bit for bit as with it off."""
    divergence_rise: float = 1.5
    """How far above its recent level a window's loss counts as diverged (a factor > 1)."""
    divergence_noise: float = 5.0
    """How many noise widths above its recent level a window's loss must also be to count as
    diverged (the width: the window-to-window spread of the last 20 healthy windows' losses), so a
    loss noisy by nature -- a heavy-tailed target, small batches, a short ``log_every`` -- is not
    taken for a divergence; 0: the rise factor alone."""
    divergence_patience: int = 2
    """Logged windows in a row above that level before the guard restores (a lone spike passes)."""
    divergence_patience_steps: int = 100
    """Steps in a row above that level before the guard restores, besides ``divergence_patience``
    windows: with short logged windows (a small ``log_every``) a rise a few dozen steps long that
    falls back by itself passes, as it does in the image presets' 50-step windows (a collapse stays
    up for hundreds of steps); 0: the windows alone."""
    divergence_early_steps: int = 300
    """Steps from a run's start over which the guard judges every 10 steps where ``log_every`` is
    longer (reading the loss from the device that often then, and only then): a collapse in the
    first hundred steps is over before two longer windows give the guard a level to judge it by;
    0: the logged windows only."""
    divergence_keep_every: int = 200
    """Steps between the good states the guard keeps in memory (at the next log step; checkpoint
    steps too): on the device where it fits twice over, else in host memory."""
    divergence_max_restores: int = 3
    """Restores before the run stops with an error naming the learning rate to set."""

    def __post_init__(self) -> None:
        for name in ("steps", "batch_per_gpu", "grad_accum", "log_every", "checkpoint_every", "keep_checkpoints",
                     "sample_count", "sample_steps", "eval_count", "max_nonfinite_steps", "divergence_patience",
                     "divergence_keep_every"):
            if getattr(self, name) < 1:
                _fail(f"train.{name}", f"must be at least 1 (got {getattr(self, name)})",
                      f"set train.{name} to a positive number")
        if self.sample_every < 0:
            _fail("train.sample_every", "is negative", "use 0 (only at the end) or a step interval")
        if self.eval_every < 0:
            _fail("train.eval_every", "is negative", "use 0 (no evaluation while training) or a step interval")
        if self.eval_every and self.eval_count < 2:
            _fail("train.eval_count", f"must be at least 2 to fit a covariance (got {self.eval_count})",
                  "use e.g. 256")
        if self.eval_features and self.eval_features.count(":") != 1:
            _fail("train.eval_features", f"'{self.eval_features}' is not module:function",
                  "name a function returning a torch module, e.g. mypackage.features:build")
        if not self.sample_guidance >= 0.0:
            _fail("train.sample_guidance", f"must be 0 or more (got {self.sample_guidance})",
                  "use 0 or more (1: no guidance; 2 is the default)")
        if not 0.0 <= self.ema_decay < 1.0:
            _fail("train.ema_decay", f"{self.ema_decay} is outside [0, 1)", "use e.g. 0.999")
        if not 1.0 < self.divergence_rise < float("inf"):
            _fail("train.divergence_rise", f"must be a factor above 1 (got {self.divergence_rise})",
                  "use e.g. 1.5, or train.divergence_guard off to switch the guard off")
        if not 0.0 <= self.divergence_noise < float("inf"):
            _fail("train.divergence_noise", f"must be 0 or a positive number of noise widths (got "
                  f"{self.divergence_noise})", "use e.g. 5, or 0 to judge by train.divergence_rise alone")
        if self.divergence_early_steps < 0:
            _fail("train.divergence_early_steps", "is negative", "use 0 (the logged windows only) or a number of steps")
        if self.divergence_patience_steps < 0:
            _fail("train.divergence_patience_steps", "is negative", "use 0 (windows alone) or a number of steps")
        if self.divergence_max_restores < 0:
            _fail("train.divergence_max_restores", "is negative", "use 0 (stop at the first divergence) or more")

    def sampling(self, sampler: str | None, steps: int | None, *,
                 task_sampler: str | None = None) -> tuple[str, int]:
        """The sampler and step count asked for, each defaulting to the run's own choice: the
        sampler ``task_sampler`` where the task names one for what it runs (a policy's
        evaluation: ``Task.evaluation_sampler``), else ``sample_sampler``; the steps
        ``sample_steps`` (what the run's previews and evaluations used)."""
        return sampler or task_sampler or self.sample_sampler.value, steps or self.sample_steps


@dataclass(kw_only=True)
class RunConfig:
    """Everything a run needs; written to ``RUN_DIR/config.yaml``."""

    preset: str = "tiny"
    """Preset this config started from (informational)."""
    task: str = "images"
    """Diffusion task: ``images``, ``fields`` (conditional vectors) or ``policy`` (action chunks)."""
    model: TaskModelConfig = field(default_factory=ModelConfig)
    """The task's network; its fields depend on ``task`` (config/models.py)."""
    diffusion: DiffusionConfig = field(default_factory=DiffusionConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    """Optional experiment trackers (W&B, MLflow); off unless set."""

    def to_dict(self) -> dict[str, Any]:
        return _to_plain(self)

    def model_key(self) -> dict[str, Any]:
        """The ``model`` section as the keys of compiled graphs and kernel caches hash it: without
        the fields its class keys as before (``KEYED_AS_BEFORE``) where they hold those values."""
        before: dict[str, Any] = getattr(type(self.model), "KEYED_AS_BEFORE", {})
        return {k: v for k, v in _to_plain(self.model).items() if k not in before or before[k] != v}

    def graph_parts(self, world_size: int) -> dict[str, Any]:
        """What of the config decides the compiled graph: the task, network, runtime settings,
        per-rank batch and micro-steps, and the world size."""
        runtime = {k: v for k, v in self.to_dict()["runtime"].items() if k not in RUNTIME_OUTSIDE_GRAPH}
        return {"task": self.task, "model": self.model_key(), "runtime": runtime,
                "batch_per_gpu": self.train.batch_per_gpu, "grad_accum": self.train.grad_accum,
                "world_size": world_size}

    def sizes_from_data(self) -> list[str]:
        """The network sizes the model section leaves to the data: its ``FOLLOW_DATA`` fields at 0."""
        return [name for name in self.model.FOLLOW_DATA if getattr(self.model, name) == 0]

    def kernels_built_for(self) -> str:
        """The data a whole build in this run's kernel folder must have been made for, beyond
        :meth:`graph_key`: the data source where a network size follows the data
        (:meth:`sizes_from_data`, e.g. image channels, which the key cannot tell), else empty (the
        config fixes every size). A run of other data trains eager beside the compile of its own step
        (``io/kernels.py``)."""
        return self.data.source if self.sizes_from_data() else ""

    def graph_key(self, world_size: int) -> str:
        """:meth:`graph_parts` as a short hash: runs that agree on it share one folder of compiled
        kernels. Torch and source versions are keyed by torch's caches themselves."""
        import hashlib
        import json

        text = json.dumps(self.graph_parts(world_size), sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def effective_batch(self, world_size: int) -> int:
        return self.train.batch_per_gpu * world_size * self.train.grad_accum


def _to_plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return {f.name: _to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple):
        return [_to_plain(v) for v in value]
    return value
