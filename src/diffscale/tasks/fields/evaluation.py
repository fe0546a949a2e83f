"""Evaluation of a field model: its sampled ensembles scored against climatology, a deterministic
MLP of the same size trained on the same data, and (for the built-in generator) the ideal forecast.

Scores are in the data's own units, averaged over every case and value (see probabilistic.py).
Given held-out pairs (``diffscale eval --data npz:HELDOUT``) the cases are theirs; else on
built-in data they are held out (drawn from the generator with another seed) and the ideal
forecast is known; on files they are rows of the training data (``held_out`` 0, and eval says so).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch.optim.swa_utils import AveragedModel

from diffscale.evaluation import probabilistic as P
from diffscale.tasks.fields.data import HELD_OUT_SEED, FieldData

if TYPE_CHECKING:
    from diffscale.tasks.fields.task import FieldTask

BASELINE_MAX_STEPS = 5000
"""The deterministic baseline trains for the run's ``train.steps``, at most this many (a
regression converges long before a diffusion model does)."""


@dataclass
class Forecasts:
    """Everything scored, in data units on the CPU: N cases, M members, F = x_shape."""

    cond: torch.Tensor
    """(N, C) conditions."""
    truth: torch.Tensor
    """(N, *F) observed fields."""
    ensemble: torch.Tensor
    """(N, M, *F) the diffusion model's members."""
    climatology: torch.Tensor
    """(N, M, *F) training fields drawn at random, whatever the condition."""
    deterministic: torch.Tensor
    """(N, *F) the MLP baseline's prediction."""
    ideal: tuple[torch.Tensor, torch.Tensor] | None
    """Mean and std (N, *F) of the ideal Gaussian forecast, where known."""


def _cases(data: FieldData, held_out: FieldData | None, cases: int,
           seed: int) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None, bool]:
    """(cond, truth, the ideal forecast where known, whether the pairs are held out): ``cases`` rows
    of the given held-out pairs; else new pairs of the built-in generator; else training rows."""
    if held_out is None and data.generator is not None:
        cond, truth = data.generator.sample(cases, HELD_OUT_SEED)
        return cond, truth, data.generator.ideal(cond), True
    source = held_out if held_out is not None else data
    rows = torch.randperm(len(source.cond), generator=torch.Generator().manual_seed(seed))[:cases]
    cond, truth = source.cond[rows], source.x[rows]
    ideal = source.generator.ideal(cond) if source.generator is not None else None
    return cond, truth, ideal, held_out is not None


def evaluate_fields(task: FieldTask, network: torch.nn.Module, out_dir: Path, *, steps: int, members: int, seed: int,
                    cases: int, held_out: FieldData | None = None, sampler: str = "ddim") -> dict[str, float]:
    """Sample, score and plot (``out_dir/evaluation.png``); returns the scores. ``held_out``: the
    pairs to score on (default: new pairs of the built-in generator, else rows of the training data)."""
    data = task.training_data()
    cases = min(cases, len(held_out.cond if held_out is not None else data.cond))
    cond, truth, ideal, is_held_out = _cases(data, held_out, cases, seed)
    ensemble = task.sample_for(network, cond, members=members, steps=steps, seed=seed, sampler=sampler)
    picks = torch.randint(0, len(data.x), (cases * members,), generator=torch.Generator().manual_seed(seed + 1))
    climatology = data.x[picks].view(cases, members, *task.x_shape)
    baseline, baseline_steps = train_baseline(task, seed=seed)
    forecasts = Forecasts(cond, truth, ensemble, climatology, predict(task, baseline, cond), ideal)
    scores = score(forecasts, task.model_cfg.coarse_index)
    # counts stay whole numbers in eval's JSON and table
    scores.update(held_out=float(is_held_out), cases=cases, members=members, sampling_steps=steps,
                  baseline_steps=baseline_steps)
    from diffscale.tasks.fields.plots import plot_evaluation

    plot_evaluation(forecasts, scores, out_dir / "evaluation.png")
    return scores


