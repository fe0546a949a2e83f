"""The typed run configuration: enums and keyword-only dataclasses, one per section.

Every field has a doc comment; ``__post_init__`` validation names the field
(``train.batch_per_gpu``) and the fix."""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any

import yaml

from diffscale.config.errors import fail as _fail
from diffscale.config.models import ModelConfig, TaskModelConfig
from diffscale.config.trackers import LoggingConfig


class Device(str, enum.Enum):
    """Where the run executes. ``auto`` picks CUDA, then MPS, then CPU."""

    AUTO = "auto"
    CPU = "cpu"
    CUDA = "cuda"
    MPS = "mps"


class Precision(str, enum.Enum):
    """Numeric precision of the forward/backward pass.

    ``auto``: bf16 autocast on GPUs that support it, fp16 + GradScaler on older CUDA
    GPUs, fp32 on CPU and MPS.
    """

    AUTO = "auto"
    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"


class Recipe(str, enum.Enum):
    """Training recipe. ``fast``: every speed lever this tool has (default).
    ``plain``: the common recipe users copy (fp16 autocast + GradScaler, fp32 AdamW,
    a CPU DataLoader with 4 workers, default DDP), kept for side-by-side benchmarks."""

    FAST = "fast"
    PLAIN = "plain"


class Toggle(str, enum.Enum):
    """A feature switch whose ``auto`` lets the runtime decide per device."""

    AUTO = "auto"
    ON = "on"
    OFF = "off"


class CompileMode(str, enum.Enum):
    """``torch.compile`` mode. ``reduce-overhead`` replays the compiled forward and backward
    as CUDA graphs (no per-kernel launch cost; docs/decisions.md, "CUDA graphs for training");
    ``auto`` picks it wherever it can replay a step (CUDA, ``train.grad_accum`` 1), else
    ``default``. ``max-autotune-no-cudagraphs`` also benchmarks Triton matmul/conv templates
    (longer first compile, cached in the run folder)."""

    AUTO = "auto"
    DEFAULT = "default"
    MAX_AUTOTUNE = "max-autotune-no-cudagraphs"
    REDUCE_OVERHEAD = "reduce-overhead"


class Attention(str, enum.Enum):
    """Attention kernel on CUDA: ``auto`` is FlexAttention where it measured faster (compiled
    training, many narrow heads) and PyTorch's SDPA choice elsewhere; ``sdpa`` is always PyTorch's
    choice; ``flex`` always FlexAttention (compiled on CUDA only); the rest force one SDPA kernel."""

    AUTO = "auto"
    SDPA = "sdpa"
    FLASH = "flash"
    EFFICIENT = "efficient"
    CUDNN = "cudnn"
    MATH = "math"
    FLEX = "flex"


class BetaSchedule(str, enum.Enum):
    """Noise schedule, as named by diffusers' schedulers."""

    LINEAR = "linear"
    SCALED_LINEAR = "scaled_linear"
    COSINE = "squaredcos_cap_v2"


class TimestepSpacing(str, enum.Enum):
    """Which trained timesteps a sampler of fewer steps visits, as diffusers' schedulers name it."""

    LEADING = "leading"
    TRAILING = "trailing"


class Prediction(str, enum.Enum):
    """What the network predicts: the noise, the velocity or the clean sample."""

    EPSILON = "epsilon"
    V_PREDICTION = "v_prediction"
    SAMPLE = "sample"


class LossWeighting(str, enum.Enum):
    """How each timestep's squared error is weighted in the training loss."""

    NONE = "none"
    MIN_SNR = "min-snr"


class LrSchedule(str, enum.Enum):
    """Learning rate after warm-up: constant or cosine decay to 10 %."""

    CONSTANT = "constant"
    COSINE = "cosine"


class SamplerName(str, enum.Enum):
    """A reverse process (diffusion/sampler.py): DDIM, DPM-Solver++ or ancestral DDPM."""

    DDIM = "ddim"
    DPMSOLVER = "dpmsolver"
    DDPM = "ddpm"


