"""The choices of the run configuration's fields, as enums (a field holds one of them; YAML and
``--set`` give their values)."""

from __future__ import annotations

import enum


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
