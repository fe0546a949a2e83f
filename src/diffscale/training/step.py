"""One optimizer step over a ``RunState``: draw the global batch, accumulate this rank's rows,
clip, fused AdamW, EMA -- with no host synchronisation. ``train`` (the loop) and ``bench``
(the measurements) both drive it."""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass

import torch

from diffscale.config import LrScaling, LrSchedule, RunConfig
from diffscale.data.device_loader import micro_slice
from diffscale.data.feed import Batcher
from diffscale.runtime.device import on_side_stream, recording_stream
from diffscale.runtime.distributed import DistContext
from diffscale.runtime.parallelize import trains_in_cuda_graphs
from diffscale.tasks.base import into
from diffscale.training.state import RunState
from diffscale.training.step_graph import WholeStepGraph, records_whole_steps


def step_seed(seed: int, step: int) -> int:
    """Seed of every random draw of one optimizer step (noise, timesteps, augmentation)."""
    return (seed * 1_000_003 + step * 7_919 + 12_345) % (2**63 - 1)


def learning_rate(cfg: RunConfig, step: int, effective_batch: int, backoff: float = 1.0) -> float:
    o = cfg.optim
    if o.lr_scaling == LrScaling.LINEAR:  # branches, not a dict of every choice: called every step
        scale = effective_batch / o.base_batch
    elif o.lr_scaling == LrScaling.SQRT:
        scale = math.sqrt(effective_batch / o.base_batch)
    else:
        scale = 1.0
    peak = o.lr * scale * backoff
    if o.warmup_steps and step < o.warmup_steps:
        return peak * (step + 1) / o.warmup_steps
    if o.schedule == LrSchedule.COSINE:
        progress = (step - o.warmup_steps) / max(1, cfg.train.steps - o.warmup_steps)
        return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))
    return peak


@dataclass(frozen=True)
class WindowMetrics:
    """Means over the steps since the last drain, across every rank."""

    loss: float
    grad_norm: float
    nonfinite: int
    """Steps skipped for non-finite gradients in the window (this rank's count: all ranks agree)."""
    data_wait_s: float = 0.0
    """Seconds the host waited for the next batch in the window (mean over ranks): the batcher's
    own time, host side, with no device synchronisation added."""


