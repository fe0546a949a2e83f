"""Evaluation of a field model: its sampled ensembles scored against climatology, a deterministic
MLP of the same size trained on the same data, and (for the built-in generator) the ideal forecast.

Scores are in the data's own units, averaged over every case and value (see probabilistic.py).
Given held-out pairs (``diffscale eval --data npz:HELDOUT``) the cases are theirs; else on
built-in data they are held out (drawn from the generator with another seed) and the ideal
forecast is known; on files they are rows of the training data (``held_out`` 0, and eval says so).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch
from torch.optim.swa_utils import AveragedModel

from diffscale.config import FieldModelConfig, RunConfig
from diffscale.io.stages import stage
from diffscale.tasks.fields.data import HELD_OUT_SEED, FieldData
from diffscale.tasks.fields.scores import Forecasts, score
from diffscale.tasks.fields.standardise import Standardiser


class EvaluatedTask(Protocol):
    """What the evaluation reads of a ``FieldTask`` (a protocol: task.py imports this module)."""

    cfg: RunConfig
    model_cfg: FieldModelConfig
    device: torch.device
    stats: Standardiser

    @property
    def x_shape(self) -> tuple[int, ...]: ...

    def training_data(self) -> FieldData: ...

    def num_items(self) -> int: ...

    def build_network(self) -> torch.nn.Module: ...

    def examples(self, batch: dict[str, torch.Tensor], rows: slice) -> dict[str, torch.Tensor]: ...

    def sample_for(self, network: torch.nn.Module, cond: Any, *, members: int, steps: int, seed: int,
                   sampler: str = "ddim") -> torch.Tensor: ...

BASELINE_MAX_STEPS = 5000
"""The deterministic baseline trains for the run's ``train.steps``, at most this many (a
regression converges long before a diffusion model does)."""


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


def evaluate_fields(task: EvaluatedTask, network: torch.nn.Module, out_dir: Path, *, steps: int, members: int,
                    seed: int, cases: int, held_out: FieldData | None = None,
                    sampler: str = "ddim") -> dict[str, float]:
    """Sample, score and plot (``out_dir/evaluation.png``); returns the scores. ``held_out``: the
    pairs to score on (default: new pairs of the built-in generator, else rows of the training data)."""
    data = task.training_data()
    cases = min(cases, len(held_out.cond if held_out is not None else data.cond))
    cond, truth, ideal, is_held_out = _cases(data, held_out, cases, seed)
    stage(f"evaluating: {members} members for each of {cases} conditions")
    ensemble = task.sample_for(network, cond, members=members, steps=steps, seed=seed, sampler=sampler)
    stage(f"evaluating: training the deterministic baseline ({min(task.cfg.train.steps, BASELINE_MAX_STEPS)} "
          "steps) it is scored against")
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


def train_baseline(task: EvaluatedTask, *, seed: int) -> tuple[torch.nn.Module, int]:
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
def predict(task: EvaluatedTask, baseline: torch.nn.Module, cond: torch.Tensor) -> torch.Tensor:
    """The baseline's fields (N, *F) in data units for conditions (N, C), on the CPU."""
    cond = task.stats.cond(cond.to(task.device))
    zeros = torch.zeros((cond.shape[0], *task.x_shape), device=task.device)
    t = torch.zeros(cond.shape[0], dtype=torch.long, device=task.device)
    return task.stats.x_back(baseline(zeros, t, cond)).cpu()
