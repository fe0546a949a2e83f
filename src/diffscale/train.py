"""The training loop: step -> accumulate -> optimizer -> EMA -> metrics -> checkpoint.

It knows nothing of schedulers or model internals: the task supplies data, network and
previews; the runtime supplies the device, precision and process group. One process
is the world-size-1 case of the same code.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from .config import LrSchedule, LrScaling, Recipe, RunConfig, write_yaml
from .data.device_loader import DataPosition, DeviceBatcher, micro_slice
from .errors import UserError
from .models import count_parameters
from .runtime import checkpoint as ckpt
from .runtime.device import DevicePolicy, configure_backends, peak_memory_bytes, pick_device, resolve_policy
from .runtime.distributed import DistContext, detect_launch, init_distributed
from .runtime.resources import cpus_for_rank
from .runtime.signals import EXIT_REQUEUE, StopFlag
from .tasks import build_task
from .telemetry import Telemetry, ThroughputMeter

MAX_ROLLBACKS = 3


@dataclass
class TrainOutcome:
    run_dir: Path
    step: int
    target: int
    stopped_by: str | None = None
    """Signal name when a stop request ended this invocation early."""
    samples: list[Path] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.step >= self.target

    @property
    def exit_code(self) -> int:
        return EXIT_REQUEUE if self.stopped_by else 0


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


def _banner(policy: DevicePolicy, ctx: DistContext, cfg: RunConfig, params: int, data: str) -> str:
    mem = f", {policy.memory_bytes / 2**30:.0f} GiB" if policy.memory_bytes else ""
    eff = cfg.effective_batch(ctx.world_size)
    return (
        f"diffscale | {policy.device.type}: {policy.name}{mem} | {policy.precision.value}"
        f"{' + GradScaler' if policy.use_grad_scaler else ''}{' | compiled' if policy.compile else ''} | "
        f"world size {ctx.world_size} ({ctx.info.launcher}) | effective batch {eff} = "
        f"{cfg.train.batch_per_gpu} x {ctx.world_size} proc x {cfg.train.grad_accum} accum | "
        f"{cfg.preset} UNet {params / 1e6:.2f} M params | data {data}"
    )


def _check_signature(state: ckpt.TrainingState, expected: dict[str, Any], where: str) -> None:
    found = state.meta.get("signature")
    if found != expected:
        diffs = [f"{k}: checkpoint {found.get(k) if found else None} vs config {v}" for k, v in expected.items()
                 if not found or found.get(k) != v]
        raise UserError(
            f"checkpoint {where} was written for a different model ({'; '.join(diffs)})",
            "resume with the run's own config (RUN_DIR/config.yaml), or start a new run with another --out",
        )


def _adjust_for_world_size(cfg: RunConfig, state: ckpt.TrainingState, world: int, say) -> RunConfig:
    """Keep the checkpoint's effective batch on a different world size via accumulation."""
    saved_eff = int(state.meta.get("effective_batch", cfg.effective_batch(world)))
    saved_world = int(state.meta.get("world_size", world))
    if saved_eff == cfg.effective_batch(world):
        if saved_world != world:
            say(f"resuming on {world} processes (was {saved_world}); effective batch {saved_eff} unchanged")
        return cfg
    per_step = cfg.train.batch_per_gpu * world
    if saved_eff % per_step == 0:
        accum = saved_eff // per_step
        say(f"resuming on {world} processes (was {saved_world}): train.grad_accum {cfg.train.grad_accum} -> {accum} "
            f"keeps the effective batch at {saved_eff}")
        new = copy.deepcopy(cfg)
        new.train.grad_accum = accum
        return new
    say(f"warning: the effective batch changes from {saved_eff} to {cfg.effective_batch(world)} "
        f"({world} processes x {cfg.train.batch_per_gpu} x {cfg.train.grad_accum}); {saved_eff} is not a multiple of "
        f"{per_step} -- set train.batch_per_gpu to keep it")
    return cfg


class _Trainer:
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

    def save(self, batcher: DeviceBatcher) -> None:
        if self.ctx.is_main:
            ckpt.save_checkpoint(self.run_dir, self.snapshot(batcher), keep=self.cfg.train.keep_checkpoints)
        self.ctx.barrier()  # every rank leaves with the checkpoint on disk


