"""Quality against training wall clock: what ``benchmarks.fields_quality`` and ``benchmarks.policy_quality``
share.

A run trains in segments; only the steps are timed (the device synchronised at each segment's
end), and between segments the EMA weights are scored with the clock stopped. Start-up
(compilation, CUDA-graph recording, a loader's workers, library handles) is taken out of the
clock and reported on its own: warm-up steps run first, then ``Rewind`` puts the weights, the
EMA, the optimizer's moments, the step counter and (for the fast recipe) the data stream back to
where a fresh run starts, in place. In place matters: a recorded step (``runtime.step_graph``)
and a compiled network read these tensors where they were when they were recorded, so nothing
compiles or records again, and a rewound fast run computes what a fresh run of the same seed
computes. The plain recipe's loader goes on with its shuffled epoch (its workers keep running).

Scores are taken on a separate evaluation network (``eval_network``) that the EMA weights are
copied into before each score: one network for every run of a process, as sampling runs it with
its weights read at each call (``sampling_network(..., live=True)``), eager unless asked
(``scoring_runtime``): a dozen scores cost less than compiling for them, and scoring is off the clock.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from diffscale.config import RunConfig, RuntimeConfig, Toggle
from diffscale.data.device_loader import DataPosition
from diffscale.runtime.device import synchronize

if TYPE_CHECKING:
    from diffscale.bench.plain import PlainRunner
    from diffscale.training.state import RunState
    from diffscale.training.step import StepRunner


def recipe_run(cfg: RunConfig, run_dir: Path, *, plain_workers: int = 4) -> tuple[RunState, StepRunner | PlainRunner,
                                                                                 Rewind]:
    """One process's run of ``cfg`` (its ``runtime.recipe``) as ``bench.worker.build_recipe`` builds
    it (diffscale's ``build_run``, or the plain recipe's loop on the same state), and the ``Rewind``
    to its initial weights (taken before anything compiles)."""
    from rich.console import Console

    from diffscale.bench.worker import build_recipe
    from diffscale.training.build import join

    ctx, policy = join(cfg, Console(quiet=True), one_process=True)
    rewinds: list[Rewind] = []
    run_state, runner = build_recipe(cfg, run_dir, ctx, policy, cfg.runtime.recipe.value, plain_workers=plain_workers,
                                     prepare=lambda state: rewinds.append(Rewind(state)))
    return run_state, runner, rewinds[0]


def ema_tensors(run_state: RunState, runner: StepRunner | PlainRunner) -> list[torch.Tensor]:
    """The EMA weights a runner keeps, in the order of ``run_state.net.parameters()``: the plain
    recipe keeps its own list, the fast one the run state's EMA network."""
    own = getattr(runner, "ema", None)
    return list(own) if isinstance(own, list) else list(run_state.ema.parameters())


def optimizer_of(run_state: RunState, runner: StepRunner | PlainRunner) -> torch.optim.Optimizer:
    own = getattr(runner, "opt", None)
    return own if isinstance(own, torch.optim.Optimizer) else run_state.opt


class Rewind:
    """A run's initial weights, kept to bring it back to step 0 in place (see the module docstring).
    Take it before the first step."""

    def __init__(self, run_state: RunState) -> None:
        self.params = [p.detach().clone() for p in run_state.net.parameters()]
        self.buffers = [b.detach().clone() for b in run_state.net.buffers()]

    @torch.no_grad()
    def __call__(self, run_state: RunState, runner: StepRunner | PlainRunner) -> None:
        synchronize(run_state.device)
        net_params: list[torch.Tensor] = list(run_state.net.parameters())
        torch._foreach_copy_(net_params, self.params)
        torch._foreach_copy_(ema_tensors(run_state, runner), self.params)
        for current, first in zip(run_state.net.buffers(), self.buffers, strict=True):
            current.copy_(first)
        for ema_buffer, first in zip(run_state.ema.buffers(), self.buffers, strict=True):
            ema_buffer.copy_(first)
        for state in optimizer_of(run_state, runner).state.values():
            for value in state.values():  # moments and the step count: a fresh optimizer's first step
                if isinstance(value, torch.Tensor):
                    value.zero_()
        run_state.step = 0
        drain = getattr(runner, "drain_metrics", None)
        if drain is not None:  # the fast runner: its metric sums and its data stream start again
            drain(run_state.ctx)
            run_state.position = DataPosition()
            setattr(runner, "batcher", run_state.make_batcher())  # noqa: B010 (a StepRunner's; typed by union)
        synchronize(run_state.device)


