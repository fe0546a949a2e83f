"""The reverse processes against denoisers known in closed form: Gaussian data N(0, s^2), whose
exact noise prediction is eps(x_t, t) = x_t sqrt(1 - abar_t) / (abar_t s^2 + 1 - abar_t)."""

import pytest
import torch

from diffscale.config import DiffusionConfig
from diffscale.diffusion import GaussianDiffusion, Sampler, SamplerKind, sample


def _exact_denoiser(diffusion: GaussianDiffusion, std: float):
    abar = diffusion.ddpm_scheduler().alphas_cumprod.to(torch.float64)

    def denoise(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        a = abar[t].view(-1, 1).to(x.dtype)
        return x * (1 - a).sqrt() / (a * std**2 + 1 - a)
    return denoise


def _std_error(kind: SamplerKind, steps: int, std: float = 0.5) -> float:
    """|std of the samples - the data's std| with the exact denoiser (the mean stays 0 for each)."""
    diffusion = GaussianDiffusion(DiffusionConfig(clip_sample=False))
    x, _ = sample(_exact_denoiser(diffusion, std), diffusion, (4000, 4), sampler=Sampler(kind, steps),
                  generator=torch.Generator().manual_seed(0), device=torch.device("cpu"))
    assert x.shape == (4000, 4) and abs(float(x.mean())) < 0.01
    return abs(float(x.std()) - std)


@pytest.mark.parametrize("kind", list(SamplerKind))
def test_each_sampler_reaches_the_data_distribution_as_steps_grow(kind):
    errors = [_std_error(kind, steps) for steps in (10, 50, 200)]
    assert errors[0] > max(errors[1:]) and errors[-1] < 0.015  # DPM-Solver++ has converged by 50


@pytest.mark.parametrize("steps", [10, 50])
def test_dpmsolver_is_closer_than_ddim_at_the_same_steps(steps):
    assert _std_error(SamplerKind.DPMSOLVER, steps) < _std_error(SamplerKind.DDIM, steps)


def test_dpmsolver_clips_each_clean_sample_prediction_where_ddim_does():
    clipping = GaussianDiffusion(DiffusionConfig(clip_sample=True)).dpmsolver_scheduler()
    free = GaussianDiffusion(DiffusionConfig(clip_sample=False)).dpmsolver_scheduler()
    x0 = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(0)) * 3
    assert clipping.config.thresholding and not free.config.thresholding
    assert torch.equal(clipping._threshold_sample(x0), x0.clamp(-1, 1))  # what DDIM's clip_sample does


def test_dpmsolver_at_as_many_steps_as_trained_gives_finite_samples():
    """The field preset's 50 trained steps sampled in 50: linspace spacing repeats a timestep."""
    from diffscale import config as C
    from diffscale.diffusion.process import GaussianDiffusion
    from diffscale.diffusion.sampler import set_distinct_timesteps

    diffusion = GaussianDiffusion(C.DiffusionConfig(num_train_timesteps=50, beta_schedule=C.BetaSchedule.COSINE,
                                                    prediction_type=C.Prediction.V_PREDICTION, clip_sample=False))
    scheduler = diffusion.dpmsolver_scheduler()
    set_distinct_timesteps(scheduler, 50)
    assert sorted(scheduler.timesteps.tolist()) == list(range(50))
    x, generator = torch.randn(4, 8), torch.Generator().manual_seed(0)
    for t in scheduler.timesteps:
        x = scheduler.step(0.1 * torch.randn(4, 8, generator=generator), t, x).prev_sample
    assert torch.isfinite(x).all()
    images = diffusion.dpmsolver_scheduler()
    set_distinct_timesteps(images, 20)  # no repeats: the spacing the quality tables measured is kept
    assert images.config.timestep_spacing == "linspace"


def test_field_presets_start_any_step_count_at_the_last_trained_timestep():
    """Leading spacing started 20 of the field preset's 50 trained steps at 38: a noisier start
    than trained for, and a worse CRPS than 10 or 50 steps."""
    from diffscale import config as C
    from diffscale.diffusion.process import GaussianDiffusion

    fields = C.resolve_config(C.ConfigSources(preset="field-icon", device="cpu", overrides=[]))
    images = C.resolve_config(C.ConfigSources(preset="tiny", device="cpu", overrides=[]))
    for steps in (10, 20, 50):
        for scheduler in (GaussianDiffusion(fields.diffusion).ddim_scheduler(),
                          GaussianDiffusion(fields.diffusion).ddpm_scheduler()):
            scheduler.set_timesteps(steps)
            assert int(scheduler.timesteps[0]) == 49 and len(scheduler.timesteps) == steps
    ddim = GaussianDiffusion(images.diffusion).ddim_scheduler()  # images keep diffusers' default
    ddim.set_timesteps(20)
    assert images.diffusion.timestep_spacing == C.TimestepSpacing.LEADING and int(ddim.timesteps[0]) == 950


def test_min_snr_weights_each_samples_error_by_its_timestep():
    """diffusion.loss_weighting min-snr: min(SNR_t, 5) / SNR_t for epsilon (1 where SNR_t < 5: the
    noisy timesteps; less at the clean ones), / (SNR_t + 1) for v, and the loss is the weighted
    mean of each sample's squared error; ``none`` keeps the plain mean."""
    from diffscale.config import LossWeighting, Prediction
    from diffscale.diffusion.process import min_snr_weights

    plain = GaussianDiffusion(DiffusionConfig())
    weighted = GaussianDiffusion(DiffusionConfig(loss_weighting=LossWeighting.MIN_SNR))
    abar = plain.ddpm_scheduler().alphas_cumprod.double()
    snr = abar / (1 - abar)
    eps = min_snr_weights(abar.float(), Prediction.EPSILON, 5.0).double()
    assert torch.allclose(eps, torch.minimum(snr, torch.tensor(5.0, dtype=torch.float64)) / snr, rtol=1e-5)
    assert eps[-1] == 1.0 and eps[0] < 0.001  # the noisiest step counts fully, the cleanest ~5 / 9999
    v = min_snr_weights(abar.float(), Prediction.V_PREDICTION, 5.0).double()
    assert torch.allclose(v, torch.minimum(snr, torch.tensor(5.0, dtype=torch.float64)) / (snr + 1), rtol=1e-5)
    zero_snr = torch.tensor([0.5, 0.0])  # a schedule ending at zero SNR (abar_T = 0)
    assert min_snr_weights(zero_snr, Prediction.EPSILON, 5.0).tolist() == [1.0, 1.0]

    generator = torch.Generator().manual_seed(0)
    x0, noise = torch.randn(3, 1, 4, 4, generator=generator), torch.randn(3, 1, 4, 4, generator=generator)
    prediction, t = torch.randn(3, 1, 4, 4, generator=generator), torch.tensor([0, 500, 999])
    errors = (prediction - noise).square().flatten(1).mean(dim=1)
    assert torch.allclose(plain.loss(prediction, x0, noise, t), errors.mean())
    expected = (errors * eps.float()[t]).mean()
    assert torch.allclose(weighted.loss(prediction, x0, noise, t), expected)
    assert not torch.allclose(expected, errors.mean())
