"""DDIM's update (and DDPM's ancestral one, DDIM's with ``eta`` 1) as per-step coefficients:
the one implementation of both that sampling, the recorded loops and the policy controller run.

diffusers' ``DDIMScheduler.step`` recomputes every step's schedule values on the host from
0-dim tensors (square roots, the variance, the previous timestep) and then runs a dozen small
tensor operations: at batch 1 on the CPU, where the network itself is a compiled call of under a
millisecond, that host work is a large part of a step. The schedule of one
(scheduler, step count) is fixed, so :func:`ddim_steps` computes each step's coefficients
once, from the scheduler's own ``alphas_cumprod`` and the timesteps its ``set_timesteps``
chooses, and a step is then five or six fused tensor operations with the same arithmetic
(``tests/unit/test_ddim.py`` holds them to ``DDIMScheduler.step`` and ``DDPMScheduler.step``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from diffusers import DDIMScheduler, DDPMScheduler


@dataclass(frozen=True)
class DDIMStep:
    """One step from timestep ``timestep``, given the sample ``x`` and the network's output ``out``
    (both (B, ...)): ``x0 = x0_x * x + x0_out * out``, clipped to [-clip, clip] unless ``clip`` is
    None, then ``x_prev = prev_x0 * x0 + prev_x * x + prev_out * out + sigma * noise``."""

    timestep: int
    x0_x: float
    x0_out: float
    clip: float | None
    prev_x0: float
    prev_x: float
    prev_out: float
    sigma: float

    def __call__(self, x: torch.Tensor, out: torch.Tensor, noise: torch.Tensor | None = None) -> torch.Tensor:
        """The sample at the previous timestep, shaped as ``x``; ``noise`` (shaped as ``x``) is
        the step's own draw where ``sigma`` is not 0 (DDPM), unused otherwise. Terms whose
        coefficient is 0 are skipped (decided by the schedule, so a recorded loop is fixed)."""
        x0 = out * self.x0_out if self.x0_x == 0 else torch.add(x * self.x0_x, out, alpha=self.x0_out)
        if self.clip is not None:
            x0 = x0.clamp_(-self.clip, self.clip)
        prev = x0.mul_(self.prev_x0)
        if self.prev_x:
            prev = prev.add_(x, alpha=self.prev_x)
        if self.prev_out:
            prev = prev.add_(out, alpha=self.prev_out)
        if self.sigma and noise is not None:
            prev = prev.add_(noise, alpha=self.sigma)
        return prev


def _prediction_terms(prediction: str, abar: float) -> tuple[float, float, float, float]:
    """(x0 from x, x0 from out, eps from x, eps from out) for the network's ``prediction`` type."""
    a, b = abar ** 0.5, (1.0 - abar) ** 0.5
    if prediction == "epsilon":
        return 1.0 / a, -b / a, 0.0, 1.0
    if prediction == "sample":
        return 0.0, 1.0, 1.0 / b, -a / b
    if prediction == "v_prediction":
        return a, -b, b, a
    raise ValueError(f"prediction type {prediction!r} is not one of epsilon, sample, v_prediction")


def ddim_steps(scheduler: DDIMScheduler, steps: int, *, eta: float = 0.0,
               clipped_output: bool = False) -> tuple[DDIMStep, ...]:
    """``scheduler.step(out, t, x, eta=eta, use_clipped_model_output=clipped_output,
    variance_noise=noise)`` for each timestep of ``scheduler.set_timesteps(steps)``, in order
    (the scheduler is left set to ``steps``). DDIM is ``eta`` 0; DDPM's ancestral step ``eta`` 1
    with ``clipped_output`` where the visited timesteps are evenly spaced (``ddpm_steps`` follows
    ``DDPMScheduler`` wherever they are not). The coefficients are computed in double precision
    and applied in the sample's dtype. Dynamic thresholding is not done here (no sampler of
    diffscale uses it with DDIM)."""
    config = scheduler.config
    if config.thresholding:
        raise ValueError("ddim_steps does not do dynamic thresholding; use DDIMScheduler.step")
    scheduler.set_timesteps(steps)
    stride = config.num_train_timesteps // steps  # diffusers' previous timestep, whatever the spacing
    pairs = [(t, t - stride) for t in scheduler.timesteps.tolist()]
    return _table(scheduler.alphas_cumprod, float(scheduler.final_alpha_cumprod), config, pairs, eta=eta,
                  clipped_output=clipped_output)


def ddpm_steps(scheduler: DDPMScheduler, steps: int) -> tuple[DDIMStep, ...]:
    """``scheduler.step(out, t, x, generator=...)`` (ancestral DDPM, ``fixed_small`` variance) for
    each timestep of ``scheduler.set_timesteps(steps)``: DDIM's update with ``eta`` 1 on the
    clipped prediction's noise, from each timestep to the next one it visits (its
    ``previous_timestep``: a trailing spacing of a step count that does not divide the trained
    timesteps visits them unevenly, where DDIM's fixed stride would not follow). The step's noise
    is ``sigma`` times the caller's draw, which ``DDPMScheduler`` makes where the timestep is above 0."""
    config = scheduler.config
    if config.thresholding or config.variance_type != "fixed_small":
        raise ValueError("ddpm_steps does ancestral steps of fixed_small variance without thresholding; "
                         "use DDPMScheduler.step")
    scheduler.set_timesteps(steps)
    pairs = [(int(t), int(scheduler.previous_timestep(t))) for t in scheduler.timesteps]
    return _table(scheduler.alphas_cumprod, 1.0, config, pairs, eta=1.0, clipped_output=True)


def _table(alphas_cumprod: torch.Tensor, final_alpha_cumprod: float, config: Any, pairs: list[tuple[int, int]], *,
           eta: float, clipped_output: bool) -> tuple[DDIMStep, ...]:
    """The steps from each timestep to its previous one (``pairs``; a previous timestep below 0
    has ``final_alpha_cumprod``), for a scheduler ``config``'s prediction type and clipping."""
    abar = alphas_cumprod.double()
    clip = float(config.clip_sample_range) if config.clip_sample else None
    table = []
    for t, t_prev in pairs:
        a = float(abar[t])
        a_prev = float(abar[t_prev]) if t_prev >= 0 else final_alpha_cumprod
        x0_x, x0_out, eps_x, eps_out = _prediction_terms(config.prediction_type, a)
        sigma = eta * ((1 - a_prev) / (1 - a) * (1 - a / a_prev)) ** 0.5
        direction = max(1 - a_prev - sigma ** 2, 0.0) ** 0.5
        if clipped_output:  # eps recomputed from the clipped x0: (x - sqrt(a) x0) / sqrt(1 - a)
            prev_x0 = a_prev ** 0.5 - direction * (a / (1 - a)) ** 0.5
            prev_x, prev_out = direction / (1 - a) ** 0.5, 0.0
        else:
            prev_x0, prev_x, prev_out = a_prev ** 0.5, direction * eps_x, direction * eps_out
        table.append(DDIMStep(int(t), x0_x, x0_out, clip, prev_x0, prev_x, prev_out, sigma))
    return tuple(table)
