"""Reverse process: DDIM (default), DPM-Solver++ (fewer steps for the same quality) or ancestral
DDPM, on diffusers' schedules: DDIM's and DDPM's steps through their per-step coefficients
(diffusion/ddim.py, shared with the recorded loops and the policy controller), DPM-Solver++
through diffusers' scheduler.

Progress: whoever waits for the samples installs a :class:`SamplingProgress` with
:func:`reporting` (``diffscale sample`` shows a bar on a terminal, a line per stage in a log).
It travels in a context variable rather than as an argument, so sampling reports through
any task's ``generate`` without every task passing it on; with none installed, nothing is
reported.
"""

from __future__ import annotations

import contextlib
import contextvars
import enum
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from diffscale.diffusion.ddim import DDIMStep, ddim_steps, ddpm_steps
from diffscale.diffusion.graphed import LoopCache
from diffscale.diffusion.process import GaussianDiffusion


class SamplerKind(str, enum.Enum):
    DDIM = "ddim"
    DDPM = "ddpm"
    DPMSOLVER = "dpmsolver"


@dataclass(frozen=True)
class Sampler:
    kind: SamplerKind = SamplerKind.DDIM
    steps: int = 50


@dataclass(frozen=True)
class Conditioned:
    """The denoiser ``x_t, t -> network(x_t, t, *condition)`` (under ``autocast`` when given).

    With ``unconditional`` (the condition that stands for none, e.g. the "no class" label), the
    prediction is classifier-free guided: eps_u + ``guidance`` (eps_c - eps_u) (:func:`guided`).

    Passed to :func:`sample` instead of a closure, it lets a DDIM loop on a network that
    records loops (``InferenceNetwork.loops``) run as one replayed CUDA graph."""

    network: Callable[..., torch.Tensor]
    condition: tuple[torch.Tensor, ...] = ()
    autocast: Callable[[], contextlib.AbstractContextManager[Any]] | None = None
    unconditional: tuple[torch.Tensor, ...] | None = None
    """Shaped like ``condition``: the input of the unconditional prediction; None: no guidance."""
    guidance: float = 1.0
    """The guidance scale w (1: the conditional prediction alone, 0: the unconditional one)."""

    def __call__(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        if self.autocast is None:
            return guided(self.network, x, t, self.condition, self.unconditional, self.guidance)
        with self.autocast():
            return guided(self.network, x, t, self.condition, self.unconditional, self.guidance)


def guided(network: Callable[..., torch.Tensor], x: torch.Tensor, t: torch.Tensor, condition: tuple[torch.Tensor, ...],
           unconditional: tuple[torch.Tensor, ...] | None, guidance: float) -> torch.Tensor:
    """Classifier-free guidance: eps_u + ``guidance`` (eps_c - eps_u), eps_c the prediction for
    ``condition`` and eps_u for ``unconditional``, both from one network call on the doubled batch
    (x (B, ...) twice, each condition (B, ...) with its unconditional rows after it). Scale 1 calls
    the network on ``condition`` alone and 0 on ``unconditional`` alone: the same outputs, half
    the work. Without ``unconditional``: ``network(x, t, *condition)``."""
    if unconditional is None or guidance == 1.0:
        return network(x, t, *condition)
    if guidance == 0.0:
        return network(x, t, *unconditional)
    both = network(torch.cat([x, x]), torch.cat([t, t]),
                   *(torch.cat([c, u]) for c, u in zip(condition, unconditional, strict=True)))
    eps_c, eps_u = both.float().chunk(2)
    return eps_u + guidance * (eps_c - eps_u)


@contextlib.contextmanager
def evaluating(network: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """``network`` in eval mode inside the block, in training mode again after it if it was.
    A network already in eval mode is not walked: setting the mode visits every module, twice
    per call, a large share of a short action chunk's host time (docs/decisions.md, "No diffusers
    scheduler built per call on the recorded loop")."""
    was_training = network.training
    if was_training:
        network.eval()
    try:
        yield network
    finally:
        if was_training:
            network.train()


class SamplingProgress(Protocol):
    def start(self, kind: SamplerKind, steps: int, count: int) -> None:
        """Sampling ``count`` samples with ``steps`` denoising steps begins."""
        ...

    def advance(self, done: int) -> None:
        """``done`` of the steps are finished."""
        ...

    def finish(self) -> None:
        """Sampling ended (also after an error)."""
        ...


_PROGRESS: contextvars.ContextVar[SamplingProgress | None] = contextvars.ContextVar("sampling_progress",
                                                                                    default=None)


@contextlib.contextmanager
def reporting(progress: SamplingProgress) -> Iterator[SamplingProgress]:
    """Report the progress of every :func:`sample` call inside the block to ``progress``."""
    token = _PROGRESS.set(progress)
    try:
        yield progress
    finally:
        _PROGRESS.reset(token)


@torch.no_grad()
def sample(
    denoise: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    diffusion: GaussianDiffusion,
    shape: tuple[int, ...],
    *,
    sampler: Sampler,
    generator: torch.Generator,
    device: torch.device,
    trajectory_every: int = 0,
    x_init: torch.Tensor | None = None,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Draw samples of ``shape`` (B, ...). ``denoise(x_t, t)`` returns the network's prediction
    (a conditional task closes over its condition).

    Returns the final samples on the CPU and, when ``trajectory_every`` is set, the
    intermediate ones every that many steps (for GIFs). ``x_init`` replaces
    the initial noise (ranks sharing one seeded draw each denoise their own rows).
    """
    steps = min(sampler.steps, diffusion.num_timesteps)
    # Noise from a CPU generator: the same seed gives the same images on every device.
    x = (x_init if x_init is not None else torch.randn(shape, generator=generator)).to(device)
    frames: list[torch.Tensor] = []
    progress = _PROGRESS.get()
    loops = _recorded_loops(denoise, sampler, trajectory_every)
    if loops is not None:  # the whole loop as one replayed CUDA graph (DDIM without noise: nothing drawn inside)
        # No scheduler is made here: the recorded loop holds its schedule, and building diffusers'
        # scheduler took longer on the host than the replayed 10-step action chunk on the GPU.
        assert isinstance(denoise, Conditioned)
        if progress is not None:
            progress.start(sampler.kind, steps, shape[0])  # DDIM runs exactly `steps` timesteps
        try:
            x = _replayed(loops, denoise, diffusion, steps, x)
            if progress is not None:
                progress.advance(steps)
        finally:
            if progress is not None:
                progress.finish()
        return _bounded(x, diffusion).cpu(), frames
    updates = _updates(diffusion, sampler.kind, steps, generator)
    if progress is not None:
        progress.start(sampler.kind, len(updates), shape[0])
    try:
        for i, (t, update) in enumerate(updates):
            t_batch = torch.full((shape[0],), t, device=device, dtype=torch.long)
            x = update(x, denoise(x, t_batch).float())
            if trajectory_every and (i % trajectory_every == 0 or i == len(updates) - 1):
                frames.append(_bounded(x, diffusion).cpu())
            if progress is not None:
                progress.advance(i + 1)
    finally:
        if progress is not None:
            progress.finish()
    return _bounded(x, diffusion).cpu(), frames


Update = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""One reverse step: (the sample x_t, the network's fp32 output) -> the sample at the previous timestep."""


def _updates(diffusion: GaussianDiffusion, kind: SamplerKind, steps: int,
             generator: torch.Generator) -> list[tuple[int, Update]]:
    """The timesteps ``kind`` visits in ``steps`` steps, each with its update. DDIM and DDPM run
    the per-step coefficients of diffusion/ddim.py (the arithmetic of diffusers' ``DDIMScheduler``
    and ``DDPMScheduler`` steps, as the recorded loops and the policy controller run it); DDPM's
    noise is drawn from ``generator`` as ``DDPMScheduler.step`` draws it: at each timestep above 0,
    on the generator's device. DPM-Solver++ keeps the previous steps' outputs in its scheduler."""
    scheduler = _scheduler(diffusion, kind)
    set_distinct_timesteps(scheduler, steps)  # DDPM too: ancestral steps strided over the trained timesteps
    if kind == SamplerKind.DPMSOLVER:
        return [(int(t), functools.partial(_solver_step, scheduler, t)) for t in scheduler.timesteps]
    table = ddim_steps(scheduler, steps) if kind == SamplerKind.DDIM else ddpm_steps(scheduler, steps)
    noise = generator if kind == SamplerKind.DDPM else None
    return [(step.timestep, functools.partial(_table_step, step, noise)) for step in table]


def _solver_step(scheduler: Any, t: torch.Tensor, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    return scheduler.step(out, t, x).prev_sample


def _table_step(step: DDIMStep, generator: torch.Generator | None, x: torch.Tensor,
                out: torch.Tensor) -> torch.Tensor:
    noise = None
    if generator is not None and step.timestep > 0:
        noise = torch.randn(out.shape, generator=generator, device=generator.device, dtype=out.dtype).to(out.device)
    return step(x, out, noise)


def set_distinct_timesteps(scheduler: Any, steps: int) -> None:
    """``scheduler.set_timesteps(steps)`` with no timestep twice: DPM-Solver++'s "linspace" spacing
    rounds to a repeated timestep when ``steps`` nears the trained count (50 of 50 repeats 24), and
    its update divides by the zero step between them (NaN samples). "trailing" spacing, which starts
    at the last trained timestep as linspace does, has no repeats."""
    scheduler.set_timesteps(steps)
    if len(torch.unique(scheduler.timesteps)) < len(scheduler.timesteps):
        scheduler.register_to_config(timestep_spacing="trailing")
        scheduler.set_timesteps(steps)


def _scheduler(diffusion: GaussianDiffusion, kind: SamplerKind) -> Any:
    """A fresh diffusers scheduler of ``kind`` (DPM-Solver++ keeps the previous steps' outputs)."""
    if kind == SamplerKind.DDIM:
        return diffusion.ddim_scheduler()
    if kind == SamplerKind.DPMSOLVER:
        return diffusion.dpmsolver_scheduler()
    return diffusion.ddpm_scheduler()


def _recorded_loops(denoise: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], sampler: Sampler,
                    trajectory_every: int) -> LoopCache | None:
    """Where ``sample`` replays a recorded loop: DDIM, no trajectory, a network that records
    loops (``InferenceNetwork`` on CUDA), called as it sets its own precision. DPM-Solver++ and
    DDPM take the per-call path: the same samples, each network call still its own replayed graph."""
    if not isinstance(denoise, Conditioned) or denoise.autocast is not None:
        return None
    if sampler.kind != SamplerKind.DDIM or trajectory_every:
        return None
    loops = getattr(denoise.network, "loops", None)
    return loops if isinstance(loops, LoopCache) else None


def _replayed(loops: LoopCache, denoise: Conditioned, diffusion: GaussianDiffusion, steps: int,
              x: torch.Tensor) -> torch.Tensor:
    """``steps`` DDIM steps from ``x`` as the recorded loop of ``denoise`` (recorded at its first use)."""
    inputs = denoise.condition + (denoise.unconditional or ())
    scale = None if denoise.unconditional is None else denoise.guidance
    key = (tuple(x.shape), tuple((c.shape, c.dtype) for c in inputs), steps, id(diffusion), scale)
    return loops.run(key, ddim_loop(denoise.network, diffusion, steps, scale), x, inputs)


def ddim_loop(network: Any, diffusion: GaussianDiffusion, steps: int,
              guidance: float | None = None) -> Callable[[torch.Tensor, tuple[torch.Tensor, ...]], torch.Tensor]:
    """The DDIM loop :func:`sample` runs step by step, as one function to record: each step's
    coefficients are fixed host-side numbers (diffusion/ddim.py), computed when it is recorded.
    With ``guidance``, the loop's condition holds the conditional inputs followed by as many
    unconditional ones (:func:`guided`)."""
    def body(x: torch.Tensor, condition: tuple[torch.Tensor, ...]) -> torch.Tensor:
        half = len(condition) // 2
        given, unconditional = (condition, None) if guidance is None else (condition[:half], condition[half:])
        for step in ddim_steps(diffusion.ddim_scheduler(), steps):
            t_batch = torch.full((x.shape[0],), step.timestep, device=x.device, dtype=torch.long)
            eps = guided(network.loop_step, x, t_batch, given, unconditional, 1.0 if guidance is None else guidance)
            x = step(x, eps.float())
        return x
    return body


def _bounded(x: torch.Tensor, diffusion: GaussianDiffusion) -> torch.Tensor:
    """Samples in [-1, 1] where the data lives there (``diffusion.clip_sample``), else as they are."""
    return x.clamp(-1, 1) if diffusion.cfg.clip_sample else x