class LrScaling(str, enum.Enum):
    """How the learning rate follows the effective batch (relative to ``optim.base_batch``)."""

    NONE = "none"
    LINEAR = "linear"
    SQRT = "sqrt"




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
    """Training target: ``epsilon`` (the noise), ``v_prediction`` or ``sample``. The image presets but
    xl train ``v_prediction``, which reached a given quality sooner (docs/benchmarks.md, "Time to
    quality (images)")."""
    loss_weighting: LossWeighting = LossWeighting.NONE
    """``none``: every timestep's error counts alike (the common recipe). ``min-snr``: Min-SNR-gamma
    weighting (Hang et al. 2023, as diffusers' training examples apply it): each sample's error
    weighted by min(SNR_t, gamma) / SNR_t for epsilon prediction (/(SNR_t + 1) for v-prediction,
    min(SNR_t, gamma) for sample prediction), so low-noise timesteps stop dominating the loss. Off
    by default: it sped up noise prediction's time to quality but not v-prediction's, which tiny,
    small, medium and large train (docs/benchmarks.md, "Time to quality (images)")."""
    min_snr_gamma: float = 5.0
    """gamma of ``loss_weighting: min-snr`` (the paper's and diffusers' 5)."""
    clip_sample: bool = True
    """Clip each sampling step's clean-sample estimate to [-1, 1] (data scaled to that range:
    images, min/max-normalised actions); off for standardised data such as fields."""
    timestep_spacing: TimestepSpacing = TimestepSpacing.LEADING
    """Which trained timesteps DDIM and strided DDPM sampling visit. ``leading`` (diffusers'
    default) starts N steps at timestep (N-1) x (T // N), ``trailing`` at the last one, T-1, for
    every N: with few trained timesteps leading starts far from pure noise (20 of 50 start at 38)
    and loses quality, so the field presets use trailing (docs/measurements/2026-11-27.md, "Each CPU preset
    trained to its full step count"). DPM-Solver++ starts at T-1 either way."""

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
    """Consecutive non-finite losses tolerated (steps skipped) before rolling back to the last checkpoint."""

    def __post_init__(self) -> None:
        for name in ("steps", "batch_per_gpu", "grad_accum", "log_every", "checkpoint_every", "keep_checkpoints",
                     "sample_count", "sample_steps", "eval_count", "max_nonfinite_steps"):
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

    def sampling(self, sampler: str | None, steps: int | None, *,
                 task_sampler: str | None = None) -> tuple[str, int]:
        """The sampler and step count asked for, each defaulting to the run's own choice: the
        sampler ``task_sampler`` where the task names one for what it runs (a policy's
        evaluation: ``Task.evaluation_sampler``), else ``sample_sampler``; the steps
        ``sample_steps`` (what the run's previews and evaluations used)."""
        return sampler or task_sampler or self.sample_sampler.value, steps or self.sample_steps


RUNTIME_OUTSIDE_GRAPH = frozenset({"cudnn_benchmark", "compile_cache", "generated_bytecode"})
"""Runtime settings that leave the compiled graph as it is (runs that differ only there share kernels)."""


