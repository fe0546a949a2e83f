"""DDIM's update as per-step coefficients (``diffusion.ddim.ddim_steps``): the same samples as
diffusers' ``DDIMScheduler.step`` it stands for, for DDIM (``eta`` 0) and DDPM's ancestral step
(``eta`` 1 with the clipped prediction's noise), with and without clipping, over the timestep
spacings the config allows, every prediction type and several step counts."""

from __future__ import annotations

import pytest
import torch
from diffusers import DDIMScheduler

from diffscale.diffusion.ddim import ddim_steps


def _scheduler(spacing: str, clip: bool, prediction: str = "epsilon", trained: int = 100) -> DDIMScheduler:
    return DDIMScheduler(num_train_timesteps=trained, beta_schedule="squaredcos_cap_v2", clip_sample=clip,
                         prediction_type=prediction, timestep_spacing=spacing)


def _loops(spacing: str, clip: bool, prediction: str, steps: int, eta: float, trained: int = 100
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]:
    """The same seeded loop (a fixed stand-in network, the same per-step noise) through
    ``DDIMScheduler.step`` in float32 and in float64 and through the coefficients in float32:
    (diffusers' float32 samples, diffusers' float64 ones, ours, whether both visited the same timesteps)."""
    generator = torch.Generator().manual_seed(steps + int(10 * eta))
    x = torch.randn(3, 16, 2, generator=generator, dtype=torch.float64)
    noise = torch.randn(steps, 3, 16, 2, generator=generator, dtype=torch.float64)
    weight = torch.randn(2, 2, generator=generator, dtype=torch.float64)

    def network(sample: torch.Tensor, t: int) -> torch.Tensor:  # stands in for a denoiser: varies with x and t
        return torch.tanh(sample @ weight.to(sample.dtype)) * (1 + t / trained)

    ddpm = eta > 0
    references = []
    for dtype in (torch.float32, torch.float64):
        reference = _scheduler(spacing, clip, prediction, trained)
        reference.alphas_cumprod = reference.alphas_cumprod.to(dtype)
        reference.final_alpha_cumprod = reference.final_alpha_cumprod.to(dtype)
        reference.set_timesteps(steps)
        a = x.to(dtype)
        for i, t in enumerate(reference.timesteps):
            a = reference.step(network(a, int(t)), t, a, eta=eta, use_clipped_model_output=ddpm,
                               variance_noise=noise[i].to(dtype) if ddpm else None).prev_sample
        references.append(a.double())
    ours = ddim_steps(_scheduler(spacing, clip, prediction, trained), steps, eta=eta, clipped_output=ddpm)
    b = x.float()
    for i, step in enumerate(ours):
        b = step(b, network(b, step.timestep), noise[i].float() if ddpm else None)
    same = reference.timesteps.tolist() == [step.timestep for step in ours]
    return references[0], references[1], b.double(), same


def _assert_follows(single: torch.Tensor, double: torch.Tensor, ours: torch.Tensor) -> None:
    """Ours as close to diffusers' step in float64 as float32 allows: within 2e-5 (a hundred
    steps' rounding), or within twice diffusers' own float32 step's distance from it. Where a
    trailing schedule's first step divides by sqrt(abar) near 0 without clipping, float32
    rounding in either order of operations is amplified to 1e-3."""
    assert torch.isfinite(ours).all()
    ours_error, diffusers_error = (ours - double).abs().max(), (single - double).abs().max()
    assert ours_error <= max(2 * diffusers_error, 2e-5), (ours_error, diffusers_error)


@pytest.mark.parametrize("spacing", ["leading", "trailing"])
@pytest.mark.parametrize("clip", [True, False])
@pytest.mark.parametrize("eta", [0.0, 1.0])
@pytest.mark.parametrize("steps", [1, 3, 10, 30, 100])
def test_coefficients_give_what_ddim_scheduler_step_gives(spacing, clip, eta, steps):
    single, double, ours, same_timesteps = _loops(spacing, clip, "epsilon", steps, eta)
    assert same_timesteps
    _assert_follows(single, double, ours)
    if clip and steps > 1:  # clipping bites on these samples: without it they end elsewhere
        assert not torch.allclose(_loops(spacing, False, "epsilon", steps, eta)[2], ours, atol=1e-3)


@pytest.mark.parametrize("prediction", ["sample", "v_prediction"])
@pytest.mark.parametrize("eta", [0.0, 1.0])
@pytest.mark.parametrize("clip", [True, False])
def test_every_prediction_type_follows_diffusers(prediction, eta, clip):
    for spacing, steps, trained in (("leading", 10, 100), ("trailing", 7, 50)):
        single, double, ours, same_timesteps = _loops(spacing, clip, prediction, steps, eta, trained)
        assert same_timesteps
        _assert_follows(single, double, ours)


def test_ddpm_steps_add_their_noise_and_ddim_steps_none():
    ddpm = ddim_steps(_scheduler("leading", True), 10, eta=1.0, clipped_output=True)
    ddim = ddim_steps(_scheduler("leading", True), 10)
    assert all(step.sigma > 0 for step in ddpm[:-1]) and ddpm[-1].sigma == 0  # the last step lands on x0
    assert all(step.sigma == 0 for step in ddim)
    x, out = torch.randn(1, 16, 2), torch.randn(1, 16, 2)
    assert not torch.equal(ddpm[0](x, out, torch.zeros_like(x)), ddpm[0](x, out, torch.ones_like(x)))


def test_thresholding_is_refused():
    scheduler = DDIMScheduler(num_train_timesteps=100, thresholding=True)
    with pytest.raises(ValueError, match="thresholding"):
        ddim_steps(scheduler, 10)
