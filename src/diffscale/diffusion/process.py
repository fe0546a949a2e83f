"""Forward process q(x_t | x_0) and the denoising loss, built from diffusers' DDPMScheduler.

The noise schedule comes from diffusers (so an exported model samples identically
with ``DDPMPipeline``); the per-step arithmetic is done here on the device without
host synchronisation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from diffusers import DDIMScheduler, DDPMScheduler

from diffscale.config import DiffusionConfig, LossWeighting, Prediction

if TYPE_CHECKING:
    from diffusers import DPMSolverMultistepScheduler


class GaussianDiffusion:
    """x_t = sqrt(abar_t) x_0 + sqrt(1 - abar_t) eps, and the loss on the network's prediction."""

    def __init__(self, cfg: DiffusionConfig) -> None:
        self.cfg = cfg
        self.num_timesteps = cfg.num_train_timesteps
        self.prediction = cfg.prediction_type
        scheduler = self.ddpm_scheduler()
        abar = scheduler.alphas_cumprod.to(torch.float32)
        self._sqrt_abar = abar.sqrt()
        self._sqrt_one_minus_abar = (1.0 - abar).sqrt()
        self._weights = min_snr_weights(abar, cfg.prediction_type, cfg.min_snr_gamma) \
            if cfg.loss_weighting == LossWeighting.MIN_SNR else None
        self._cache: dict[torch.device, tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] = {}

    def scheduler_kwargs(self) -> dict:
        return dict(
            num_train_timesteps=self.cfg.num_train_timesteps,
            beta_schedule=self.cfg.beta_schedule.value,
            beta_start=self.cfg.beta_start,
            beta_end=self.cfg.beta_end,
            prediction_type=self.cfg.prediction_type.value,
            clip_sample=self.cfg.clip_sample,
        )

    def ddpm_scheduler(self) -> DDPMScheduler:
        return DDPMScheduler(**self.scheduler_kwargs(), timestep_spacing=self.cfg.timestep_spacing.value)

    def ddim_scheduler(self) -> DDIMScheduler:
        return DDIMScheduler(**self.scheduler_kwargs(), timestep_spacing=self.cfg.timestep_spacing.value)

    def dpmsolver_scheduler(self) -> DPMSolverMultistepScheduler:
        """DPM-Solver++ (second order, multistep). It has no ``clip_sample``; with it set, each
        step's clean-sample prediction is clipped to [-1, 1] as DDIM's is, through its dynamic
        thresholding with a maximum of 1 (the threshold max(1, quantile) capped at 1 is 1).
        Imported here: its module imports scipy, which a training start does not need."""
        from diffusers import DPMSolverMultistepScheduler

        kwargs = self.scheduler_kwargs()
        clip = kwargs.pop("clip_sample")
        return DPMSolverMultistepScheduler(**kwargs, algorithm_type="dpmsolver++", solver_order=2,
                                           thresholding=bool(clip), sample_max_value=1.0)

    def _tables(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The per-timestep tables on ``device``: sqrt(abar), sqrt(1 - abar) and the loss weights
        (None: unweighted)."""
        if device not in self._cache:
            weights = None if self._weights is None else self._weights.to(device)
            self._cache[device] = (self._sqrt_abar.to(device), self._sqrt_one_minus_abar.to(device), weights)
        return self._cache[device]

    def _per_row(self, x0: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """sqrt(abar_t) and sqrt(1 - abar_t) of each row, shaped to broadcast over x0's other dimensions."""
        a, s, _ = self._tables(x0.device)
        shape = (-1,) + (1,) * (x0.dim() - 1)
        return a[t].view(shape), s[t].view(shape)

    def q_sample(self, x0: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """Noised samples. x0, noise: (B, ...) (images (B, C, H, W), vectors (B, D), ...); t: (B,) timesteps."""
        a, s = self._per_row(x0, t)
        return a * x0 + s * noise

    def target(self, x0: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        if self.prediction == Prediction.EPSILON:
            return noise
        if self.prediction == Prediction.SAMPLE:
            return x0
        a, s = self._per_row(x0, t)
        return a * noise - s * x0

    def loss(self, prediction: torch.Tensor, x0: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """Mean squared error against the configured target, in fp32, each sample's weighted by its
        timestep's ``diffusion.loss_weighting``. Returns a scalar."""
        target = self.target(x0, noise, t).float()
        weights = self._tables(t.device)[2]
        if weights is None:
            return torch.nn.functional.mse_loss(prediction.float(), target)
        per_sample = (prediction.float() - target).square().flatten(1).mean(dim=1)
        return (per_sample * weights[t]).mean()


def min_snr_weights(alphas_cumprod: torch.Tensor, prediction: Prediction, gamma: float) -> torch.Tensor:
    """Min-SNR-gamma loss weight of each training timestep (Hang et al. 2023, "Efficient Diffusion
    Training via Min-SNR Weighting Strategy"), for the loss on ``prediction``'s target. SNR_t =
    abar_t / (1 - abar_t), what diffusers' ``training_utils.compute_snr`` returns; that module is
    not imported for it, as it imports transformers and peft where they are installed."""
    snr = alphas_cumprod.double() / (1.0 - alphas_cumprod.double())
    clipped = snr.clamp(max=gamma)
    if prediction == Prediction.EPSILON:  # min(SNR, gamma) / SNR tends to 1 where SNR reaches 0
        weights = torch.where(snr > 0, clipped / snr.clamp(min=torch.finfo(torch.float64).tiny), 1.0)
    elif prediction == Prediction.V_PREDICTION:
        weights = clipped / (snr + 1.0)
    else:
        weights = clipped
    return weights.float()
