"""The training engine: the state of a run and one optimizer step over it.

``Trainer`` holds the network, its EMA, the optimizer and scaler, and turns them into
checkpoints and back; ``StepRunner`` runs one step (global batch draw -> accumulate this
rank's rows -> clip -> fused AdamW -> EMA) without host synchronisation;
``prepare_model`` applies DDP and torch.compile from the outside of the single-device
network. ``train`` (the loop) and ``bench`` (the measurements) both drive it.
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from .config import CompileMode, LrSchedule, LrScaling, Recipe, RunConfig, RuntimeConfig, Toggle
from .data.device_loader import DataPosition, DeviceBatcher, micro_slice
from .errors import UserError
from .runtime import checkpoint as ckpt
from .runtime.device import DevicePolicy, configure_backends, inference_policy
from .runtime.distributed import DistContext
from .runtime.flex_attention import use_flex_attention
from .tasks import build_task


def step_seed(seed: int, step: int) -> int:
    """Seed of every random draw of one optimizer step (noise, timesteps, augmentation)."""
    return (seed * 1_000_003 + step * 7_919 + 12_345) % (2**63 - 1)


def learning_rate(cfg: RunConfig, step: int, effective_batch: int, backoff: float = 1.0) -> float:
    o = cfg.optim
    scale = {LrScaling.NONE: 1.0, LrScaling.LINEAR: effective_batch / o.base_batch,
             LrScaling.SQRT: math.sqrt(effective_batch / o.base_batch)}[o.lr_scaling]
    peak = o.lr * scale * backoff
    if o.warmup_steps and step < o.warmup_steps:
        return peak * (step + 1) / o.warmup_steps
    if o.schedule == LrSchedule.COSINE:
        progress = (step - o.warmup_steps) / max(1, cfg.train.steps - o.warmup_steps)
        return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))
    return peak


def _rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    state = {"torch_cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["torch_cuda"] = torch.cuda.get_rng_state(device)
    return state


def _restore_rng(rng: dict[str, torch.Tensor], device: torch.device) -> None:
    if "torch_cpu" in rng:
        torch.set_rng_state(rng["torch_cpu"])
    if device.type == "cuda" and "torch_cuda" in rng:
        torch.cuda.set_rng_state(rng["torch_cuda"], device)


class Trainer:
    """State of one training invocation (kept in one place so a rollback can restore it)."""

    def __init__(self, cfg: RunConfig, run_dir: Path, ctx: DistContext, policy: DevicePolicy, console: Console) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        self.ctx = ctx
        self.policy = policy
        self.console = console
        self.device = policy.device
        self.task = build_task(cfg, self.device)
        torch.manual_seed(cfg.train.seed)  # identical initial weights on every rank
        self.net = self.task.build_network().to(self.device)
        if policy.channels_last:
            self.net = self.net.to(memory_format=torch.channels_last)
        self.ema = copy.deepcopy(self.net).requires_grad_(False).eval()
        if policy.flex_min_rows is not None:  # training's kernel; the EMA samples as inference_policy says
            use_flex_attention(self.net, policy.flex_min_rows)
        self.params = [p for p in self.net.parameters() if p.requires_grad]
        self.ema_params = list(self.ema.parameters())
        fused = cfg.runtime.recipe == Recipe.FAST and self.device.type in ("cuda", "cpu")
        self.fused = fused
        self.opt = torch.optim.AdamW(self.params, lr=cfg.optim.lr, betas=(cfg.optim.beta1, cfg.optim.beta2),
                                     weight_decay=cfg.optim.weight_decay, fused=fused or None)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=policy.use_grad_scaler)
        self.step = 0
        self.position = DataPosition()
        self.lr_backoff = 1.0
        self.rollbacks = 0
        self.nonfinite_total = 0

    # -- state -----------------------------------------------------------------------------
    def restore(self, state: ckpt.TrainingState) -> None:
        self.net.load_state_dict(state.model)
        self.ema.load_state_dict(state.ema)
        self.opt.load_state_dict(state.optimizer)
        if state.meta.get("scaler") and self.scaler.is_enabled():
            self.scaler.load_state_dict(state.meta["scaler"])
        self.step = state.step
        self.position = DataPosition(**state.meta.get("data_position", {}))
        self.lr_backoff = float(state.meta.get("lr_backoff", 1.0))
        self.rollbacks = int(state.meta.get("rollbacks", 0))
        self.nonfinite_total = int(state.meta.get("nonfinite_total", 0))
        _restore_rng(state.rng, self.device)

    def snapshot(self, batcher: DeviceBatcher) -> ckpt.TrainingState:
        return ckpt.TrainingState(
            step=self.step,
            model=self.net.state_dict(),
            ema=self.ema.state_dict(),
            optimizer=self.opt.state_dict(),
            meta={
                "data_position": batcher.position.to_dict(),
                "scaler": self.scaler.state_dict() if self.scaler.is_enabled() else None,
                "signature": self.task.signature(),
                "config": self.cfg.to_dict(),
                "world_size": self.ctx.world_size,
                "effective_batch": self.cfg.effective_batch(self.ctx.world_size),
                "lr_backoff": self.lr_backoff,
                "rollbacks": self.rollbacks,
                "nonfinite_total": self.nonfinite_total,
                "saved_at": time.time(),
            },
            rng=_rng_state(self.device),
        )

    def make_batcher(self) -> DeviceBatcher:
        """The index stream of this run's effective batch, from the current data position."""
        return DeviceBatcher(self.task.num_items(), self.cfg.effective_batch(self.ctx.world_size), self.cfg.train.seed,
                             self.device, self.position)

    def save(self, batcher: DeviceBatcher) -> None:
        if self.ctx.is_main:
            ckpt.save_checkpoint(self.run_dir, self.snapshot(batcher), keep=self.cfg.train.keep_checkpoints)
        self.ctx.barrier()  # every rank leaves with the checkpoint on disk


