"""Device and precision policy: one code path for CPU, MPS, one GPU and many."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from diffscale.config import Attention, Device, Precision, Recipe, RuntimeConfig, Toggle
from diffscale.errors import UserError
from diffscale.runtime.generated_code import keep_generated_bytecode
from diffscale.runtime.resources import host_memory_bytes

FLEX_AUTO_MIN_ROWS = 8192
"""``runtime.attention: auto`` uses FlexAttention for calls of at least this many (batch x heads)
rows: small's calls (16,384 and 32,768 rows of 8-channel heads) trained faster a step than with
cuDNN's kernel; xl's (2,048 rows) ran slower in the kernel benchmark (``python -m
benchmarks.attention``; docs/benchmarks.md, "Attention kernels")."""


@dataclass(frozen=True)
class DevicePolicy:
    """What the hardware offers and how the run will use it."""

    device: torch.device
    name: str
    memory_bytes: int
    precision: Precision
    """Resolved precision (never ``auto``)."""
    use_grad_scaler: bool
    compile: bool
    channels_last: bool
    attention: Attention = Attention.AUTO
    layout_opt: bool = False
    """Force inductor's channels-last layout optimisation in compiled graphs."""
    flex_min_rows: int | None = None
    """FlexAttention for attention calls of at least this many (batch x heads) rows; None: never."""
    cudnn_benchmark: bool = False
    """cuDNN times its convolution algorithms at each new shape's first call and keeps the fastest."""
    generated_bytecode: bool = False
    """Compiled code's generated Python loaded with kept bytecode (``runtime.generated_bytecode``)."""

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        return {Precision.BF16: torch.bfloat16, Precision.FP16: torch.float16}.get(self.precision)

    def autocast(self) -> contextlib.AbstractContextManager:
        dtype = self.autocast_dtype
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=dtype)


def _cuda_available() -> bool:
    return torch.cuda.is_available()


def mps_gap(exc: NotImplementedError, device: torch.device) -> UserError | None:
    """The message for an operation Apple's MPS backend lacks (torch raises NotImplementedError
    when its CPU fallback is off), or None for any other error."""
    if device.type != "mps" or "MPS" not in str(exc):
        return None
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return UserError(f"an operation this run needs is not implemented on Apple MPS ({first[:200]})",
                     "let it run on the CPU: export PYTORCH_ENABLE_MPS_FALLBACK=1 before Python starts "
                     "(diffscale sets it when it is imported before torch), or use --device cpu")


def _mps_available() -> bool:
    return bool(getattr(torch.backends, "mps", None)) and torch.backends.mps.is_available()


def pick_device(requested: Device, local_rank: int = 0) -> torch.device:
    """CUDA, then MPS, then CPU; a rank's GPU is its local rank among the visible ones.

    CUDA_VISIBLE_DEVICES set by a scheduler is respected, never overwritten: the local
    rank indexes the GPUs it left visible.
    """
    if requested == Device.CUDA or (requested == Device.AUTO and _cuda_available()):
        if not _cuda_available():
            raise UserError("runtime.device is cuda but no CUDA GPU is visible",
                            "use --device auto (or cpu), or run on a GPU node")
        count = torch.cuda.device_count()
        if count == 1 and local_rank > 0:
            # One GPU per task (SLURM --gpus-per-task / a scheduler's binding): it is index 0.
            return torch.device("cuda", 0)
        if local_rank >= count:
            raise UserError(
                f"local rank {local_rank} has no GPU: only {count} visible (CUDA_VISIBLE_DEVICES="
                f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})",
                "start one process per GPU (tasks per node = GPUs per node)",
            )
        return torch.device("cuda", local_rank)
    if requested == Device.MPS or (requested == Device.AUTO and _mps_available()):
        if not _mps_available():
            raise UserError("runtime.device is mps but this PyTorch has no MPS backend",
                            "use --device auto (or cpu) on this machine")
        return torch.device("mps")
    return torch.device("cpu")


