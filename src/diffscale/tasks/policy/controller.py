"""A trained policy as a robot's control loop calls it: one observation in, one action out.

``Controller`` keeps what diffusion policy's and LeRobot's ``select_action`` keep: the last
``obs_horizon`` observations (the first one repeated at an episode's start, as training
windows are padded) and the queue of planned actions. When the queue is empty it plans an
action chunk from the history and queues ``action_horizon`` of its actions, from index
``obs_horizon - 1`` (the step the newest observation belongs to). Noise comes from the
controller's own CPU generator, seeded by ``reset(seed)``: every plan draws fresh noise, and
an episode reset with the same seed repeats exactly.

One denoising loop serves both samplers. DDPM's ancestral step is DDIM's update with ``eta``
1 on the clipped prediction's noise, from each timestep to the next one visited (diffusers'
``DDPMScheduler.step``, the same arithmetic), so the noise of every step is drawn before the
loop and passed in; nothing is drawn inside. The step is not diffusers' call itself but its
coefficients, computed once per controller from the run's diffusers scheduler
(``diffusion.ddim.ddpm_steps`` / ``ddim_steps``, as sampling runs them: its ``alphas_cumprod``
and the timesteps its ``set_timesteps`` chooses): diffusers recomputes the schedule on the host at
every step, which on the CPU at batch 1 costs as much as a compiled network call. On a CUDA
network that records loops (``InferenceNetwork.loops``), the whole loop is recorded once as
one CUDA graph and replayed per plan for either sampler. DPM-Solver++ keeps diffusers' step:
it is multistep, its state kept in the scheduler.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, overload

import numpy as np
import torch

from diffscale.diffusion import SamplerKind
from diffscale.diffusion.ddim import ddim_steps, ddpm_steps
from diffscale.diffusion.graphed import LoopCache
from diffscale.diffusion.sampler import set_distinct_timesteps
from diffscale.errors import SEED_MAX, ArgumentError, UserError

DEFAULT_SAMPLER = "ddpm"
"""The sampler unless one is named: DDPM, the process the run trained, as ``diffscale eval``
and the reference evaluate (DDIM's deterministic path from a briefly trained policy more
often ends between the routes)."""
ObsLike = np.ndarray | torch.Tensor


class Controller:
    """``select_action(obs)`` per control step for a policy ``task`` and its ``network``.

    ``network``: the EMA weights, as given (``sampling_network`` for the compiled network
    ``diffscale sample`` runs; ``diffscale.policy.Controller.load`` does that). ``sampler``:
    ``ddpm`` or ``ddim``; ``steps``: denoising steps per plan. ``reset(seed)`` must name a seed
    before the first episode; later resets without one continue the generator."""

    def __init__(self, task: Any, network: torch.nn.Module, *, sampler: str = DEFAULT_SAMPLER,
                 steps: int = 10) -> None:
        if getattr(task, "name", None) != "policy":  # the task module imports this one: no isinstance
            raise UserError(f"a policy controller needs a policy run, not a '{task.name}' run",
                            "load a run trained with task: policy (e.g. --preset policy-tiny)")
        try:
            self.kind = SamplerKind(str(sampler).lower())
        except ValueError:
            raise UserError(f"unknown sampler '{sampler}'", "use ddpm, ddim or dpmsolver") from None
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ArgumentError(f"steps={steps!r}: a plan needs a whole number of denoising steps, at least one",
                                "pass steps >= 1, or leave steps out for the run's train.sample_steps")
        self.task, self.network = task, network
        self.obs_norm, self.action_norm = task._norms()
        self.obs_dim, self.action_dim = task.obs_dim, task.action_dim
        self.obs_horizon, self.action_horizon = task.model.obs_horizon, task.model.action_horizon
        self.pred_horizon = task.model.pred_horizon
        self.steps = min(int(steps), task.diffusion.num_timesteps)
        self.schedule = ddpm_steps(task.diffusion.ddpm_scheduler(), self.steps) if self.kind == SamplerKind.DDPM \
            else ddim_steps(task.diffusion.ddim_scheduler(), self.steps)
        """DDPM's or DDIM's update per denoising step, from the run's scheduler, as sampling runs them."""
        self.generator = torch.Generator()
        self.planned_shapes: set[tuple[int, ...]] = set()
        """Shapes of the plans run so far with the compiled network's guards checked."""
        self.seeded = False
        self.history: torch.Tensor | None = None
        """The last ``obs_horizon`` observations (B, To, O) of this episode, or None before its first."""
        self.queue: torch.Tensor | None = None
        """Planned actions not yet taken (B, Ta, A), the next at ``queued``."""
        self.queued = 0

    # -- the control loop ---------------------------------------------------------------------
    def reset(self, seed: int | None = None) -> None:
        """Start an episode (or a batch of them): forget the history and the queue. ``seed``
        reseeds the noise (the episode then repeats exactly); without one the generator goes
        on from the last episode, which needs a seed on the first reset."""
        if seed is None and not self.seeded:
            raise UserError("the controller's first reset() has no seed",
                            "call reset(seed) with an int before the first episode (later resets may omit it)")
        if seed is not None:
            if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed <= SEED_MAX:
                raise ArgumentError(f"reset(seed={seed!r}): a seed is a whole number from 0 to 2**63 - 1",
                                    "pass e.g. reset(seed=0); the same seed repeats the episode exactly")
            self.generator.manual_seed(int(seed))
            self.seeded = True
        self.history, self.queue, self.queued = None, None, 0

    @overload
    def select_action(self, obs: np.ndarray) -> np.ndarray: ...

    @overload
    def select_action(self, obs: torch.Tensor) -> torch.Tensor: ...

    def select_action(self, obs: ObsLike) -> ObsLike:
        """The action for observation ``obs``: (O,) -> (A,), or a batch of environments
        (B, O) -> (B, A), in the data's units (numpy in, numpy out; a tensor gives a CPU tensor).
        Plans again once ``action_horizon`` actions of the last plan were taken."""
        if not self.seeded:
            raise UserError("select_action before the controller was reset with a seed",
                            "call reset(seed) at the start of every episode (the first with a seed)")
        single = np.ndim(obs) == 1
        step = self._checked(obs)
        if self.history is None:
            self.history = step[:, None].repeat(1, self.obs_horizon, 1)
        elif step.shape[0] != self.history.shape[0]:
            raise UserError(f"{step.shape[0]} observations where this episode started with {self.history.shape[0]}",
                            "keep one batch size per episode: call reset() before a batch of another size")
        else:
            self.history = torch.cat([self.history[:, 1:], step[:, None]], dim=1)
        if self.queue is None or self.queued == self.queue.shape[1]:
            start = self.obs_horizon - 1
            self.queue, self.queued = self.plan(self.history)[:, start: start + self.action_horizon], 0
        action = self.queue[:, self.queued]
        self.queued += 1
        action = action[0] if single else action
        return action if isinstance(obs, torch.Tensor) else action.numpy()

    def _checked(self, obs: ObsLike) -> torch.Tensor:
        """``obs`` as a (B, O) float32 CPU tensor, refused where its size is not the policy's or
        where it holds NaN or infinite values."""
        if not isinstance(obs, torch.Tensor):
            obs = np.asarray(obs)
            if obs.dtype.kind not in "iuf":
                raise ArgumentError(f"select_action(obs) got an array of {obs.dtype} values, not numbers",
                                    f"pass the observation as {self.obs_dim} numbers (a float array)")
        elif obs.is_complex() or obs.dtype == torch.bool:
            raise ArgumentError(f"select_action(obs) got a tensor of {obs.dtype}, not real numbers",
                                f"pass the observation as {self.obs_dim} real numbers")
        step = torch.as_tensor(obs).detach().cpu()
        if step.dim() == 1:
            step = step[None]
        if step.dim() != 2 or step.shape[1] != self.obs_dim or step.shape[0] == 0:
            raise UserError(f"an observation of shape {tuple(np.shape(obs))} does not fit this policy",
                            f"pass one observation of {self.obs_dim} values ({self.obs_dim},) or a batch of "
                            f"environments (B, {self.obs_dim})")
        step = step.to(torch.float32)
        if not bool(torch.isfinite(step).all()):
            row = int(torch.nonzero(~torch.isfinite(step))[0, 0])
            raise UserError(f"the observation of environment {row} holds NaN or infinite values",
                            "pass the environment's finite observation (check its sensors or its reset)")
        return step

    # -- planning ------------------------------------------------------------------------------
    @torch.no_grad()
    def plan(self, history: torch.Tensor) -> torch.Tensor:
        """Action chunks (B, T, A) on the CPU, in the data's units, for observation histories
        (B, To, O) in the data's units, with fresh noise from the controller's generator."""
        batch, device = history.shape[0], self.task.device
        shape = (batch, self.pred_horizon, self.action_dim)
        x = torch.randn(shape, generator=self.generator)
        condition: tuple[torch.Tensor, ...] = (self.obs_norm.normalize(history.to(torch.float32)).flatten(1),)
        if self.kind == SamplerKind.DDPM:
            condition += (torch.randn((self.steps, *shape), generator=self.generator),)
        x, condition = x.to(device), tuple(c.to(device) for c in condition)
        loops = getattr(self.network, "loops", None)
        if self.kind == SamplerKind.DPMSOLVER:  # multistep state kept in its scheduler: a network call at a time
            out = self.dpmsolver(x, condition[0])
        elif isinstance(loops, LoopCache):  # the whole loop as one replayed CUDA graph
            key = ("policy", self.kind.value, self.steps, tuple(x.shape), tuple(c.shape for c in condition))
            step = getattr(self.network, "loop_step")  # noqa: B009 (an InferenceNetwork's; a Module to mypy)
            out = loops.run(key, self.loop(step), x, condition)
        else:
            with self._known_inputs(tuple(x.shape)):
                out = self.loop(self.network)(x, condition)
        if self.task.diffusion.cfg.clip_sample:
            out = out.clamp(-1, 1)
        return self.action_norm.unnormalize(out.float().cpu())

    def _known_inputs(self, shape: tuple[int, ...]) -> contextlib.AbstractContextManager[Any]:
        """Where a plan of this shape ran before, dynamo's guards on the compiled network are not
        checked again (``skip_guard_eval_unsafe``; with entries for several batch sizes, only the
        guards that tell them apart): re-plans differ from the first only in values, and checking
        every guard at each of a plan's network calls was about a tenth of a CPU re-plan. A new
        shape (another batch of environments) runs with every guard checked, compiling its entry."""
        if shape in self.planned_shapes:
            return torch.compiler.set_stance("default", skip_guard_eval_unsafe=True)
        self.planned_shapes.add(shape)
        return contextlib.nullcontext()

    def dpmsolver(self, x: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        """DPM-Solver++ over ``x`` (B, T, A) given ``obs`` (B, To * O): deterministic, as DDIM."""
        scheduler = self.task.diffusion.dpmsolver_scheduler()
        set_distinct_timesteps(scheduler, self.steps)
        for t in scheduler.timesteps:
            t_batch = torch.full((x.shape[0],), int(t), device=x.device, dtype=torch.long)
            x = scheduler.step(self.network(x, t_batch, obs).float(), t, x).prev_sample
        return x

    def loop(self, call: Callable[..., torch.Tensor]) -> Callable[[torch.Tensor, tuple[torch.Tensor, ...]],
                                                                   torch.Tensor]:
        """The denoising loop over ``x`` (B, T, A) given ``(obs (B, To * O)[, noise (S, B, T, A)])``,
        calling the denoiser ``call(x_t, t, obs)``: DDIM with ``eta`` 0, or with ``eta`` 1 and the
        given per-step noise, which is DDPM's ancestral step."""
        schedule, ddpm = self.schedule, self.kind == SamplerKind.DDPM

        def body(x: torch.Tensor, condition: tuple[torch.Tensor, ...]) -> torch.Tensor:
            for i, step in enumerate(schedule):
                t_batch = torch.full((x.shape[0],), step.timestep, device=x.device, dtype=torch.long)
                x = step(x, call(x, t_batch, condition[0]).float(), condition[1][i] if ddpm else None)
            return x
        return body
