"""A whole optimizer step recorded once as one CUDA graph and replayed every step.

A step of a small network (the field MLP at batch 16) is ~40 kernels of microseconds each, and
the host launching them leaves the GPU idle most of the time (docs/benchmarks.md, "Field
diffusion"). Recorded, a step is one launch. What changes from step to step enters through
tensors the graph reads: the batch's random draws (drawn into its inputs), the learning rate and the EMA
rate. Everything else the step touches must stay where it was when the step was recorded
(weights, optimizer moments, the task's data); a task says so with ``records_whole_steps``,
and a change of any task tensor's storage, or a restored optimizer (``reset``), records anew.

Under DDP the recording holds the gradient all-reduces too (NCCL >= 2.9.6 lets collectives be
captured), so a rank's host launches one graph a step instead of DDP's Python forward, its
hooks and each kernel: the hosts stop making each other wait in the all-reduce. What PyTorch's
CUDA-graph notes ask for that: DDP built on a side stream (``parallelize``; the same stream as
the warm-up and the recording, ``recording_stream``), and at least 11 eager DDP steps before
recording (DDP rebuilds its buckets after the first and times its first ten). Recording is
thread-local: another thread's CUDA calls (NCCL's watchdog, a simulation's ``push``) do not
break it.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import TypeGuard

import torch

from diffscale.config import CompileMode, Recipe, Toggle
from diffscale.errors import UserError
from diffscale.runtime.device import on_side_stream, recording_stream
from diffscale.training.state import RunState

EAGER_STEPS = 3
"""Steps run before recording: compilation, cuBLAS and optimizer state are set up by then."""
EAGER_STEPS_DDP = 11
"""The same under DDP (PyTorch's notes on CUDA graphs with DistributedDataParallel)."""


def records_whole_steps(run_state: RunState) -> bool:
    """Whether ``run_state``'s steps are recorded as CUDA graphs (``runtime.step_graph``)."""
    cfg, setting = run_state.cfg, run_state.cfg.runtime.step_graph
    if setting == Toggle.OFF:
        return False
    missing = [why for why, bad in (
        (f"a CUDA GPU (this run trains on {run_state.device.type})", run_state.device.type != "cuda"),
        (f"one process or NCCL between processes (this run: {run_state.ctx.world_size} with {run_state.ctx.backend})",
         run_state.ctx.world_size != 1 and run_state.ctx.backend != "nccl"),
        (f"train.grad_accum 1 (this run: {cfg.train.grad_accum})", cfg.train.grad_accum != 1),
        ("runtime.recipe fast (fused AdamW)", cfg.runtime.recipe != Recipe.FAST or not run_state.fused),
        ("no fp16 loss scaling (precision bf16 or fp32)", run_state.scaler.is_enabled()),
        ("runtime.compile_mode other than reduce-overhead (the network's own graphs cannot be recorded "
         "inside a step's)", cfg.runtime.compile_mode == CompileMode.REDUCE_OVERHEAD),
    ) if bad]
    if setting == Toggle.ON and missing:
        raise UserError(f"runtime.step_graph on needs {missing[0]}", "set runtime.step_graph to auto or off")
    task = run_state.task
    measured = task.records_whole_ddp_steps if run_state.ctx.distributed else task.records_whole_steps
    return not missing and (setting == Toggle.ON or measured)


def _holders(task: object) -> list[dict[str, object]]:
    """The attribute dicts a recorded step's tensors are found in: the task's and those of its
    attributes' objects."""
    return [vars(task), *(vars(v) for v in vars(task).values() if hasattr(v, "__dict__"))]


def _task_storages(task: object) -> tuple[int, ...]:
    """Where the task's tensors (and those of its attributes' objects) live now."""
    return tuple(item.data_ptr() for d in _holders(task) for item in d.values() if _watched(item))


def _watched(item: object) -> TypeGuard[torch.Tensor]:
    """A tensor a recorded step may read in place: on the GPU."""
    return isinstance(item, torch.Tensor) and item.device.type == "cuda"


class _StorageWatch:
    """``_task_storages(task) == storages``, cheap enough to ask before every replay.

    ``_task_storages`` walks over a hundred attributes, host time that a field step's short GPU time
    does not hide (docs/benchmarks.md, "Field diffusion"). Here a step compares, by identity, the
    values the walk read at the two levels it looks at, and the storages of the CUDA tensors it
    found; only when one of them changed is the walk made again."""

    def __init__(self, task: object) -> None:
        self.task = task
        self.storages = _task_storages(task)
        self._snapshot()

    def _snapshot(self) -> None:
        self.holders = _holders(self.task)
        self.values = [tuple(d.values()) for d in self.holders]
        self.tensors = [t for d in self.holders for t in d.values() if _watched(t)]
        self.pointers = [t.data_ptr() for t in self.tensors]

    def unchanged(self) -> bool:
        if all(len(d) == len(old) and all(map(operator.is_, d.values(), old))
               for d, old in zip(self.holders, self.values, strict=True)) and \
                [t.data_ptr() for t in self.tensors] == self.pointers:
            return True
        if _task_storages(self.task) != self.storages:
            return False
        self._snapshot()  # values rebound to the same storages: watch the new ones
        return True


class WholeStepGraph:
    """Runs ``body(batch)`` (one step: loss, backward, clip, AdamW, EMA) eagerly for
    ``EAGER_STEPS`` steps (``EAGER_STEPS_DDP`` under DDP), then records it and replays it with
    each step's batch drawn into (or copied into) the recorded step's ``inputs``.

    ``lr`` and ``ema_rate`` are the tensors the body must read for the learning rate (it is put
    into the optimizer's param groups while the body runs) and the EMA's ``1 - decay``."""

    def __init__(self, run_state: RunState, body: Callable[[dict[str, torch.Tensor]], None]) -> None:
        self.run_state = run_state
        self.body = body
        device = run_state.device
        self.lr = torch.zeros((), device=device)
        self.ema_rate = torch.zeros((), device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.batch: dict[str, torch.Tensor] = {}
        self.eager_steps = 0
        self.eager_needed = EAGER_STEPS_DDP if run_state.ctx.distributed else EAGER_STEPS
        self.recordings = 0
        self._watch: _StorageWatch | None = None
        self._filled = (float("nan"), float("nan"))
        """The values ``lr`` and ``ema_rate`` were last filled with (a fill is a kernel launch)."""
        for group in run_state.opt.param_groups:
            group["capturable"] = True  # the fused update keeps its step count on the GPU

    def reset(self) -> None:
        """Record again before the next step (weights or optimizer state were restored)."""
        self.graph, self.batch, self.eager_steps = None, {}, 0

    def release(self) -> None:
        """Free the recording (before the process group ends: it holds NCCL's communicator)."""
        if self.graph is not None:
            torch.cuda.synchronize(self.run_state.device)
            self.reset()
            torch.cuda.synchronize(self.run_state.device)  # NCCL lets go of a destroyed graph's work

    @property
    def inputs(self) -> dict[str, torch.Tensor] | None:
        """The recorded step's batch tensors, or None while no step is recorded: a batch drawn
        into them in place (``Task.draw(..., out=)``) is replayed without copies or allocations."""
        return self.batch if self.graph is not None else None

    def step(self, batch: dict[str, torch.Tensor], lr: float, ema_rate: float) -> None:
        if lr != self._filled[0]:
            self.lr.fill_(lr)
        if ema_rate != self._filled[1]:  # constant once the EMA warm-up ends
            self.ema_rate.fill_(ema_rate)
        self._filled = (lr, ema_rate)
        if self.graph is not None and self._watch is not None and not self._watch.unchanged():
            self.reset()
        if self.graph is None and self.eager_steps < self.eager_needed:
            self.eager_steps += 1
            with on_side_stream(recording_stream(self.run_state.device)):  # set-up off the stream replays run on
                self._run_body(batch)
                self.run_state.opt.zero_grad(set_to_none=True)
            return
        if self.graph is None:
            self._record(batch)
        for name, tensor in batch.items():
            if tensor is not self.batch[name]:  # drawn elsewhere (the first replay): copied in
                self.batch[name].copy_(tensor)
        assert self.graph is not None
        self.graph.replay()

    def _run_body(self, batch: dict[str, torch.Tensor]) -> None:
        groups = self.run_state.opt.param_groups
        floats = [group["lr"] for group in groups]
        for group in groups:
            group["lr"] = self.lr
        try:
            self.body(batch)
        finally:
            for group, value in zip(groups, floats, strict=True):
                group["lr"] = value

    def _record(self, batch: dict[str, torch.Tensor]) -> None:
        self.batch = {name: tensor.clone() for name, tensor in batch.items()}
        torch.cuda.synchronize(self.run_state.device)
        # Gradients are made by the recorded backward (in the graph's memory), not accumulated.
        self.run_state.opt.zero_grad(set_to_none=True)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=recording_stream(self.run_state.device), capture_error_mode="thread_local"):
            self._run_body(self.batch)
        self.graph = graph
        if self.recordings == 0 and self.run_state.ctx.distributed:
            self.run_state.ctx.before_shutdown(self.release)
        self.recordings += 1
        self._watch = _StorageWatch(self.run_state.task)