class StepRunner:
    """One optimizer step: draw the global batch, accumulate this rank's rows, clip, update, EMA.

    Shared by ``train`` and ``bench``. Nothing here synchronises with the host: loss,
    gradient norm and non-finite counters stay on the device until the caller reads them.
    """

    def __init__(self, trainer: Trainer, model: torch.nn.Module, batcher: DeviceBatcher) -> None:
        self.trainer = trainer
        self.model = model
        self.batcher = batcher
        device = trainer.device
        self.generator = torch.Generator(device=device)
        self.loss_sum = torch.zeros((), device=device)
        self.norm_sum = torch.zeros((), device=device)
        self.bad_run = torch.zeros((), device=device)  # consecutive non-finite steps
        self.bad_total = torch.zeros((), device=device)
        cfg = trainer.cfg
        self.clip = cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else float("inf")
        self.effective = cfg.effective_batch(trainer.ctx.world_size)
        self.graphs = trains_in_cuda_graphs(cfg, trainer.policy)

    def step(self) -> float:
        """Run one optimizer step; returns its learning rate."""
        tr, t = self.trainer, self.trainer.cfg.train
        ctx, policy = tr.ctx, tr.policy
        lr = learning_rate(tr.cfg, tr.step, self.effective, tr.lr_backoff)
        for group in tr.opt.param_groups:
            group["lr"] = lr
        self.generator.manual_seed(step_seed(t.seed, tr.step))
        batch = tr.task.draw(self.batcher.next_indices(), self.generator)
        if self.graphs:  # a new step: the last step's graph outputs (loss, gradients) are consumed
            torch.compiler.cudagraph_mark_step_begin()
        for micro in range(t.grad_accum):
            rows = micro_slice(micro, ctx.rank, ctx.world_size, t.batch_per_gpu)
            inner = ctx.distributed and micro < t.grad_accum - 1
            sync = self.model.no_sync() if inner else contextlib.nullcontext()  # no all-reduce on inner steps
            with sync:
                with policy.autocast():
                    loss = tr.task.loss(self.model, batch, rows, channels_last=policy.channels_last)
                tr.scaler.scale(loss / t.grad_accum).backward()
            self.loss_sum += loss.detach() / t.grad_accum
        tr.scaler.unscale_(tr.opt)
        norm = torch.nn.utils.clip_grad_norm_(tr.params, self.clip)
        bad = (~torch.isfinite(norm)).float()
        if tr.scaler.is_enabled():
            tr.scaler.step(tr.opt)  # skips the update itself on inf/NaN gradients
            tr.scaler.update()
        elif tr.fused:
            tr.opt.found_inf = bad  # the fused kernel skips the update: no host sync
            tr.opt.step()
        elif not bad.item():
            tr.opt.step()
        tr.opt.zero_grad(set_to_none=True)
        ema_update(tr, bad)
        self.bad_run = (self.bad_run + 1) * bad
        self.bad_total += bad
        self.norm_sum += torch.nan_to_num(norm, nan=0.0, posinf=0.0)
        tr.step += 1
        return lr


