"""The offline collapse criterion on synthetic loss curves, and reading a run's metrics.jsonl."""

from __future__ import annotations

import json
import math

import numpy as np

from benchmarks.suite.collapse import Criterion, judge, read_metrics

STEPS = list(range(10, 610, 10))  # 60 records, as tiny logs every 10 steps for 600 steps


def _healthy(seed: int = 0, noise: float = 0.15) -> list[float]:
    """A diffusion loss falling from ~1 to ~0.15, each record off by up to ``noise`` of its level."""
    rng = np.random.default_rng(seed)
    level = 0.15 + 0.85 * np.exp(-np.array(STEPS) / 60)
    return list(level * (1 + rng.uniform(-noise, noise, len(STEPS))))


def test_a_loss_that_jumps_and_stays_up_collapsed_at_the_jump():
    losses = _healthy()
    jump = STEPS.index(300)
    losses[jump:] = [0.44 * (1 + 0.1 * math.sin(i)) for i in range(len(losses) - jump)]  # 0.15 -> 0.44, stays
    verdict = judge(STEPS, losses, warmup_steps=100)
    assert verdict.collapsed
    assert 300 <= verdict.step <= 330  # the trailing median sees it within a few records
    assert "stayed above 1.4x" in verdict.reason and verdict.peak_ratio > 2.5
    assert 0.14 < verdict.min_loss < 0.17 and 0.4 < verdict.final_loss < 0.5


def test_a_noisy_healthy_loss_with_spikes_is_not_a_collapse():
    for seed in range(5):
        losses = _healthy(seed, noise=0.3)
        for spike in (20, 35, 50):  # single records five times the level, falling back at once
            losses[spike] *= 5
        verdict = judge(STEPS, losses, warmup_steps=100)
        assert not verdict.collapsed, verdict.reason
        assert verdict.reason == "" and verdict.step is None


def test_a_jump_that_falls_back_or_creeps_up_only_a_little_is_not_a_collapse():
    losses = _healthy()
    losses[30:36] = [0.6] * 6  # six records up, then back to the level
    assert not judge(STEPS, losses, warmup_steps=100).collapsed
    creeping = _healthy(noise=0.02)
    creeping[40:] = [v * 1.35 for v in creeping[40:]]  # up by less than 1.4x, for good
    assert not judge(STEPS, creeping, warmup_steps=100).collapsed


def test_a_jump_in_the_last_records_cannot_be_told_from_a_spike():
    losses = _healthy(noise=0.02)
    losses[-4:] = [0.5] * 4  # the trailing median of 5 rises at the 3rd of them: 2 records remain
    assert not judge(STEPS, losses, warmup_steps=100).collapsed
    losses[-5:] = [0.5] * 5  # 3 records remain: enough
    assert judge(STEPS, losses, warmup_steps=100).collapsed


def test_a_collapse_during_the_warm_up_is_caught_after_it_and_the_factors_are_settable():
    losses = [1.0, 0.6, 0.35, 0.25, 0.2, 0.18] + [0.6] * (len(STEPS) - 6)  # up at step 70 of 100 warm-up steps
    verdict = judge(STEPS, losses, warmup_steps=100)
    assert verdict.collapsed and verdict.step == 110
    mild = _healthy(noise=0.02)
    mild[30:] = [v * 1.3 for v in mild[30:]]
    assert not judge(STEPS, mild, warmup_steps=100).collapsed
    assert judge(STEPS, mild, warmup_steps=100, criterion=Criterion(jump=1.2, stay=1.15)).collapsed
    # a collapse before the loss settled (tiny at lr 8e-3 on flat): 0.31 -> ~0.52 at the warm-up's end, for good
    falling = [0.536, 0.437, 0.402, 0.358, 0.328, 0.327, 0.313, 0.332, 0.381]
    shallow = falling + [0.52 * (1 + 0.03 * math.sin(i)) for i in range(len(STEPS) - len(falling))]
    assert judge(STEPS, shallow, warmup_steps=100).collapsed


def test_a_nan_loss_or_a_failed_run_is_a_collapse():
    losses = _healthy()
    losses[40] = math.nan
    verdict = judge(STEPS, losses, warmup_steps=100)
    assert verdict.collapsed and verdict.step == 410 and verdict.reason == "non-finite loss (nan) at step 410"
    losses[40] = math.inf
    assert judge(STEPS, losses, warmup_steps=100).collapsed
    failed = judge(STEPS, _healthy(), warmup_steps=100, exit_code=2)
    assert failed.collapsed and failed.reason == "the run failed (exit 2)"
    assert not judge(STEPS, _healthy(), warmup_steps=100, exit_code=85).collapsed  # stopped by the budget
    assert judge([], [], warmup_steps=100, exit_code=None).collapsed  # never ran to an end
    assert not judge([], [], warmup_steps=100).collapsed


def test_metrics_give_the_curve_restores_skipped_steps_and_evaluations(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [{"step": 10, "loss": 0.5, "nonfinite_skipped": 0}, {"kind": "first_step", "step": 1, "seconds": 3.0},
             {"step": 20, "loss": 0.4, "nonfinite_skipped": 0},
             {"kind": "divergence", "step": 20, "restored_step": 10},
             {"step": 20, "loss": 0.3, "nonfinite_skipped": 2},  # trained again after the restore
             {"step": 30, "loss": float("nan"), "nonfinite_skipped": 2},
             {"kind": "divergence", "step": 30}, {"kind": "eval", "step": 30, "fd": 12.5}]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n{\"step\": 40, \"lo")  # cut short by a kill
    metrics = read_metrics(path)
    assert metrics.steps == [10, 20, 30] and metrics.losses[:2] == [0.5, 0.3] and math.isnan(metrics.losses[2])
    assert metrics.restores == 2 and metrics.nonfinite_skipped == 2 and metrics.evals == [lines[-1]]
    assert read_metrics(tmp_path / "absent.jsonl").steps == []