def resolve_policy(cfg: RuntimeConfig, device: torch.device) -> DevicePolicy:
    """Turn the ``auto`` settings into concrete ones for this device."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        name, memory = props.name, int(props.total_memory)
        bf16_ok = torch.cuda.is_bf16_supported()
        capability = (props.major, props.minor)
    elif device.type == "mps":
        name, memory, bf16_ok, capability = "Apple MPS", 0, False, (0, 0)
    else:
        name, memory, bf16_ok, capability = "CPU", host_memory_bytes(), False, (0, 0)

    precision = cfg.precision
    plain = cfg.recipe == Recipe.PLAIN
    if precision == Precision.AUTO:
        if device.type == "cuda":
            precision = Precision.FP16 if plain or not bf16_ok else Precision.BF16
        else:
            precision = Precision.FP32
    if precision == Precision.BF16 and device.type == "cuda" and not bf16_ok:
        raise UserError(f"runtime.precision bf16 is not supported on {name}", "use --precision fp16 or auto")
    if precision == Precision.FP16 and device.type != "cuda":
        raise UserError(f"runtime.precision fp16 needs a CUDA GPU (this run is on {device.type})",
                        "use --precision auto or fp32")

    fast_cuda = device.type == "cuda" and not plain
    compile_on = _toggle(cfg.compile, fast_cuda)
    # channels_last helps cuDNN in eager mode. Compiled, NCHW inputs with inductor's layout
    # optimisation (below) trained fastest: channels_last inputs add strided copies and slower
    # GroupNorm kernels (docs/benchmarks.md, "Defaults and why" and "Where a step's time goes").
    channels_last = _toggle(cfg.channels_last, fast_cuda and not compile_on)
    # Compiled, the layout is better left to inductor, forced on: its heuristic skips UNets
    # (convolutions with twice as many input as output channels after each skip concat), yet
    # forced it trained small and medium faster (docs/decisions.md, "Inductor's layout optimisation").
    layout_opt = compile_on and _toggle(cfg.layout_opt, device.type == "cuda")
    if cfg.attention == Attention.FLEX and not (device.type == "cuda" and compile_on):
        where = "not compiled" if device.type == "cuda" else f"on {device.type}"
        raise UserError(f"runtime.attention flex needs a compiled run on a CUDA GPU (this run is {where}): "
                        "FlexAttention is a kernel torch.compile generates",
                        "use --set runtime.attention=auto, or runtime.compile=on on a GPU")
    flex_min_rows = None
    if cfg.attention == Attention.FLEX:
        flex_min_rows = 0
    elif cfg.attention == Attention.AUTO and compile_on and device.type == "cuda" and capability >= (8, 0):
        flex_min_rows = FLEX_AUTO_MIN_ROWS
    return DevicePolicy(
        device=device,
        name=name,
        memory_bytes=memory,
        precision=precision,
        use_grad_scaler=precision == Precision.FP16,
        compile=compile_on,
        channels_last=channels_last,
        attention=cfg.attention,
        layout_opt=layout_opt,
        flex_min_rows=flex_min_rows,
        cudnn_benchmark=_toggle(cfg.cudnn_benchmark, device.type == "cuda"),
        generated_bytecode=compile_on and _toggle(cfg.generated_bytecode, True),
    )


def inference_policy(cfg: RuntimeConfig, device: torch.device) -> DevicePolicy:
    """``resolve_policy`` for sampling. Forward-only compiled sampling keeps channels_last
    under ``auto``: the DDIM speed-ups (docs/benchmarks.md, "Sampling speed") were measured that way, while the
    NCHW training default was measured on training steps only."""
    policy = resolve_policy(cfg, device)
    if cfg.channels_last == Toggle.AUTO and policy.compile and device.type == "cuda":
        policy = dataclasses.replace(policy, channels_last=True)
    if cfg.layout_opt == Toggle.AUTO:  # measured on training only; sampling keeps inductor's choice
        policy = dataclasses.replace(policy, layout_opt=False)
    if cfg.attention == Attention.AUTO:  # FlexAttention was measured on training steps only
        policy = dataclasses.replace(policy, flex_min_rows=None)
    return policy


def configure_backends(policy: DevicePolicy) -> None:
    """Process-wide settings that are safe for training (TF32, cuDNN's algorithm search where
    ``runtime.cudnn_benchmark`` keeps it, no denormals; compiled code's bytecode kept where
    ``runtime.generated_bytecode`` keeps it)."""
    if policy.device.type == "cpu":
        # Denormal floats (tiny weights/gradients late in training) slow CPU kernels many times over
        # (docs/benchmarks.md, "CPU demo"); flushing them to zero costs nothing visible.
        torch.set_flush_denormal(True)
    if policy.generated_bytecode:
        keep_generated_bytecode()
    if policy.device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = policy.cudnn_benchmark
        if policy.attention not in (Attention.AUTO, Attention.SDPA, Attention.FLEX):  # flex: runtime/flex_attention.py
            # Process-wide: only the chosen scaled-dot-product-attention kernel stays enabled.
            chosen = policy.attention
            torch.backends.cuda.enable_flash_sdp(chosen == Attention.FLASH)
            torch.backends.cuda.enable_mem_efficient_sdp(chosen == Attention.EFFICIENT)
            torch.backends.cuda.enable_cudnn_sdp(chosen == Attention.CUDNN)
            torch.backends.cuda.enable_math_sdp(chosen == Attention.MATH)
            # Compiled code for one kernel must not serve another: inductor's cache key leaves
            # the kernel flags out (a warm cache from an `auto` run kept cuDNN under `math`).
            # (kept beside a tag of the user's own, TORCH_COMPILE_CACHE_KEY_TAG)
            tags = [t for t in torch.compiler.config.cache_key_tag.split("|") if t and not t.startswith("sdpa=")]
            torch.compiler.config.cache_key_tag = "|".join(tags + [f"sdpa={chosen.value}"])


@contextlib.contextmanager
def cudnn_search(on: bool) -> Iterator[None]:
    """``torch.backends.cudnn.benchmark`` set to ``on`` in the block (process-wide), as it was after:
    the eager steps of a run that trains while compiling, under ``runtime.cudnn_benchmark_eager``."""
    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = on
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = before


def _toggle(value: Toggle, auto: bool) -> bool:
    return auto if value == Toggle.AUTO else value == Toggle.ON


@functools.cache
def recording_stream(device: torch.device) -> torch.cuda.Stream:
    """The one side stream on ``device`` that CUDA-graph recordings of whole steps use, for
    their eager warm-up steps and the recording itself, and that DDP is built on when they
    record it: autograd runs a parameter's gradient accumulation on the stream it was created
    on, and one that is not the recording's cannot be waited on while recording."""
    return torch.cuda.Stream(device)


@contextlib.contextmanager
def on_side_stream(side: torch.cuda.Stream) -> Iterator[None]:
    """Run the block on ``side``, after the work queued on the current stream, and have the
    current stream wait for it: set-up before a CUDA-graph recording runs off the stream that
    recording and replays use, as recording requires."""
    current = torch.cuda.current_stream(side.device)
    side.wait_stream(current)
    with torch.cuda.stream(side):
        yield
    current.wait_stream(side)


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op off CUDA), before reading a clock."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    if device.type == "mps":
        return int(torch.mps.current_allocated_memory())
    try:
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
    except Exception:
        return 0