def score(f: Forecasts, coarse_index: int) -> dict[str, float]:
    """The scores of ``f``; the conservation error where the condition holds the coarse value."""
    point = f.deterministic.unsqueeze(1)
    out = {
        "crps": float(P.crps_ensemble(f.ensemble, f.truth).mean()),
        "crps_climatology": float(P.crps_ensemble(f.climatology, f.truth).mean()),
        "crps_mlp": float(P.crps_ensemble(point, f.truth).mean()),
        "spread_skill": P.spread_skill_ratio(f.ensemble, f.truth),
        "rank_histogram_deviation": P.rank_histogram_deviation(P.rank_histogram(f.ensemble, f.truth)),
        "rmse_ensemble_mean": float((f.ensemble.mean(1) - f.truth).pow(2).mean().sqrt()),
        "rmse_mlp": float((f.deterministic - f.truth).pow(2).mean().sqrt()),
        "p99_error": P.quantile_error(f.ensemble.flatten(0, 1), f.truth, 0.99),
        "p99_error_mlp": P.quantile_error(f.deterministic, f.truth, 0.99),
        "p99_error_climatology": P.quantile_error(f.climatology.flatten(0, 1), f.truth, 0.99),
        "roughness_ratio": P.roughness_ratio(f.ensemble.flatten(0, 1), f.truth),
        "roughness_ratio_mlp": P.roughness_ratio(f.deterministic, f.truth),
    }
    out["crps_skill_vs_climatology"] = 1 - out["crps"] / out["crps_climatology"]
    out["crps_skill_vs_mlp"] = 1 - out["crps"] / out["crps_mlp"]
    if f.ideal is not None:
        out["crps_ideal"] = float(P.crps_gaussian(f.ideal[0], f.ideal[1], f.truth).mean())
    if coarse_index >= 0:
        coarse = f.cond[:, coarse_index]
        several = f.truth.dim() == 3  # (N, D, K): the coarse value belongs to field 0

        def field0(x: torch.Tensor) -> torch.Tensor:
            return x[..., 0] if several else x

        out["conservation_error"] = P.conservation_error(field0(f.ensemble), coarse[:, None])
        out["conservation_error_mlp"] = P.conservation_error(field0(f.deterministic), coarse)
        out["conservation_error_data"] = P.conservation_error(field0(f.truth), coarse)
    return out


def train_baseline(task: FieldTask, *, seed: int) -> tuple[torch.nn.Module, int]:
    """A deterministic MLP: the task's network with the noise input and timestep fixed at zero,
    trained to regress the standardised field from the condition (mean squared error) with the
    run's optimizer settings, batch and EMA rule. Returns its EMA weights and the steps trained."""
    cfg, device = task.cfg, task.device
    steps = min(cfg.train.steps, BASELINE_MAX_STEPS)
    batch = min(cfg.train.batch_per_gpu * cfg.train.grad_accum, task.num_items())
    torch.manual_seed(seed)
    net = task.build_network().to(device)
    decay = cfg.train.ema_decay

    def ema_rule(averaged: torch.Tensor, current: torch.Tensor, count: torch.Tensor | int) -> torch.Tensor:
        rate = min(decay, (1 + float(count)) / (10 + float(count)))  # the training loop's EMA warm-up
        return rate * averaged + (1 - rate) * current

    ema = AveragedModel(net, avg_fn=ema_rule)
    o = cfg.optim
    opt = torch.optim.AdamW(net.parameters(), lr=o.lr, betas=(o.beta1, o.beta2), weight_decay=o.weight_decay)
    warmup = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(1, o.warmup_steps)))
    generator = torch.Generator(device=device).manual_seed(seed)
    zero_t = torch.zeros(batch, dtype=torch.long, device=device)
    for _ in range(steps):
        rows = torch.randint(0, task.num_items(), (batch,), generator=generator, device=device)
        clean = task.examples({"indices": rows}, slice(None))
        loss = torch.nn.functional.mse_loss(net(torch.zeros_like(clean["x"]), zero_t, clean["cond"]), clean["x"])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if o.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(net.parameters(), o.grad_clip)
        opt.step()
        warmup.step()
        ema.update_parameters(net)
    return ema.module.eval(), steps


@torch.no_grad()
def predict(task: FieldTask, baseline: torch.nn.Module, cond: torch.Tensor) -> torch.Tensor:
    """The baseline's fields (N, *F) in data units for conditions (N, C), on the CPU."""
    cond = task.stats.cond(cond.to(task.device))
    zeros = torch.zeros((cond.shape[0], *task.x_shape), device=task.device)
    t = torch.zeros(cond.shape[0], dtype=torch.long, device=task.device)
    return task.stats.x_back(baseline(zeros, t, cond)).cpu()
