"""DDIM's update as per-step coefficients (``diffusion.ddim.ddim_steps``): the same samples as
diffusers' ``DDIMScheduler.step`` it stands for, for DDIM (``eta`` 0) and DDPM's ancestral step
(``eta`` 1 with the clipped prediction's noise), with and without clipping, over the timestep
spacings the config allows, every prediction type and several step counts."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from diffusers import DDIMScheduler
from diffusers.schedulers import scheduling_ddpm

from diffscale.config import BetaSchedule, DiffusionConfig, Prediction, TimestepSpacing
from diffscale.diffusion import GaussianDiffusion, Sampler, SamplerKind, sample
from diffscale.diffusion.ddim import ddim_steps
from diffscale.diffusion.sampler import ddim_loop, guided


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


# -- sampling on the coefficients: sample() and the recorded loop against diffusers' schedulers --------
class _TinyDenoiser(torch.nn.Module):
    """A fixed random two-layer network of (x (B, 16, 2), t (B,)[, shift (B,)]): stands in for a
    trained one."""

    def __init__(self, trained: int) -> None:
        super().__init__()
        with torch.random.fork_rng():  # the same weights every time, the global generator left as it was
            torch.manual_seed(0)
            self.inner, self.outer, self.trained = torch.nn.Linear(3, 32), torch.nn.Linear(32, 2), trained

    def forward(self, x: torch.Tensor, t: torch.Tensor, *condition: torch.Tensor) -> torch.Tensor:
        time = (t.to(x.dtype) / self.trained).view(-1, 1, 1).expand(*x.shape[:-1], 1)
        shift = condition[0].view(-1, 1, 1) if condition else 0.0
        return self.outer(torch.tanh(self.inner(torch.cat([x, time], dim=-1)))) + shift


def _diffusion(spacing: str, clip: bool, prediction: str, trained: int) -> GaussianDiffusion:
    return GaussianDiffusion(DiffusionConfig(num_train_timesteps=trained, beta_schedule=BetaSchedule.COSINE,
                                             clip_sample=clip, prediction_type=Prediction(prediction),
                                             timestep_spacing=TimestepSpacing(spacing)))


@torch.no_grad()
def _diffusers_loop(network: torch.nn.Module, diffusion: GaussianDiffusion, kind: SamplerKind, steps: int,
                    x: torch.Tensor, generator: torch.Generator, dtype: torch.dtype,
                    condition: tuple[torch.Tensor, ...] = ()) -> torch.Tensor:
    """The loop ``sample`` ran before on diffusers' ``DDIMScheduler.step`` (``eta`` 0) or
    ``DDPMScheduler.step`` (noise from ``generator``), schedule, network and sample in ``dtype``."""
    scheduler = diffusion.ddim_scheduler() if kind == SamplerKind.DDIM else diffusion.ddpm_scheduler()
    scheduler.alphas_cumprod = scheduler.alphas_cumprod.to(dtype)
    if kind == SamplerKind.DDIM:
        scheduler.final_alpha_cumprod = scheduler.final_alpha_cumprod.to(dtype)
    else:
        scheduler.one = scheduler.one.to(dtype)
    scheduler.set_timesteps(steps)
    x, net = x.to(dtype), copy.deepcopy(network).to(dtype)
    for t in scheduler.timesteps:
        out = net(x, torch.full((x.shape[0],), int(t), dtype=torch.long), *(c.to(dtype) for c in condition))
        extra = {"eta": 0.0} if kind == SamplerKind.DDIM else {"generator": generator}
        x = scheduler.step(out, t, x, **extra).prev_sample
    return x


def _float32_noise(shape, generator=None, device=None, dtype=None, **_):
    """diffusers' ``randn_tensor`` drawing float32 noise cast to ``dtype``: the float64 reference
    loop gets the float32 loop's noise (a float64 draw takes other values)."""
    return torch.randn(shape, generator=generator, dtype=torch.float32).to(dtype)


@pytest.mark.parametrize("kind", [SamplerKind.DDIM, SamplerKind.DDPM])
@pytest.mark.parametrize(("spacing", "steps", "trained"), [("leading", 10, 100), ("leading", 30, 100),
                                                            ("trailing", 7, 50), ("trailing", 15, 50)])