def train(cfg: RunConfig, run_dir: Path, *, resume: str | None = None, max_steps: int | None = None,
          console: Console | None = None) -> TrainOutcome:
    """Train until ``cfg.train.steps`` (or ``max_steps``), a stop signal, or an unrecoverable error."""
    console = console or Console(soft_wrap=True)
    run_dir = Path(run_dir)
    launch = detect_launch()
    device = pick_device(cfg.runtime.device, launch.local_rank)
    policy = resolve_policy(cfg.runtime, device)
    configure_backends(policy)
    if device.type == "cpu" and launch.local_world_size > 1 and "OMP_NUM_THREADS" not in os.environ:
        # Several CPU ranks on one host each spinning up all cores' threads slow every one
        # of them down many times over: give each rank its share.
        torch.set_num_threads(cpus_for_rank(launch.local_world_size))
    ctx = init_distributed(launch, device, join_timeout_s=cfg.runtime.join_timeout_s,
                           collective_timeout_s=cfg.runtime.collective_timeout_s)
    stop = StopFlag().install()
    try:
        return _run(cfg, run_dir, ctx, policy, resume=resume, max_steps=max_steps, console=console, stop=stop)
    finally:
        stop.restore()
        ctx.shutdown()


def _run(cfg: RunConfig, run_dir: Path, ctx: DistContext, policy: DevicePolicy, *, resume: str | None,
         max_steps: int | None, console: Console, stop: StopFlag) -> TrainOutcome:
    def say(text: str) -> None:
        if ctx.is_main:
            console.print(text, highlight=False)

    existing = ckpt.list_checkpoints(run_dir)
    if existing and resume is None:
        raise UserError(
            f"run dir '{run_dir}' already holds checkpoints (newest: {existing[-1].name})",
            "continue that run with --resume auto, or pass a new --out RUN_DIR",
        )
    state = ckpt.load_resume(run_dir, resume, log=say) if resume else None
    if state is not None:
        cfg = _adjust_for_world_size(cfg, state, ctx.world_size, say)
    trainer = _Trainer(cfg, run_dir, ctx, policy, console)
    if state is not None:
        _check_signature(state, trainer.task.signature(), f"'{run_dir}' step {state.step}")
        trainer.restore(state)
        say(f"resumed from step {state.step}")
    if ctx.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_yaml(cfg, run_dir / "config.yaml")

    t = cfg.train
    world = ctx.world_size
    effective = cfg.effective_batch(world)
    batcher = DeviceBatcher(trainer.task.num_items(), effective, t.seed, policy.device, trainer.position)
    target = t.steps
    stop_at = min(target, max_steps) if max_steps else target
    say(_banner(policy, ctx, cfg, count_parameters(trainer.net), trainer.task.describe_data()))

    if policy.compile:
        # Compiled kernels live in the run dir (a shared file system on clusters): a job that
        # resumes after a wall-time limit, on any node, reuses them instead of compiling again.
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(run_dir.resolve() / "cache" / "inductor"))
    model = prepare_model(trainer)

    telemetry = Telemetry(run_dir, enabled=ctx.is_main, total_steps=target, start_step=trainer.step, console=console)
    meter = ThroughputMeter()
    runner = StepRunner(trainer, model, batcher)
    steps_since_log = 0
    started = time.perf_counter()
    steps_at_start = trainer.step
    stopped_by: str | None = None
    samples: list[Path] = []
    if policy.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(policy.device)

    try:
        while trainer.step < stop_at:
            lr = runner.step()
            steps_since_log += 1
            meter.add(effective)
            if trainer.step % t.log_every == 0 or trainer.step == stop_at:
                record = _metrics(trainer, ctx, runner, steps_since_log, meter, lr, started, steps_at_start,
                                  stop_at, target)
                steps_since_log = 0
                telemetry.log(record)
                if runner.bad_run.item() >= t.max_nonfinite_steps:
                    runner.batcher = _rollback(trainer, cfg, ctx, policy, runner.batcher, say, effective)
                    runner.bad_run.zero_()
                    continue
                if ctx.any_true(stop.requested):
                    stopped_by = stop.signal_name or "a signal on another rank"
                    say(f"stop requested ({stopped_by}) at step {trainer.step}: writing a checkpoint")
                    trainer.save(runner.batcher)
                    break
            if trainer.step % t.checkpoint_every == 0 or trainer.step == stop_at:
                trainer.save(runner.batcher)
            if t.sample_every and trainer.step % t.sample_every == 0 and trainer.step != stop_at:
                samples += _preview(trainer, ctx, run_dir, f"step{trainer.step:08d}")
        if stopped_by is None:
            samples += _preview(trainer, ctx, run_dir, f"step{trainer.step:08d}")
            if trainer.step >= target:
                say(f"done: {trainer.step} steps; samples in {run_dir / 'samples'}")
            else:
                say(f"stopped at step {trainer.step} of {target} (--max-steps); continue with --resume auto")
    finally:
        telemetry.close()
    return TrainOutcome(run_dir=run_dir, step=trainer.step, target=target, stopped_by=stopped_by, samples=samples)