class StepRunner:
    """One optimizer step: draw the global batch, accumulate this rank's rows, clip, update, EMA.

    Nothing here synchronises with the host: loss, gradient norm and non-finite counters
    stay on the device until ``drain_metrics`` reads them.
    """

    def __init__(self, run_state: RunState, model: torch.nn.Module, batcher: Batcher, *, eager: bool = False) -> None:
        """``eager``: ``model`` is the network not yet compiled in a run that compiles
        (``runtime.compile_while_training``): plain steps until ``use_compiled``."""
        self.run_state = run_state
        self.model = model
        self.batcher = batcher
        device = run_state.device
        self.generator = torch.Generator(device=device)
        self._loss_sum = torch.zeros((), device=device)
        self._norm_sum = torch.zeros((), device=device)
        self._bad_run = torch.zeros((), device=device)  # consecutive non-finite steps
        self._bad_total = torch.zeros((), device=device)
        self._steps = 0
        self._data_wait_s = 0.0
        self._parts: list[tuple[WindowMetrics, int]] = []
        """Parts of the open logged window already read for the divergence guard (``drain_part``)."""
        self.last_read_loss = math.nan
        """The mean loss of the steps the last drain read (a logged window, or its part since the last
        ``drain_part``): the window the divergence guard judges."""
        self.last_read_steps = 0
        """The steps that drain read."""
        cfg = run_state.cfg
        self.clip = cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else float("inf")
        self.effective = cfg.effective_batch(run_state.ctx.world_size)
        self.whole: WholeStepGraph | None = None
        """Steps recorded as one CUDA graph each (``runtime.step_graph``), or None: eager steps."""
        self.graphs = False
        # Eager steps before whole steps are recorded under DDP run where the recording's own eager
        # steps run: DDP was built on that stream for the recording (step_graph.py).
        self._side = eager and run_state.ctx.distributed and records_whole_steps(run_state)
        if not eager:
            self.use_compiled(model)

    def _stream(self) -> contextlib.AbstractContextManager[None]:
        if not self._side:
            return contextlib.nullcontext()
        return on_side_stream(recording_stream(self.run_state.device))

    def use_compiled(self, model: torch.nn.Module) -> None:
        """Step ``model`` from the next step on: the network as ``parallelize`` made it. A run that
        stepped eager until its kernels were built switches here; its whole steps (where recorded)
        start recording then, after their own eager steps."""
        run_state = self.run_state
        self.model = model
        self.whole = WholeStepGraph(run_state, self._whole_step) if records_whole_steps(run_state) else None
        self.graphs = self.whole is None and trains_in_cuda_graphs(run_state.cfg, run_state.policy)
        self._side = False

    def step(self) -> float:
        """Run one optimizer step; returns its learning rate."""
        tr, t = self.run_state, self.run_state.cfg.train
        lr = learning_rate(tr.cfg, tr.step, self.effective, tr.lr_backoff)
        for group in tr.opt.param_groups:
            group["lr"] = lr
        self.generator.manual_seed(step_seed(t.seed, tr.step))
        # A recorded step draws its batch straight into the graph's inputs: no copies before a replay.
        inputs = self.whole.inputs if self.whole is not None else None
        asked = time.perf_counter()
        indices = self.batcher.next_indices(into(inputs, "indices"))
        self._data_wait_s += time.perf_counter() - asked
        batch = tr.task.draw(indices, self.generator, out=inputs)
        rate = 1.0 - min(t.ema_decay, (1 + tr.step) / (10 + tr.step))
        if self.whole is not None:
            self.whole.step(batch, lr, rate)
        else:
            if self.graphs:  # a new step: the last step's graph outputs (loss, gradients) are consumed
                torch.compiler.cudagraph_mark_step_begin()
            with self._stream():
                self._update(batch, rate)
                tr.opt.zero_grad(set_to_none=True)
        self._steps += 1
        tr.step += 1
        return lr

    def _update(self, batch: dict[str, torch.Tensor], ema_rate: float | torch.Tensor) -> None:
        """Loss, backward, clip, AdamW and EMA of one step; host-synchronising only for the plain
        recipe's skip decision."""
        tr = self.run_state
        self._accumulate(batch)
        tr.scaler.unscale_(tr.opt)
        norm = clip_gradients(tr.params, self.clip)
        bad = (~torch.isfinite(norm)).float()
        if tr.scaler.is_enabled():
            tr.scaler.step(tr.opt)  # skips the update itself on inf/NaN gradients
            tr.scaler.update()
        elif tr.fused:
            # the fused kernel reads found_inf and skips the update: no host sync
            tr.opt.found_inf = bad  # type: ignore[attr-defined]
            tr.opt.step()
        elif not bad.item():
            tr.opt.step()
        ema_update(tr, ema_rate)
        self._bad_run.add_(1).mul_(bad)  # in place: a recorded step updates the same tensors
        self._bad_total += bad
        self._norm_sum += torch.nan_to_num(norm, nan=0.0, posinf=0.0)

    def _accumulate(self, batch: dict[str, torch.Tensor]) -> None:
        tr, t = self.run_state, self.run_state.cfg.train
        ctx, policy = tr.ctx, tr.policy
        for micro in range(t.grad_accum):
            rows = micro_slice(micro, ctx.rank, ctx.world_size, t.batch_per_gpu)
            inner = ctx.distributed and micro < t.grad_accum - 1
            # no all-reduce on inner steps (DDP's no_sync, through the compiled wrapper's __getattr__)
            sync = self.model.no_sync() if inner else contextlib.nullcontext()  # type: ignore[operator]
            with sync:
                with policy.autocast():
                    loss = tr.task.loss(self.model, batch, rows, channels_last=policy.channels_last)
                tr.scaler.scale(loss / t.grad_accum).backward()
            self._loss_sum += loss.detach() / t.grad_accum

    def drain_metrics(self, ctx: DistContext) -> WindowMetrics:
        """The window's mean loss and gradient norm over every rank, and its skipped steps;
        starts a new window. The one host synchronisation of the loop (with ``drain_part``'s)."""
        last, steps = self._drain(ctx)
        if not self._parts:
            return last
        parts, self._parts = [*self._parts, (last, steps)], []
        total = sum(n for _, n in parts)  # each part covers at least one step
        return WindowMetrics(loss=sum(m.loss * n for m, n in parts) / total,
                             grad_norm=sum(m.grad_norm * n for m, n in parts) / total,
                             nonfinite=sum(m.nonfinite for m, _ in parts),
                             data_wait_s=sum(m.data_wait_s for m, _ in parts))

    def drain_part(self, ctx: DistContext) -> None:
        """Read the mean loss over every rank of the steps since the last drain (``last_read_loss``)
        for the divergence guard between logged windows; the window logged next still covers them."""
        self._parts.append(self._drain(ctx))

    def _drain(self, ctx: DistContext) -> tuple[WindowMetrics, int]:
        steps = max(self._steps, 1)
        waited = torch.full((), self._data_wait_s, device=self._loss_sum.device)
        packed = ctx.all_mean(torch.stack([self._loss_sum / steps, self._norm_sum / steps, waited]).float())
        loss, norm, data_wait_s = (float(v) for v in packed.tolist())
        nonfinite = int(self._bad_total.item())
        self._loss_sum.zero_()
        self._norm_sum.zero_()
        self._bad_total.zero_()
        self._steps = 0
        self._data_wait_s = 0.0
        self.last_read_loss, self.last_read_steps = loss, steps
        return WindowMetrics(loss=loss, grad_norm=norm, nonfinite=nonfinite, data_wait_s=data_wait_s), steps

    def nonfinite_in_a_row(self) -> int:
        """Consecutive steps ending with non-finite gradients (reads the device: call at log steps)."""
        return int(self._bad_run.item())

    def restart(self, batcher: Batcher) -> None:
        """Continue from a restored run state's data stream (after a rollback); the batcher drawn
        from so far is released."""
        self.batcher.close()
        self.batcher = batcher
        self._bad_run.zero_()
        self._parts = []  # the steps they covered were undone
        if self.whole is not None:  # the optimizer's state tensors were replaced
            self.whole.reset()

    def _whole_step(self, batch: dict[str, torch.Tensor]) -> None:
        assert self.whole is not None
        self._update(batch, self.whole.ema_rate)