def warm_up(step: Callable[[], object], steps: int, device: torch.device) -> float:
    """Run ``steps`` steps (compilation, recording, loader start); returns their wall seconds."""
    synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    synchronize(device)
    return time.perf_counter() - start


@dataclass(frozen=True)
class Schedule:
    """When a curve scores and when it stops: after each step count of ``at`` (ascending),
    until ``done`` says so of a point or ``max_train_s`` of training has passed."""

    at: tuple[int, ...]
    max_train_s: float = float("inf")
    done: Callable[[dict[str, Any]], bool] | None = None


def train_curve(step: Callable[[], object], run_state: RunState, schedule: Schedule,
                score: Callable[[], dict[str, Any]]) -> list[dict[str, Any]]:
    """Train to each of ``schedule.at`` in turn, timing only the steps, and ``score()`` in
    between with the clock stopped. Points: ``step``, ``train_s`` (training seconds so far) and
    the scores."""
    device, points, train_s = run_state.device, [], 0.0
    for target in schedule.at:
        synchronize(device)
        start = time.perf_counter()
        while run_state.step < target:
            step()
        synchronize(device)
        train_s += time.perf_counter() - start
        points.append({"step": run_state.step, "train_s": train_s, **score()})
        if (schedule.done is not None and schedule.done(points[-1])) or train_s >= schedule.max_train_s:
            break
    return points


def first_reaching(points: list[dict[str, Any]], reached: Callable[[dict[str, Any]], bool]) -> dict[str, Any] | None:
    """The first point of a curve that ``reached`` accepts, or None."""
    return next((point for point in points if reached(point)), None)


def eval_network(run_state: RunState) -> torch.nn.Module:
    """A copy of the run's network to copy EMA weights into for scoring (the same architecture
    serves every run of one preset)."""
    return copy.deepcopy(run_state.ema).eval().requires_grad_(False)


def scoring_runtime(cfg: RunConfig, compiled: bool) -> RuntimeConfig:
    """The runtime settings the scoring network samples with: the run's, or the same uncompiled."""
    return cfg.runtime if compiled else dataclasses.replace(cfg.runtime, compile=Toggle.OFF)


@torch.no_grad()
def load_ema(target: torch.nn.Module, run_state: RunState, runner: StepRunner | PlainRunner) -> None:
    """Copy the runner's EMA weights (and the EMA network's buffers) into ``target`` in place."""
    synchronize(run_state.device)
    params: list[torch.Tensor] = list(target.parameters())
    torch._foreach_copy_(params, ema_tensors(run_state, runner))
    for mine, theirs in zip(target.buffers(), run_state.ema.buffers(), strict=True):
        mine.copy_(theirs)


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows]) + "\n"


class Deadline:
    """Wall-clock seconds left to a whole benchmark (``--deadline-s``), so one device call
    ends on time and says what it left out."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


def publish(record: dict[str, Any], text: str, json_path: Path | None, markdown_path: Path | None) -> None:
    """Print a bench's table; write its record (JSON) and the table (markdown) where asked."""
    from diffscale.io.atomic import write_text

    print(text)
    if json_path:
        write_text(json_path, json.dumps(record, indent=1))
    if markdown_path:
        write_text(markdown_path, text)