class StepRunner:
    """One optimizer step: draw the global batch, accumulate this rank's rows, clip, update, EMA.

    Shared by ``train`` and ``bench``. Nothing here synchronises with the host: loss,
    gradient norm and non-finite counters stay on the device until the caller reads them.
    """

    def __init__(self, trainer: _Trainer, model: torch.nn.Module, batcher: DeviceBatcher) -> None:
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

    def step(self) -> float:
        """Run one optimizer step; returns its learning rate."""
        tr, t = self.trainer, self.trainer.cfg.train
        ctx, policy = tr.ctx, tr.policy
        lr = learning_rate(tr.cfg, tr.step, self.effective, tr.lr_backoff)
        for group in tr.opt.param_groups:
            group["lr"] = lr
        self.generator.manual_seed(step_seed(t.seed, tr.step))
        batch = tr.task.draw(self.batcher.next_indices(), self.generator)
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
        _ema_update(tr, bad)
        self.bad_run = (self.bad_run + 1) * bad
        self.bad_total += bad
        self.norm_sum += torch.nan_to_num(norm, nan=0.0, posinf=0.0)
        tr.step += 1
        return lr


def prepare_model(trainer: _Trainer) -> torch.nn.Module:
    """Apply parallelism and compilation from the outside of the single-device network."""
    model: torch.nn.Module = trainer.net
    if trainer.ctx.distributed:
        model = _wrap_ddp(trainer.net, trainer.ctx, trainer.cfg, trainer.policy)
    if trainer.policy.compile:
        model = torch.compile(model)
    return model


def _wrap_ddp(net: torch.nn.Module, ctx: DistContext, cfg: RunConfig, policy: DevicePolicy) -> torch.nn.Module:
    from torch.nn.parallel import DistributedDataParallel as DDP

    fast = cfg.runtime.recipe == Recipe.FAST
    kwargs: dict[str, Any] = {}
    if policy.device.type == "cuda":
        kwargs["device_ids"] = [policy.device.index]
    if fast:
        # Larger buckets mean fewer all-reduce launches; bucket views avoid a gradient copy.
        kwargs.update(bucket_cap_mb=cfg.runtime.ddp_bucket_mb, gradient_as_bucket_view=True)
    model = DDP(net, **kwargs)
    from .config import Toggle

    compress = cfg.runtime.ddp_bf16_compress
    use_compress = (compress == Toggle.ON) or (compress == Toggle.AUTO and fast and policy.device.type == "cuda"
                                               and policy.autocast_dtype == torch.bfloat16)
    if use_compress:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        model.register_comm_hook(None, default_hooks.bf16_compress_hook)
    return model


@torch.no_grad()
def _ema_update(trainer: _Trainer, bad: torch.Tensor) -> None:
    """ema += (1 - decay) * (param - ema), skipped (weight 0) on a non-finite step; no host sync."""
    decay = min(trainer.cfg.train.ema_decay, (1 + trainer.step) / (10 + trainer.step))
    weight = (1.0 - decay) * (1.0 - bad)
    diff = torch._foreach_sub(trainer.params, trainer.ema_params)
    torch._foreach_mul_(diff, weight)
    torch._foreach_add_(trainer.ema_params, diff)


def _metrics(trainer: _Trainer, ctx: DistContext, runner: StepRunner, steps: int, meter, lr,
             started: float, steps_at_start: int, stop_at: int, target: int) -> dict[str, Any]:
    packed = ctx.all_mean(torch.stack([runner.loss_sum / steps, runner.norm_sum / steps]).float())
    runner.loss_sum.zero_()
    runner.norm_sum.zero_()
    loss, norm = (float(v) for v in packed.tolist())
    # Fold the device-side count into the trainer's total here, at a log step, so checkpoints
    # (written at log steps) carry every skipped step and a rollback cannot count one twice.
    trainer.nonfinite_total += int(runner.bad_total.item())
    runner.bad_total.zero_()
    rate = meter.rate()
    done = trainer.step - steps_at_start
    elapsed = time.perf_counter() - started
    eta = elapsed / max(done, 1) * (stop_at - trainer.step)
    return {
        "step": trainer.step,
        "total_steps": target,
        "loss": loss,
        "lr": lr,
        "grad_norm": norm,
        "samples_per_s": rate,
        "samples_per_s_per_gpu": rate / ctx.world_size,
        "peak_mem_mb": peak_memory_bytes(trainer.device) / 2**20,
        "nonfinite_skipped": trainer.nonfinite_total,
        "epoch": runner.batcher.position.epoch,
        "eta_s": eta,
        "time": time.time(),
    }