@dataclass(kw_only=True)
class RuntimeConfig:
    """Hardware and distributed settings; the same config runs on every device."""

    device: Device = Device.AUTO
    """Device; ``auto`` picks CUDA, then MPS, then CPU."""
    precision: Precision = Precision.AUTO
    """Forward/backward precision."""
    recipe: Recipe = Recipe.FAST
    """``fast`` (default) or ``plain`` (the common recipe, for benchmarks)."""
    compile: Toggle = Toggle.AUTO
    """torch.compile the network (``auto``: on CUDA only)."""
    compile_mode: CompileMode = CompileMode.AUTO
    """torch.compile mode when compiling: ``auto`` (CUDA graphs where a step can replay as one,
    see docs/benchmarks.md, "Defaults and why"), ``default``, ``reduce-overhead`` or ``max-autotune-no-cudagraphs``."""
    channels_last: Toggle = Toggle.AUTO
    """channels_last memory format (``auto``: on CUDA when not compiled; see docs/benchmarks.md, "Defaults and why")."""
    layout_opt: Toggle = Toggle.AUTO
    """Inductor's layout optimisation when compiled: convolutions run channels_last inside the
    graph, with no layout copies between them (``auto``: on for training on CUDA, where it was
    measured; inductor's own heuristic leaves it off for UNets)."""
    kernel_tuning: Toggle = Toggle.OFF
    """Inductor's coordinate-descent tuning of each Triton kernel's launch settings when compiled
    (training and sampling): a little faster, for a much longer first compile (cached after); off
    by default for that (docs/decisions.md, "Coordinate-descent kernel tuning")."""
    cudnn_benchmark: Toggle = Toggle.AUTO
    """cuDNN times every algorithm for each convolution shape at its first call and keeps the
    fastest (``torch.backends.cudnn.benchmark``): steadier steps for a longer first step of every
    job, resumed ones too (``auto``: on CUDA; no effect elsewhere). Not part of the compiled graph."""
    compile_cache: Toggle = Toggle.AUTO
    """Keep dynamo's traced network with the compiled kernels (the kernel folder's dynamo/, torch's
    caching precompile), so a resumed job or a new run of the same network installs it instead of
    tracing the network again. Written once, after the first step; one process only (a
    distributed run traces as before); an entry for another config or torch is discarded.
    ``auto``: on for compiled training on CUDA, where it held in every round on one H100 (torch 2.11,
    2026-11-28): small's resumed jobs started in 16.4-22.0 s instead of 30-37 s, medium's in 23.5 s
    instead of 53.5 s, at the same steady speed (docs/measurements/2026-11-28.md, "The traced network cached
    too"); ``on`` also where it was not measured (the CPU). An entry that cannot be installed is
    discarded and its traceback kept in the kernel folder's ``traced-network-discarded.txt``; a job
    that traces although an entry was installed names the failed guard in a warning and in
    ``traced-network-retraced.txt``. Not part of the compiled graph."""
    generated_bytecode: Toggle = Toggle.AUTO
    """Load the Python that torch's compiler generates (the code running each compiled graph, its
    kernels' modules) through Python's bytecode cache: the first job writes the bytecode beside
    the kernels, later jobs read it instead of compiling that source again, which torch does in
    every process (``runtime/generated_code.py``): 0.42-0.44 s -> 0.23-0.34 s of a resumed small or
    medium job's start on a 2 x H200 host (docs/measurements/2026-11-28.md, "The generated code's bytecode kept").
    ``auto``: on wherever the run compiles; ``off``: torch's own loader. Not part of the compiled graph."""
    step_graph: Toggle = Toggle.AUTO
    """CUDA: each optimizer step (forward, backward, clipping, fused AdamW, EMA) recorded once as
    one CUDA graph and replayed, so a small network's step is not bound by kernel launches.
    Needs one process or NCCL between processes (DDP's all-reduces are recorded too), ``train.grad_accum``
    1, the fast recipe and no fp16 loss scaling. ``auto``: on where that holds and the task was measured
    faster with it: fields on one GPU, policies under DDP (docs/benchmarks.md, "Field diffusion",
    "Diffusion policy")."""
    sampling_graph: Toggle = Toggle.AUTO
    """DDIM sampling on CUDA: the whole denoising loop (every network call and scheduler update)
    recorded once per batch shape as one CUDA graph and replayed per call, so a small network's
    sampling is not bound by kernel launches. ``auto``: on where sampling compiles on CUDA;
    ``off``: one graph per network call, the loop in Python (docs/measurements/2026-11-26.md, "Sampling latency")."""
    attention: Attention = Attention.AUTO
    """Attention kernel on CUDA. ``auto``: FlexAttention for compiled training where a call has many
    (batch x heads) rows of narrow heads, where it measured faster (docs/benchmarks.md, "Attention kernels"), else
    ``sdpa`` (PyTorch picks a kernel per call); ``flex``: FlexAttention always (compiled CUDA only);
    ``flash``, ``efficient``, ``cudnn``, ``math``: that SDPA kernel only."""
    cpu_threads: int = 0
    """Threads of a CPU rank's operations (``torch.set_num_threads``). ``0`` (auto): the CPUs this
    rank may use less those other processes keep busy now (their busy share over 0.2 s; other
    cores do not count), at least 1, unless ``OMP_NUM_THREADS`` is set; a thread per core on a
    machine whose cores are taken makes the threads wait for each other
    (docs/measurements/2026-11-27.md, "CPU training beside busy processes")."""
    join_timeout_s: float = 300.0
    """Seconds to wait for all ranks to join before failing with a diagnosis."""
    collective_timeout_s: float = 1800.0
    """Timeout of each collective (NCCL/gloo) after start-up."""
    ddp_bucket_mb: int = 100
    """DDP gradient bucket size in MiB (the fast recipe; the plain one uses DDP's default 25)."""
    ddp_graph_split: Toggle = Toggle.AUTO
    """Compiled DDP: split the graph at gradient buckets so each bucket's all-reduce overlaps the
    rest of the backward pass (dynamo's DDPOptimizer). ``auto``: on where each step is recorded
    as one CUDA graph (``runtime.step_graph``), else off: with eager steps every split boundary's
    layout copies and lost fusion cost more than NVLink all-reduces take."""
    ddp_bf16_compress: Toggle = Toggle.AUTO
    """Compress gradients to bf16 for the all-reduce (NCCL only). ``auto``: off, which scaled
    better on NVLink for every preset (docs/decisions.md, "bf16 gradient compression"); ``on`` halves the bytes moved,
    for slow links between nodes."""

    def __post_init__(self) -> None:
        if isinstance(self.cpu_threads, bool) or not isinstance(self.cpu_threads, int) \
                or not 0 <= self.cpu_threads <= 4096:
            _fail("runtime.cpu_threads", f"{self.cpu_threads!r} is not a whole number from 0 to 4096",
                  "use 0 (auto: the free cores) or the number of threads, e.g. 2")
        if self.join_timeout_s <= 0:
            _fail("runtime.join_timeout_s", "must be positive", "use e.g. 300")
        if self.collective_timeout_s <= 0:
            _fail("runtime.collective_timeout_s", "must be positive", "use e.g. 1800")
        if self.ddp_bucket_mb < 1:
            _fail("runtime.ddp_bucket_mb", "must be at least 1", "use e.g. 25 or 100")


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
