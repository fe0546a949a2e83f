"""ESTIMATED resource needs of a diffscale run, for plan's preflight checks and segments.

Nothing here is measured on your cluster. Numbers come from a walk over the UNet's
levels (parameters, multiply-accumulates, activation sizes) -- for other tasks' networks from
one forward pass of the network on the meta device (no memory, no data) --, from vendor peak
throughputs with an assumed utilisation, and for host memory from the one model in
``runtime/resources.py``. Every figure plan prints from this module is labelled
"estimated", except figures measured by ``diffscale bench`` and recorded in
``measured.yaml`` (with their card, date, command and docs/benchmarks.md section), which
win over the formulas and are labelled "measured".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from diffscale.cluster.planning import measured
from diffscale.config import ModelConfig, RunConfig
from diffscale.config.presets import get_preset
from diffscale.errors import UserError
from diffscale.runtime import resources

# --------------------------------------------------------------------------- tables

# Dense bf16/fp16 tensor-core peak TFLOP/s from NVIDIA's datasheets (no sparsity).
GPU_PEAK_TFLOPS: dict[str, float] = {
    "H200": 989.0,
    "H100": 989.0,
    "A100": 312.0,
    "L40S": 362.0,
    "A6000": 154.8,
    "A40": 149.7,
    "V100": 125.0,
}

# Assumed fraction of peak a small conv UNet reaches (estimated, not measured).
ASSUMED_GPU_UTILISATION = 0.25
# Assumed sustained GFLOP/s of one CPU core running conv training in fp32 (estimated).
ASSUMED_CPU_GFLOPS_PER_CORE = 20.0
# Data-parallel efficiency assumed when more than one rank trains (estimated).
ASSUMED_SCALING_EFFICIENCY = 0.9
# Shortest optimizer step assumed on a GPU, in seconds (estimated): a small network's step is
# bound by kernel launches and the host loop, not by FLOPs (the field-icon MLP: ~1 MFLOP a sample).
ASSUMED_MIN_GPU_STEP_S = 5e-4
# Start-up (imports, compile, data) and final sampling/checkpoint, per job (estimated).
STARTUP_S = 180

# CUDA context and allocator slack on the GPU, in GB (estimated).
GPU_CONTEXT_GB = 1.0
# Bytes per parameter held on the GPU: fp32 weights, grads, AdamW moments, EMA copy.
BYTES_PER_PARAM = 4 + 4 + 8 + 4


def gpu_key(gpu_type: str | None) -> str | None:
    """``"A100-80GB"`` -> ``"A100"``; None when the type is unknown or not in the table."""
    if not gpu_type:
        return None
    upper = gpu_type.upper().replace(" ", "")
    for key in sorted(GPU_PEAK_TFLOPS, key=len, reverse=True):
        if key in upper:
            return key
    return None


# --------------------------------------------------------------------------- model walk

@dataclass(frozen=True)
class ModelCost:
    params: int
    """Parameters (within ~15 % of diffusers' UNet2DModel for the presets)."""
    macs_per_sample: int
    """Multiply-accumulates of one forward pass of one sample."""
    activation_bytes_per_sample: int
    """Activations kept for backward per sample (bf16/fp16 autocast, estimated)."""


PRESET_NETWORK_COSTS: dict[str, ModelCost] = {
    "field-icon": ModelCost(params=975_232, macs_per_sample=967_552, activation_bytes_per_sample=26_150),
    "field-large": ModelCost(params=21_747_712, macs_per_sample=21_694_208, activation_bytes_per_sample=176_182),
    "policy": ModelCost(params=65_324_546, macs_per_sample=294_821_888, activation_bytes_per_sample=895_108),
    "policy-tiny": ModelCost(params=195_874, macs_per_sample=2_664_448, activation_bytes_per_sample=84_612),
}
"""``network_cost`` of each non-image preset's own network, so that planning one loads no torch
(tests/unit/cluster/test_cluster_plan.py counts each again)."""


def cost_of(cfg: RunConfig) -> ModelCost:
    """The cost of the run's network: the UNet walk for images, the stated cost of a preset's own
    network, else ``network_cost``."""
    if isinstance(cfg.model, ModelConfig):
        return model_cost(cfg.model)
    known = PRESET_NETWORK_COSTS.get(cfg.preset)
    if known is not None and cfg.model == get_preset(cfg.preset).model:
        return known
    return network_cost(cfg)


def network_cost(cfg: RunConfig) -> ModelCost:
    """Parameters, MACs and saved activations of any task's network, counted in one forward
    pass of one sample on the meta device (shapes only). Activations: every op's output that
    is not a view, 2 bytes an element as under bf16/fp16 autocast, like the UNet walk."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import FlopCounterMode

    from diffscale.tasks.registry import build_task

    class Outputs(TorchDispatchMode):
        elements = 0

        def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                               kwargs: dict[str, Any] | None = None) -> Any:
            out = func(*args, **(kwargs or {}))
            if not func.is_view:
                leaves = out if isinstance(out, (tuple, list)) else (out,)
                self.elements += sum(t.numel() for t in leaves if isinstance(t, torch.Tensor))
            return out

    meta = torch.device("meta")
    with meta:
        task = build_task(cfg, meta, load_data=False)
        network = task.build_network()
    flops, outputs = FlopCounterMode(display=False), Outputs()
    with flops, outputs, torch.no_grad():
        network(*task.example_inputs(1))
    return ModelCost(params=sum(p.numel() for p in network.parameters()), macs_per_sample=flops.get_total_flops() // 2,
                     activation_bytes_per_sample=outputs.elements * 2)


def with_data_sizes(cfg: RunConfig) -> tuple[RunConfig, str]:
    """``cfg`` with the network sizes its model section leaves to the data (0) filled in, so that
    the estimates can build its network, and a line saying where they came from: the data's own
    where it is readable here, else the preset's. ``cfg`` itself and '' where the network is built
    without them (an image run's channels)."""
    follow = cfg.sizes_from_data()
    if not follow or isinstance(cfg.model, ModelConfig):  # nothing to read (the UNet walk needs no channels)
        return cfg, ""
    import torch

    from diffscale.config import merge
    from diffscale.tasks.registry import build_task

    try:
        with torch.device("meta"):
            build_task(cfg, torch.device("meta"), load_data=False)
        return cfg, ""
    except UserError as unknown:
        names = " and ".join(f"model.{name}" for name in follow)
        try:  # read here as the job will read it: sizes of a policy's demonstrations, a field's arrays
            signature = build_task(cfg, torch.device("cpu")).signature()
            sizes = {name: int(signature[name]) for name in follow}
            how = f"read from {cfg.data.source} here"
        except UserError as unreadable:
            preset = get_preset(cfg.preset).model
            sizes = {name: int(getattr(preset, name, 0)) for name in follow}
            if not all(sizes.values()):
                raise UserError(f"{unknown.cause}, and {unreadable.cause}",
                                f"set {names} for the estimates, or plan where the data is readable") from unreadable
            how = (f"the data is not readable here ({unreadable.cause}): the estimates use preset {cfg.preset}'s "
                   "sizes, and the job reads the data's own")
    found = ", ".join(f"{name} {value}" for name, value in sizes.items())
    return merge(cfg, {"model": sizes}), f"{names} follow the data: {found}, {how}"


def model_cost(model: ModelConfig, channels: int = 3) -> ModelCost:
    """Walk the UNet levels as diffusers' UNet2DModel builds them (resnets, attention,
    down/up sampling, mid block) and add up parameters, MACs and saved activations."""
    widths = list(model.block_out_channels)
    layers = model.layers_per_block
    channels = model.channels or channels
    params = macs = act = 0
    temb = widths[0] * 4

    def resnet(cin: int, cout: int, side: int) -> None:
        nonlocal params, macs, act
        p = 9 * cin * cout + 9 * cout * cout + temb * cout + (cin * cout if cin != cout else 0)
        params += p
        macs += side * side * (9 * cin * cout + 9 * cout * cout + (cin * cout if cin != cout else 0))
        # inputs of norm/act/conv pairs, saved for backward, 2 bytes each
        act += side * side * (3 * cin + 5 * cout) * 2

    def attention(width: int, side: int) -> None:
        nonlocal params, macs, act
        params += 4 * width * width
        tokens = side * side
        macs += tokens * 4 * width * width + 2 * tokens * tokens * width
        act += tokens * width * 6 * 2

    side = model.sample_size
    params += 9 * channels * widths[0] + temb * widths[0] + temb * temb
    macs += side * side * 9 * channels * widths[0]
    skips = [widths[0]]
    cin = widths[0]
    for level, width in enumerate(widths):
        for _ in range(layers):
            resnet(cin, width, side)
            if model.attention[level]:
                attention(width, side)
            cin = width
            skips.append(width)
        if level < len(widths) - 1:
            params += 9 * width * width
            side //= 2
            macs += side * side * 9 * width * width
            skips.append(width)
    resnet(cin, cin, side)
    attention(cin, side)
    resnet(cin, cin, side)
    for level in reversed(range(len(widths))):
        width = widths[level]
        for _ in range(layers + 1):
            skip = skips.pop()
            resnet(cin + skip, width, side)
            if model.attention[level]:
                attention(width, side)
            cin = width
        if level > 0:
            side *= 2
            params += 9 * width * width
            macs += side * side * 9 * width * width
    params += 9 * widths[0] * channels
    macs += side * side * 9 * widths[0] * channels
    return ModelCost(params=int(params), macs_per_sample=int(macs), activation_bytes_per_sample=int(act))


# --------------------------------------------------------------------------- estimates

@dataclass(frozen=True)
class Estimate:
    value: float
    source: str
    """``measured`` (from measured.yaml) or ``estimated`` (formula)."""


def gpu_memory_gb(cfg: RunConfig, gpu_type: str | None, batch_per_gpu: int | None = None) -> Estimate:
    """Peak GPU memory of one rank."""
    batch = batch_per_gpu or cfg.train.batch_per_gpu
    figure = measured.load().peak_memory(cfg.preset, batch, gpu_key(gpu_type))
    if figure is not None:
        return Estimate(figure.reserved_gib * resources.GIB / 1e9, "measured")  # GiB as measured -> GB as compared
    cost = cost_of(cfg)
    total = BYTES_PER_PARAM * cost.params + batch * cost.activation_bytes_per_sample
    # 1.2: allocator fragmentation and temporaries (estimated)
    return Estimate(total * 1.2 / 1e9 + GPU_CONTEXT_GB, "estimated")


def max_batch_for_gpu(cfg: RunConfig, gpu_type: str | None, gpu_memory_gb_: float) -> int:
    """Largest per-GPU batch whose estimated peak fits in 90 % of the GPU's memory (0 if none)."""
    lo, hi = 0, cfg.train.batch_per_gpu
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if gpu_memory_gb(cfg, gpu_type, mid).value <= 0.9 * gpu_memory_gb_:
            lo = mid
        else:
            hi = mid - 1
    return lo


CPU_RANK_BASE_BYTES = int(0.4 * resources.GIB)
"""Host memory of a CPU rank besides its network and batch: Python, torch (no CUDA context) and
diffscale. With the network's term below a tiny rank estimates ~0.69 GB; measured 0.66 GB peak RSS
(2026-11-29, 2-core CPU machine, `/usr/bin/time -v diffscale train --preset tiny --set
runtime.device=cpu`), where the GPU ranks' 3 GiB base asked for 4 x too much."""


def cpu_rank_bytes(cfg: RunConfig) -> int:
    """Host memory of one CPU rank of ``cfg`` besides its data: the base, and what a GPU rank holds
    on its GPU (weights, EMA, gradients, optimizer state; the batch's activations, in fp32 on a CPU:
    twice the 16-bit count), with the same 1.2 for the allocator."""
    cost = cost_of(cfg)
    model = BYTES_PER_PARAM * cost.params + 2 * cfg.train.batch_per_gpu * cost.activation_bytes_per_sample
    return CPU_RANK_BASE_BYTES + int(1.2 * model)


def host_memory(ranks_per_node: int, data_bytes: int = 0, workers: int = 0,
                rank_bytes: int | None = None) -> resources.HostMemory:
    """Host memory of a node's ``diffscale train`` ranks (estimated). Each rank holds its base and
    the data it reads into memory (an npz file is loaded whole; resident data passes through host
    memory on its way to the device); a CPU rank's base is ``rank_bytes`` (:func:`cpu_rank_bytes`),
    a GPU rank's the model's default. A streamed run's ``workers`` per rank read the decoded
    cache's memory map: the page cache holds the data once, so a worker counts only its base."""
    return resources.host_memory(ranks_per_node, workers=workers, data_bytes=data_bytes,
                                 rank_bytes=None if rank_bytes is None else rank_bytes + data_bytes,
                                 worker_bytes=resources.WORKER_BASE_BYTES if workers else None)


HOST_MEMORY_HEADROOM = 1.25
"""Asked per node: the estimate and a quarter more (allocator growth, page cache of the data)."""


@dataclass(frozen=True)
class HostMemoryRequest:
    gib: int
    """Host memory to ask per node, in GiB (the unit of SLURM's --mem=NG)."""
    note: str
    """Where the figure comes from, for the plan."""


def host_memory_request(ranks_per_node: int, data_bytes: int, node_limit_gb: float | None,
                        workers: int = 0, rank_bytes: int | None = None) -> HostMemoryRequest:
    """What a node of ``diffscale train`` ranks asks for, and the plan's note saying how it was
    reached: the loader workers a streamed run starts, and per-process figures that are estimates
    (``rank_bytes``: a CPU rank's, from its preset)."""
    m = host_memory(ranks_per_node, data_bytes, workers, rank_bytes)
    gib = math.ceil(resources.gib(m.node_bytes) * HOST_MEMORY_HEADROOM)
    capped = False
    if node_limit_gb is not None and gib > node_limit_gb:
        gib, capped = int(node_limit_gb), True
    cap = f", capped at the node's {node_limit_gb:g} GiB" if capped else ""
    per_rank = resources.gib(resources.RANK_BASE_BYTES if rank_bytes is None else rank_bytes)
    counted = (f"{workers} loader workers per rank counted (the streaming path; they read the decoded cache's "
               "memory map, held once in the page cache)" if workers else
               "no data-loader workers counted (the data stays on the device: none start)")
    where = "runtime/resources.py" if rank_bytes is None else "a CPU rank of its preset, cluster/planning/estimates.py"
    note = (f"host memory {gib} GiB per node: {m.describe()}, plus a quarter for headroom{cap}; {counted}; the "
            f"~{per_rank:.{0 if rank_bytes is None else 1}f} GiB per rank is an estimate, not a measured RSS ({where})")
    return HostMemoryRequest(gib, note)


def samples_per_s_per_rank(cfg: RunConfig, gpu_type: str | None, cpus_per_rank: int, has_gpus: bool) -> Estimate:
    key = gpu_key(gpu_type)
    figure = measured.load().samples_per_s(cfg.preset, key)
    if figure is not None:
        return Estimate(figure.samples_per_s, "measured")
    flops = 6 * cost_of(cfg).macs_per_sample  # forward + backward = 3 x 2 FLOPs per MAC
    if has_gpus:
        peak = GPU_PEAK_TFLOPS.get(key or "", 100.0) * 1e12 * ASSUMED_GPU_UTILISATION
        per_step = cfg.train.batch_per_gpu * cfg.train.grad_accum
        return Estimate(min(peak / max(flops, 1), per_step / ASSUMED_MIN_GPU_STEP_S), "estimated")
    peak = cpus_per_rank * ASSUMED_CPU_GFLOPS_PER_CORE * 1e9
    return Estimate(peak / max(flops, 1), "estimated")


def train_seconds(cfg: RunConfig, world_size: int, per_rank: float) -> int:
    """Wall seconds to train cfg.train.steps optimizer steps on ``world_size`` ranks."""
    samples = cfg.train.steps * cfg.train.batch_per_gpu * cfg.train.grad_accum * world_size
    efficiency = ASSUMED_SCALING_EFFICIENCY if world_size > 1 else 1.0
    return int(math.ceil(samples / (per_rank * world_size * efficiency))) + STARTUP_S


def first_checkpoint_s(cfg: RunConfig, estimate_s: int) -> tuple[int, float]:
    """(seconds from a job's start to its first checkpoint, seconds per optimizer step), from a
    run's training estimate: start-up, then ``checkpoint_every`` steps (or the whole run, if
    shorter). A job limited to less never saves its work."""
    steps = max(cfg.train.steps, 1)
    step_s = max(estimate_s - STARTUP_S, 0) / steps
    return STARTUP_S + int(math.ceil(min(cfg.train.checkpoint_every, steps) * step_s)), step_s