@pytest.mark.parametrize(("prediction", "clip"), [("epsilon", True), ("epsilon", False), ("v_prediction", False),
                                                  ("sample", True)])
def test_sample_runs_diffusers_ddim_and_ddpm_to_float32_rounding(kind, spacing, steps, trained, prediction, clip,
                                                                 monkeypatch):
    """``sample``'s DDIM and DDPM (on the per-step coefficients) against the loop it ran before on
    diffusers' schedulers, in float32 and in float64: as close to float64 as float32 allows
    (``_assert_follows``), from the same seed. DDPM draws the same noise: the generator ends where
    diffusers' float32 loop leaves it. Trailing spacing of 7 or 15 of 50 steps visits timesteps
    unevenly (DDPM's own previous timesteps, not DDIM's fixed stride)."""
    network, diffusion = _TinyDenoiser(trained).eval(), _diffusion(spacing, clip, prediction, trained)
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(4, 16, 2, generator=generator)
    start = generator.get_state()
    ours, _ = sample(network, diffusion, (4, 16, 2), sampler=Sampler(kind, steps), generator=generator,
                     device=torch.device("cpu"), x_init=x)
    reference_generator = torch.Generator().set_state(start)
    single = _diffusers_loop(network, diffusion, kind, steps, x, reference_generator, torch.float32)
    assert torch.equal(reference_generator.get_state(), generator.get_state())
    monkeypatch.setattr(scheduling_ddpm, "randn_tensor", _float32_noise)
    double = _diffusers_loop(network, diffusion, kind, steps, x, torch.Generator().set_state(start), torch.float64)
    bounded = (lambda v: v.clamp(-1, 1)) if clip else (lambda v: v)
    _assert_follows(bounded(single).double(), bounded(double), ours.double())
    if kind == SamplerKind.DDPM:  # the noise matters: another seed's samples end elsewhere
        other = torch.Generator().manual_seed(4)
        assert not torch.allclose(sample(network, diffusion, (4, 16, 2), sampler=Sampler(kind, steps),
                                         generator=other, device=torch.device("cpu"), x_init=x)[0], ours, atol=1e-3)


class _Guided(torch.nn.Module):
    """``guided`` over a network, its conditional and unconditional inputs fixed (B,) each."""

    def __init__(self, network: torch.nn.Module, given: torch.Tensor, unconditional: torch.Tensor,
                 guidance: float) -> None:
        super().__init__()
        self.network, self.guidance = network, guidance
        self.register_buffer("given", given)
        self.register_buffer("unconditional", unconditional)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return guided(self.network, x, t, (self.given,), (self.unconditional,), self.guidance)


@pytest.mark.parametrize("guidance", [None, 2.0])
@pytest.mark.parametrize(("spacing", "steps", "trained", "prediction", "clip"),
                         [("leading", 10, 100, "epsilon", True), ("trailing", 15, 50, "v_prediction", False)])
def test_the_recorded_ddim_loop_runs_diffusers_ddim_to_float32_rounding(guidance, spacing, steps, trained,
                                                                         prediction, clip):
    """``ddim_loop`` (what a CUDA graph records; run eagerly here) against diffusers'
    ``DDIMScheduler.step`` loop, with and without classifier-free guidance."""
    network, diffusion = _TinyDenoiser(trained).eval(), _diffusion(spacing, clip, prediction, trained)
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(4, 16, 2, generator=generator)
    given, unconditional = torch.randn(4, generator=generator), torch.zeros(4)
    condition = (given,) if guidance is None else (given, unconditional)
    with torch.no_grad():
        ours = ddim_loop(SimpleNamespace(loop_step=network), diffusion, steps, guidance)(x, condition)
    reference = network if guidance is None else _Guided(network, given, unconditional, guidance)
    extra = (given,) if guidance is None else ()
    single, double = (_diffusers_loop(reference, diffusion, SamplerKind.DDIM, steps, x, generator, dtype, extra)
                      for dtype in (torch.float32, torch.float64))
    _assert_follows(single.double(), double, ours.double())