def _rollback(trainer: _Trainer, cfg: RunConfig, ctx: DistContext, policy: DevicePolicy, batcher: DeviceBatcher,
              say, effective: int) -> DeviceBatcher:
    step = trainer.step
    if trainer.rollbacks >= MAX_ROLLBACKS:
        raise UserError(
            f"the loss stayed non-finite at step {step} after {trainer.rollbacks} rollbacks "
            f"(learning rate now {learning_rate(cfg, step, effective, trainer.lr_backoff):.2e})",
            "lower optim.lr, keep optim.grad_clip on (e.g. 1.0), or use --precision fp32 / bf16 instead of fp16",
        )
    state = ckpt.load_latest(trainer.run_dir, log=say)
    if state is None:
        raise UserError(
            f"the loss was non-finite for {cfg.train.max_nonfinite_steps} steps in a row at step {step} "
            "and no checkpoint exists to roll back to",
            "lower optim.lr, keep optim.grad_clip on, or set train.checkpoint_every lower so a rollback is possible",
        )
    rollbacks = trainer.rollbacks + 1
    backoff = trainer.lr_backoff * 0.5
    skipped = trainer.nonfinite_total  # steps skipped so far stay counted: the rollback does not undo them
    trainer.restore(state)
    trainer.rollbacks, trainer.lr_backoff, trainer.nonfinite_total = rollbacks, backoff, skipped
    say(f"warning: non-finite loss for {cfg.train.max_nonfinite_steps} steps in a row at step {step}: rolled back "
        f"to step {state.step} with the learning rate halved (rollback {rollbacks} of {MAX_ROLLBACKS})")
    return DeviceBatcher(batcher.num_items, batcher.global_batch, batcher.seed, policy.device, trainer.position)


def _preview(trainer: _Trainer, ctx: DistContext, run_dir: Path, name: str) -> list[Path]:
    """Sample a grid from the EMA weights. Every rank denoises a share (no rank idles at a
    collective while rank 0 samples); rank 0 gathers and writes."""
    t = trainer.cfg.train
    images, _ = _sample_sharded(trainer, ctx, t.sample_count, t.sample_steps, t.seed)
    if not ctx.is_main:
        return []
    from .sample import save_grid

    path = save_grid(images, run_dir / "samples" / f"{name}.png")
    latest = run_dir / "samples" / "latest.png"
    tmp = latest.with_suffix(".tmp.png")
    tmp.write_bytes(path.read_bytes())
    os.replace(tmp, latest)
    return [path]


def _sample_sharded(trainer: _Trainer, ctx: DistContext, count: int, steps: int, seed: int):
    from .diffusion import Sampler, SamplerKind
    from .diffusion.sampler import sample

    task = trainer.task
    size = trainer.cfg.model.sample_size
    generator = torch.Generator().manual_seed(seed)
    start_noise = torch.randn((count, task.channels, size, size), generator=generator)
    share = math.ceil(count / ctx.world_size)
    mine = start_noise[ctx.rank * share:(ctx.rank + 1) * share]
    if mine.shape[0] < share:  # pad so every rank gathers the same shape
        mine = torch.cat([mine, torch.zeros((share - mine.shape[0],) + mine.shape[1:])])

    def denoise(x, t):
        with trainer.policy.autocast():
            return trainer.ema(x, t)

    out, _ = sample(denoise, task.diffusion, tuple(mine.shape), sampler=Sampler(SamplerKind.DDIM, steps),
                    generator=generator, device=trainer.device, x_init=mine)
    if ctx.distributed:
        import torch.distributed as dist

        parts = [torch.empty_like(out, device=trainer.device) for _ in range(ctx.world_size)]
        dist.all_gather(parts, out.to(trainer.device).contiguous())
        out = torch.cat([p.cpu() for p in parts])
    return out[:count], []
