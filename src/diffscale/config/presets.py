"""Typed preset functions. Each returns a complete, validated :class:`RunConfig`.

Widths, attention levels, resolutions and per-GPU batches of small..xl follow our
users' EMNIST training reference exactly: benchmarks compare recipes on these models.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from diffscale.config.choices import BetaSchedule, LrSchedule, Prediction, SamplerName, TimestepSpacing
from diffscale.config.models import FieldModelConfig, ModelConfig, PolicyModelConfig
from diffscale.config.schema import DataConfig, DiffusionConfig, OptimConfig, RunConfig, TrainConfig
from diffscale.errors import UserError, closest

REACH2D_OBS_DIM, REACH2D_ACTION_DIM = 4, 2
"""The built-in reach2d's observation and action sizes (the policy presets' data), written out so
the config layer imports no task code; tests/unit/test_policy.py holds them equal to the environment's."""


@dataclass(frozen=True)
class PresetInfo:
    name: str
    purpose: str
    build: Callable[[], RunConfig]
    params: int
    """The network's parameter count, for ``diffscale presets`` without building a network (and
    importing torch); tests/unit/test_config.py counts each network's parameters against it."""


def tiny() -> RunConfig:
    """CPU demo: 16 px font-rendered digits, a 3-level UNet of ~1.6 M parameters; recognisable
    samples within minutes on 2 cores (docs/benchmarks.md, "CPU demo"). v-prediction: a lower FD
    at 90 s and at the full 1,200 steps than predicting the noise (docs/benchmarks.md, "Time to
    quality (images)")."""
    return RunConfig(
        preset="tiny",
        model=ModelConfig(sample_size=16, block_out_channels=(32, 64, 64), attention=(False, False, True),
                          layers_per_block=2, norm_num_groups=16),
        data=DataConfig(source="builtin:numerals", shift_px=1),
        diffusion=DiffusionConfig(prediction_type=Prediction.V_PREDICTION),
        optim=OptimConfig(lr=1e-3, warmup_steps=100, schedule=LrSchedule.COSINE),
        train=TrainConfig(steps=1200, batch_per_gpu=64, ema_decay=0.995, log_every=10, checkpoint_every=200,
                          sample_every=0, sample_count=64),
    )


def small() -> RunConfig:
    """EMNIST-size: 28 px, widths (32, 64, 128), attention at levels 2 and 3, batch 2048 per GPU,
    v-prediction. Learning rate 1e-3 after 100 warm-up steps: at 2e-3 (which reached the plain
    recipe's quality soonest on the built-in glyphs) the loss collapsed on the data-set suite's
    `textures` in 1 of 3 seeds; 1e-3 held on all 18 runs of the suite (docs/decisions.md, "small: lr 1e-3")."""
    return RunConfig(
        preset="small",
        model=ModelConfig(sample_size=28, block_out_channels=(32, 64, 128), attention=(False, True, True)),
        data=DataConfig(source="builtin:mix", shift_px=1),
        diffusion=DiffusionConfig(prediction_type=Prediction.V_PREDICTION),
        optim=OptimConfig(lr=1e-3, warmup_steps=100),
        train=TrainConfig(steps=20_000, batch_per_gpu=2048, ema_decay=0.9995, log_every=50, checkpoint_every=1000,
                          sample_every=5000),
    )


def medium() -> RunConfig:
    """64 px, widths (64, 128, 256, 256), attention at level 3, batch 384 per GPU, v-prediction.
    Learning rate 6e-4 after 100 warm-up steps: on the data-set suite's `textures` (64 px) the loss
    collapsed as the warm-up ended in 2 of 2 seeds at 1.2e-3 (which reached the plain recipe's
    quality soonest on the built-in glyphs) and 1 of 2 at 8e-4; 6e-4 held on every set it ran
    (docs/decisions.md, "medium: lr 6e-4")."""
    return RunConfig(
        preset="medium",
        model=ModelConfig(sample_size=64, block_out_channels=(64, 128, 256, 256),
                          attention=(False, False, True, False)),
        data=DataConfig(source="builtin:mix", shift_px=2),
        diffusion=DiffusionConfig(prediction_type=Prediction.V_PREDICTION),
        optim=OptimConfig(lr=6e-4, warmup_steps=100),
        train=TrainConfig(steps=50_000, batch_per_gpu=384, ema_decay=0.9999, log_every=50, checkpoint_every=2000,
                          sample_every=10_000),
    )