@torch.no_grad()
def clip_gradients(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Scale the gradients to a total 2-norm of at most ``max_norm``; returns the norm before.
    What ``torch.nn.utils.clip_grad_norm_`` computes, in four calls: that function also groups
    the tensors by device and dtype and moves each tensor's norm, host time that bound the
    policy UNet's step (docs/decisions.md, "Gradient clipping in four calls")."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros((), device=params[0].device if params else None)
    norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    if max_norm != float("inf"):
        torch._foreach_mul_(grads, torch.clamp(max_norm / (norm + 1e-6), max=1.0))
    return norm


@torch.no_grad()
def ema_update(run_state: RunState, rate: float | torch.Tensor) -> None:
    """ema += rate * (param - ema), rate = 1 - decay, without a host sync. On a step skipped for
    non-finite gradients the parameters did not change, so the EMA moves towards the same
    (finite) parameters as on the step before."""
    if isinstance(rate, float):
        # one pass, in place: foreach lerp takes its weight as a number
        torch._foreach_lerp_(run_state.ema_params, run_state.params, rate)
        return
    # a recorded step reads the rate from a device tensor: reading it as a number would wait
    # for the GPU, so a multiply takes the 0-dim tensor
    diff = torch._foreach_sub(run_state.params, run_state.ema_params)
    torch._foreach_mul_(diff, rate)
    torch._foreach_add_(run_state.ema_params, diff)