def prepare_model(trainer: Trainer) -> torch.nn.Module:
    """Apply parallelism and compilation from the outside of the single-device network."""
    model: torch.nn.Module = trainer.net
    if trainer.ctx.distributed:
        model = wrap_ddp(trainer.net, trainer.ctx, trainer.cfg, trainer.policy)
    if trainer.policy.compile:
        cfg = trainer.cfg
        split = cfg.runtime.ddp_graph_split == Toggle.ON
        torch._dynamo.config.optimize_ddp = split  # off: all-reduces follow one whole compiled backward
        mode = training_compile_mode(cfg, trainer.policy)
        if cfg.runtime.compile_mode == CompileMode.REDUCE_OVERHEAD and mode != CompileMode.REDUCE_OVERHEAD:
            trainer.console.print(f"[yellow]runtime.compile_mode reduce-overhead needs train.grad_accum 1 on CUDA "
                                  f"(this run: {cfg.train.grad_accum} on {trainer.device.type}): compiling "
                                  f"without CUDA graphs[/]")
        tune = cfg.runtime.kernel_tuning == Toggle.ON
        model = torch.compile(model, options=compile_options(mode.value, trainer.policy.layout_opt, tune))
    return model


def training_compile_mode(cfg: RunConfig, policy: DevicePolicy) -> CompileMode:
    """The mode training compiles with. CUDA graphs (``reduce-overhead``, also what ``auto``
    picks) replay the compiled forward/backward on CUDA with one micro-step a step: a second
    micro-step's replay would overwrite the gradients of the first."""
    mode = cfg.runtime.compile_mode
    if mode not in (CompileMode.AUTO, CompileMode.REDUCE_OVERHEAD):
        return mode
    replayable = policy.compile and policy.device.type == "cuda" and cfg.train.grad_accum == 1
    return CompileMode.REDUCE_OVERHEAD if replayable else CompileMode.DEFAULT


def trains_in_cuda_graphs(cfg: RunConfig, policy: DevicePolicy) -> bool:
    return training_compile_mode(cfg, policy) == CompileMode.REDUCE_OVERHEAD


def compile_options(mode: str, layout_opt: bool, tune_kernels: bool = False, freeze: bool = False) -> dict[str, Any]:
    """Inductor options of ``torch.compile(mode=mode)``, plus the forced layout optimisation,
    coordinate-descent kernel tuning and freezing (``torch.compile`` takes a mode or options,
    not both)."""
    from torch._inductor import list_mode_options

    options = dict(list_mode_options(mode))
    if layout_opt:
        options["force_layout_optimization"] = True
    if tune_kernels:
        options["coordinate_descent_tuning"] = True
    if freeze:
        options["freezing"] = True
    return options