def large() -> RunConfig:
    """96 px, widths (128, 128, 256, 256, 512), attention at level 4, batch 96 per GPU.
    v-prediction: over 150 s on one H200 its FD fell to 19 against 225 predicting the noise, at the
    same learning rate; at 3e-4 it ended worse (28) and at 6e-4 it diverged from step ~1,000 on
    (docs/benchmarks.md, "Time to quality (images)")."""
    return RunConfig(
        preset="large",
        model=ModelConfig(sample_size=96, block_out_channels=(128, 128, 256, 256, 512),
                          attention=(False, False, False, True, False)),
        data=DataConfig(source="builtin:mix", shift_px=3),
        diffusion=DiffusionConfig(prediction_type=Prediction.V_PREDICTION),
        optim=OptimConfig(lr=1e-4, warmup_steps=1000),
        train=TrainConfig(steps=100_000, batch_per_gpu=96, ema_decay=0.9999, log_every=50, checkpoint_every=2000,
                          sample_every=10_000),
    )


def xl() -> RunConfig:
    """128 px, widths (128, 128, 256, 256, 512, 512), attention at level 5, batch 32 per GPU.
    v-prediction: on the suite's `strokes` its FD after 1,500 steps was 6.5 against 270 predicting
    the noise (three seeds each), on `clouds` 50.6 against 69.1, summed over the suite's six sets
    118 against 429 (farther only on `flat` and `colour`), at the same learning rate
    (docs/decisions.md, "xl: v-prediction at large's learning rate")."""
    return RunConfig(
        preset="xl",
        model=ModelConfig(sample_size=128, block_out_channels=(128, 128, 256, 256, 512, 512),
                          attention=(False, False, False, False, True, False)),
        data=DataConfig(source="builtin:mix", shift_px=4),
        diffusion=DiffusionConfig(prediction_type=Prediction.V_PREDICTION),
        optim=OptimConfig(lr=1e-4, warmup_steps=1000),
        train=TrainConfig(steps=200_000, batch_per_gpu=32, ema_decay=0.9999, log_every=50, checkpoint_every=2000,
                          sample_every=10_000),
    )


def _field_diffusion(steps: int) -> DiffusionConfig:
    """The cosine schedule reaches pure noise in any number of steps (a linear one tuned for
    1000 steps stops at 60 % signal after 50). v-prediction: at the last step the signal is
    ~1e-3 of the noise, where recovering the field from a predicted noise amplifies its error
    ~1000 times; the velocity target keeps every step well conditioned, and standardised
    fields are unbounded, so no clipping. Trailing spacing: any number of sampling steps starts at
    the last of the 50 trained timesteps."""
    return DiffusionConfig(num_train_timesteps=steps, beta_schedule=BetaSchedule.COSINE,
                           prediction_type=Prediction.V_PREDICTION, clip_sample=False,
                           timestep_spacing=TimestepSpacing.TRAILING)


def field_icon() -> RunConfig:
    """The users' ICON coupling model: 7 coarse values (a cell and its neighbours) -> 256 fine
    values, a residual MLP of width 256, 50 diffusion steps, batch 16. 2,400 steps are one of
    their training rounds (10 epochs of a 3,840-sample buffer), on built-in data of that size."""
    return RunConfig(
        preset="field-icon",
        task="fields",
        model=FieldModelConfig(cond_dim=7, x_dim=256, hidden=256, depth=4, embed_dim=128),
        diffusion=_field_diffusion(50),
        data=DataConfig(source="builtin:fields:3840", shift_px=0),
        optim=OptimConfig(lr=1e-3, warmup_steps=100, schedule=LrSchedule.COSINE),
        train=TrainConfig(steps=2400, batch_per_gpu=16, ema_decay=0.995, log_every=100, checkpoint_every=600,
                          sample_every=0, sample_count=64),
    )


def field_large() -> RunConfig:
    """A wider, deeper field model for one or more GPUs: width 1024, 8 blocks, 1000 diffusion
    steps sampled in 50 DDIM steps, batch 512 per GPU on 16k built-in pairs."""
    return RunConfig(
        preset="field-large",
        task="fields",
        model=FieldModelConfig(cond_dim=7, x_dim=256, hidden=1024, depth=8, embed_dim=256),
        diffusion=_field_diffusion(1000),
        data=DataConfig(source="builtin:fields", shift_px=0),
        optim=OptimConfig(lr=5e-4, warmup_steps=500, schedule=LrSchedule.COSINE),
        train=TrainConfig(steps=20_000, batch_per_gpu=512, ema_decay=0.999, log_every=100, checkpoint_every=2000,
                          sample_every=5000, sample_count=64),
    )


