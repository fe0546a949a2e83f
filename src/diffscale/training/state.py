"""The state of one training run: network, EMA, optimizer, scaler, counters and the data
position, and how it becomes a checkpoint and comes back from one."""

from __future__ import annotations

import copy
import time
from pathlib import Path

import torch
from rich.console import Console

from diffscale.config import Recipe, RunConfig
from diffscale.data.device_loader import DataPosition, DeviceBatcher
from diffscale.data.feed import Batcher, Feed
from diffscale.errors import UserError
from diffscale.runtime import checkpoint as ckpt
from diffscale.runtime.device import DevicePolicy
from diffscale.runtime.distributed import DistContext
from diffscale.runtime.flex_attention import use_flex_attention
from diffscale.tasks.registry import build_task
from diffscale.training.guard import GuardState


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


class RunState:
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
            # Module.to(memory_format=...) is supported; torch's overloads of `to` leave it out
            self.net = self.net.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        self.ema = copy.deepcopy(self.net).requires_grad_(False).eval()
        if policy.flex_min_rows is not None:  # training's kernel; the EMA samples as inference_policy says
            use_flex_attention(self.net, policy.flex_min_rows)
        self.params: list[torch.Tensor] = [p for p in self.net.parameters() if p.requires_grad]
        self.ema_params: list[torch.Tensor] = list(self.ema.parameters())
        # Fused AdamW keeps the update on the device (no host sync for the skip decision).
        self.fused = cfg.runtime.recipe == Recipe.FAST and self.device.type in ("cuda", "cpu")
        self.opt = torch.optim.AdamW(self.params, lr=cfg.optim.lr, betas=(cfg.optim.beta1, cfg.optim.beta2),
                                     weight_decay=cfg.optim.weight_decay, fused=self.fused or None)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=policy.use_grad_scaler)
        self.step = 0
        self.position = DataPosition()
        self.lr_backoff = 1.0
        self.rollbacks = 0
        self.nonfinite_total = 0
        self.guard = GuardState()
        """The divergence guard's statistics (kept in checkpoints: a resumed run judges as the first did)."""
        self.feed = Feed()
        self.data_ended = ""
        """Set when the data's source ended the run before its step target (the reason)."""
        """How the task's batcher reaches the other ranks and the log (the loop sets it)."""

    def restore(self, state: ckpt.TrainingState) -> None:
        """Continue exactly where ``state`` was written: weights, optimizer, data, RNG, counters."""
        self._load(state)
        self.lr_backoff = state.meta.lr_backoff
        self.rollbacks = state.meta.rollbacks
        self.nonfinite_total = state.meta.nonfinite_total
        self.guard = GuardState.from_dict(state.meta.guard)

    def roll_back(self, state: ckpt.TrainingState) -> None:
        """Back to ``state`` after non-finite losses, with the learning rate halved; the steps
        skipped so far stay counted (a rollback does not undo them)."""
        self._load(state)
        self.rollbacks += 1
        self.lr_backoff *= 0.5

    def _load(self, state: ckpt.TrainingState) -> None:
        self.net.load_state_dict(state.model)
        self.ema.load_state_dict(state.ema)
        self.opt.load_state_dict(state.optimizer)
        if state.meta.scaler and self.scaler.is_enabled():
            self.scaler.load_state_dict(state.meta.scaler)
        self.task.load_state_tensors(state.task)
        self.step = state.step
        self.position = DataPosition(**state.meta.data_position)
        _restore_rng(state.rng, self.device)

    def snapshot(self, batcher: Batcher) -> ckpt.TrainingState:
        meta = ckpt.CheckpointMeta(
            config=self.cfg.to_dict(), signature=self.task.signature(), data_position=batcher.position.to_dict(),
            scaler=self.scaler.state_dict() if self.scaler.is_enabled() else None, world_size=self.ctx.world_size,
            effective_batch=self.cfg.effective_batch(self.ctx.world_size), lr_backoff=self.lr_backoff,
            rollbacks=self.rollbacks, nonfinite_total=self.nonfinite_total, guard=self.guard.to_dict(),
            saved_at=time.time())
        return ckpt.TrainingState(step=self.step, model=self.net.state_dict(), ema=self.ema.state_dict(),
                                  optimizer=self.opt.state_dict(), meta=meta, rng=_rng_state(self.device),
                                  task=self.task.state_tensors())

    def make_batcher(self) -> Batcher:
        """The index stream of this run's effective batch, from the current data position."""
        batcher = self.task.batcher(self.cfg.effective_batch(self.ctx.world_size), self.cfg.train.seed,
                                    self.position, self.feed)
        data = self.cfg.data
        if data.fraction < 1:  # one subset for every task with resident data, drawn where its batches are
            if not isinstance(batcher, DeviceBatcher):
                raise UserError(f"data.fraction {data.fraction} needs data held whole, but '{data.source}' streams",
                                "train on all of a streamed source (data.fraction 1), or give it fewer samples")
            batcher.restrict(data.fraction, data.subset_seed)
        return batcher

    def save(self, batcher: Batcher) -> None:
        if self.ctx.is_main:
            ckpt.save_checkpoint(self.run_dir, self.snapshot(batcher), keep=self.cfg.train.keep_checkpoints)
        self.ctx.barrier()  # every rank leaves with the checkpoint on disk