class InferenceNetwork(torch.nn.Module):
    """The network as sampling runs it: channels_last input, autocast, compiled on CUDA.

    Compiled, the weights are frozen into the graph (inductor's ``freezing``: the bf16 copies
    autocast would make on every call are made once, constant-folded): xl's 50 DDIM steps took
    0.430 s instead of 0.474 (docs/benchmarks.md 1). So weights changed after the first call
    are not seen: build a new ``InferenceNetwork`` for new weights (training previews sample
    the EMA network eagerly, so they always see its latest weights)."""

    def __init__(self, net: torch.nn.Module, policy: DevicePolicy, tune_kernels: bool = False) -> None:
        super().__init__()
        self.policy = policy
        net = net.eval().requires_grad_(False)
        if policy.flex_min_rows is not None:
            use_flex_attention(net, policy.flex_min_rows)
        if policy.channels_last:
            net = net.to(memory_format=torch.channels_last)
        # CUDA graphs ("reduce-overhead") replay a whole denoising call as one launch: a
        # sampling step of a small UNet is otherwise bound by kernel launches, not the GPU.
        # dynamic=False: one sampling run uses one batch shape; a new shape records once more.
        options = sampling_compile_options(policy, tune_kernels)
        self.graphs = bool(options.get("triton.cudagraphs"))
        self.run = torch.compile(net, options=options, dynamic=False) if policy.compile else net

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        if self.policy.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        if self.graphs:
            torch.compiler.cudagraph_mark_step_begin()  # the previous call's output is consumed
        with self.policy.autocast():
            out = self.run(x, t)
        return out.clone() if self.graphs else out  # a graph's output buffer is reused by the next replay


def sampling_compile_options(policy: DevicePolicy, tune_kernels: bool = False) -> dict[str, Any]:
    """Inductor options for sampling: CUDA graphs on CUDA, frozen weights, and the layout
    optimisation only where set on (``auto`` keeps inductor's own choice, as measured)."""
    graphs = policy.compile and policy.device.type == "cuda"
    return compile_options("reduce-overhead" if graphs else "default", policy.layout_opt, tune_kernels, freeze=True)


def sampling_network(net: torch.nn.Module, runtime: RuntimeConfig) -> InferenceNetwork:
    """``net`` as `diffscale sample` runs it on its device: bf16 + channels_last + compiled
    with CUDA graphs and frozen weights on CUDA, fp32 eager elsewhere (``inference_policy``);
    ``runtime.kernel_tuning`` tunes its kernels as it does training's."""
    policy = inference_policy(runtime, next(net.parameters()).device)
    configure_backends(policy)
    return InferenceNetwork(net, policy, tune_kernels=runtime.kernel_tuning == Toggle.ON)


def wrap_ddp(net: torch.nn.Module, ctx: DistContext, cfg: RunConfig, policy: DevicePolicy) -> torch.nn.Module:
    from torch.nn.parallel import DistributedDataParallel as DDP

    fast = cfg.runtime.recipe == Recipe.FAST
    kwargs: dict[str, Any] = {}
    if policy.device.type == "cuda":
        kwargs["device_ids"] = [policy.device.index]
    if fast:
        # Larger buckets mean fewer all-reduce launches; bucket views avoid a gradient copy.
        kwargs.update(bucket_cap_mb=cfg.runtime.ddp_bucket_mb, gradient_as_bucket_view=True)
    model = DDP(net, **kwargs)
    if bf16_gradient_compression(cfg.runtime.ddp_bf16_compress, ctx.backend):
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        model.register_comm_hook(None, default_hooks.bf16_compress_hook)
    return model


def bf16_gradient_compression(setting: Toggle, backend: str) -> bool:
    """Whether DDP all-reduces bf16 copies of the gradients. ``auto`` is off: on 4 x H100
    (NVLink) every preset scaled better without it, xl 94.0 % against 91.5 %
    (docs/benchmarks.md 1, runs G and H); ``on`` is for links where bytes cost more."""
    if setting == Toggle.ON and backend != "nccl":
        raise UserError(f"runtime.ddp_bf16_compress on needs CUDA GPUs with NCCL (this run all-reduces with {backend})",
                        "set runtime.ddp_bf16_compress to auto or off")
    return setting == Toggle.ON


@torch.no_grad()
def ema_update(trainer: Trainer, bad: torch.Tensor) -> None:
    """ema += (1 - decay) * (param - ema), skipped (weight 0) on a non-finite step; no host sync."""
    decay = min(trainer.cfg.train.ema_decay, (1 + trainer.step) / (10 + trainer.step))
    weight = (1.0 - decay) * (1.0 - bad)
    diff = torch._foreach_sub(trainer.params, trainer.ema_params)
    torch._foreach_mul_(diff, weight)
    torch._foreach_add_(trainer.ema_params, diff)