def _policy_diffusion() -> DiffusionConfig:
    """Diffusion policy's process: DDPM with 100 squared-cosine steps, epsilon prediction."""
    return DiffusionConfig(num_train_timesteps=100, beta_schedule=BetaSchedule.COSINE,
                           prediction_type=Prediction.EPSILON)


def policy() -> RunConfig:
    """Diffusion policy's state-based model: ConditionalUnet1D of widths 256/512/1024 (65.35 M
    parameters at PushT's state sizes, 5 observation and 2 action values), To 2, T 16, Ta 8;
    AdamW 1e-4 (beta1 0.95, weight decay 1e-6) with 500 warm-up steps and cosine decay, EMA.
    Sized for the built-in reach2d; for other data set model.obs_dim/action_dim (0 follows the data)."""
    return RunConfig(
        preset="policy", task="policy",
        model=PolicyModelConfig(obs_dim=REACH2D_OBS_DIM, action_dim=REACH2D_ACTION_DIM, obs_horizon=2, pred_horizon=16,
                                action_horizon=8, down_dims=(256, 512, 1024), kernel_size=5, n_groups=8,
                                step_embed_dim=256),
        diffusion=_policy_diffusion(),
        data=DataConfig(source="builtin:reach2d", shift_px=0),
        optim=OptimConfig(lr=1e-4, beta1=0.95, weight_decay=1e-6, warmup_steps=500, schedule=LrSchedule.COSINE),
        train=TrainConfig(steps=20_000, batch_per_gpu=256, ema_decay=0.999, log_every=50, checkpoint_every=2000,
                          sample_every=5000, sample_count=16, sample_steps=10,
                          sample_sampler=SamplerName.DDPM),
    )


def policy_tiny() -> RunConfig:
    """CPU demo of a diffusion policy: the built-in reach2d, a one-level ConditionalUnet1D of width
    64 (0.2 M parameters), 800 steps of batch 64 (under a minute of one core). Its rollouts nearly
    always reach the goal, passing on both sides; two levels (32/64) cost more per step on a CPU and
    reached the goal no more often in as many steps (docs/decisions.md, "policy-tiny: one level of
    width 64")."""
    return RunConfig(
        preset="policy-tiny", task="policy",
        model=PolicyModelConfig(obs_dim=REACH2D_OBS_DIM, action_dim=REACH2D_ACTION_DIM, obs_horizon=2, pred_horizon=16,
                                action_horizon=8, down_dims=(64,), kernel_size=5, n_groups=8, step_embed_dim=32),
        diffusion=_policy_diffusion(),
        data=DataConfig(source="builtin:reach2d", shift_px=0),
        optim=OptimConfig(lr=2e-3, warmup_steps=50, schedule=LrSchedule.COSINE),
        train=TrainConfig(steps=800, batch_per_gpu=64, ema_decay=0.99, log_every=50, checkpoint_every=200,
                          sample_every=0, sample_count=16, sample_steps=10,
                          sample_sampler=SamplerName.DDPM),
    )


PRESETS: dict[str, PresetInfo] = {
    "tiny": PresetInfo("tiny", "CPU demo (minutes on a laptop)", tiny, 1_623_169),
    "small": PresetInfo("small", "EMNIST-size letters/digits on one GPU", small, 4_023_233),
    "medium": PresetInfo("medium", "64 px images; one GPU or a node", medium, 25_302_657),
    "large": PresetInfo("large", "96 px images; multi-GPU", large, 71_432_193),
    "xl": PresetInfo("xl", "128 px images; multi-node", xl, 113_668_609),
    "field-icon": PresetInfo("field-icon", "fields: the ICON coupling model (7 -> 256), CPU or one GPU", field_icon,
                             975_232),
    "field-large": PresetInfo("field-large", "fields: a larger MLP for one or more GPUs", field_large, 21_747_712),
    "policy": PresetInfo("policy", "diffusion policy, the reference's state-based model; one GPU or more", policy,
                         65_324_546),
    "policy-tiny": PresetInfo("policy-tiny", "diffusion policy CPU demo on builtin:reach2d (about a minute)",
                              policy_tiny, 195_874),
}


def get_preset(name: str) -> RunConfig:
    info = PRESETS.get(name)
    if info is None:
        raise UserError(f"unknown preset '{name}'{closest(name, PRESETS)}",
                        f"choose one of: {', '.join(PRESETS)} (see `diffscale presets`)")
    return info.build()
