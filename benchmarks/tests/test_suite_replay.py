"""The guard replayed on finished runs' curves at another log_every (benchmarks/suite/replay.py),
on two logged curves of 2026-11-29: a collapse early in a run, and a healthy bump."""

from __future__ import annotations

import json

from benchmarks.suite import replay
from benchmarks.suite.collapse import read_metrics
from benchmarks.tests.suite_micro import MICRO
from diffscale.cli import main
from diffscale.config import TrainConfig
from diffscale.runtime import checkpoint as ckpt
from diffscale.training.guard import GuardState
from diffscale.training.guard import judge as guard_judge

# tiny at lr 8e-3 on the suite's `clouds` (CI CPU): 10-step windows, the loss doubled at step ~80-90
# and stayed; padded to 400 steps at its level
CLOUDS = [0.462, 0.308, 0.237, 0.209, 0.194, 0.19, 0.192, 0.274, 0.417, 0.405, 0.396, 0.376, 0.408, 0.402, 0.41,
          0.393, 0.402, 0.388, 0.39, 0.371, 0.377, 0.374, 0.381, 0.394, 0.389, 0.381, 0.391, 0.372, 0.37, 0.391]
CLOUDS += [0.38, 0.385, 0.375, 0.39] * 2 + [0.38, 0.385]
# xl on `strokes`, seed 0 (two H200), steps 450-800 of a healthy run: a 40-step bump of 1.5 x that fell back
XL_BUMP = [0.0081, 0.0063, 0.0055, 0.0057, 0.0062, 0.0078, 0.0063, 0.0071, 0.0062, 0.0057, 0.0063, 0.0061, 0.006,
           0.006, 0.0062, 0.0059, 0.0092, 0.0077, 0.01, 0.0092, 0.0058, 0.0064, 0.0061, 0.0054, 0.0049, 0.006,
           0.0068, 0.005, 0.0043, 0.0054, 0.0042, 0.0063, 0.0041, 0.005, 0.0049, 0.006]


def _run(folder, losses, first_step=10, warmup=100):
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(f"optim:\n  warmup_steps: {warmup}\ntrain:\n  divergence_guard: false\n")
    (folder / "metrics.jsonl").write_text("".join(json.dumps({"step": first_step + 10 * i, "loss": loss}) + "\n"
                                                  for i, loss in enumerate(losses)))


def _said(capsys, *argv):
    assert replay.main([*map(str, argv)]) == 0
    return capsys.readouterr().out.strip().splitlines()[-1]


def test_an_early_collapse_is_caught_at_50_step_windows_only_with_the_guards_early_windows(tmp_path, capsys):
    _run(tmp_path / "runs" / "clouds", CLOUDS)
    assert len(CLOUDS) == 40
    assert _said(capsys, tmp_path) == "1 runs, 1 collapsed: the guard caught 1, and would have stopped 0 healthy"
    assert _said(capsys, tmp_path, "--log-every", "50").startswith("1 runs, 1 collapsed: the guard caught 1")
    assert _said(capsys, tmp_path, "--log-every", "50", "--set", "train.divergence_early_steps=0").startswith(
        "1 runs, 1 collapsed: the guard caught 0")


def test_a_healthy_bump_stops_the_run_only_when_two_short_windows_are_enough(tmp_path, capsys):
    _run(tmp_path / "runs" / "xl", [0.02, 0.012, 0.009, 0.008] + XL_BUMP, first_step=410, warmup=1000)
    assert _said(capsys, tmp_path).endswith("the guard caught 0, and would have stopped 0 healthy")
    windows_alone = _said(capsys, tmp_path, "--set", "train.divergence_patience_steps=0")
    assert windows_alone.endswith("would have stopped 1 healthy")
    assert replay.main([str(tmp_path), "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["collapsed_at"] is None and row["guard_at"] is None and row["last_step"] == 800


def test_runs_trained_with_the_guard_on_or_logged_too_seldom_are_left_out(tmp_path, capsys):
    _run(tmp_path / "runs" / "a", CLOUDS)
    (tmp_path / "runs" / "a" / "config.yaml").write_text("train:\n  divergence_guard: true\n")
    assert _said(capsys, tmp_path).startswith("0 runs")
    assert _said(capsys, tmp_path, "--log-every", "25").startswith("0 runs")  # not a multiple of 10


def test_the_live_guard_judges_the_windows_its_replay_judges(tmp_path, monkeypatch):
    """A run logged every 20 steps (the guard reading 10-step windows between logs) holds, in its
    checkpoint, the same judged window losses as the replay of the same run logged every 10 steps:
    at a logged step it judges the steps since its last read, not the whole logged window."""
    monkeypatch.setenv("DIFFSCALE_CACHE_DIR", str(tmp_path / "cache"))
    settings = [arg for item in [*MICRO, "train.steps=60", "train.checkpoint_every=60"] for arg in ("--set", item)]
    logged, live = tmp_path / "every10", tmp_path / "every20"
    assert main(["train", "--out", str(logged), *settings, "--set", "train.log_every=10",
                 "--set", "train.divergence_guard=off"]) == 0
    assert main(["train", "--out", str(live), *settings, "--set", "train.log_every=20"]) == 0
    metrics, shipped, state = read_metrics(logged / "metrics.jsonl"), TrainConfig(), GuardState()
    for _, count, loss in replay.judged_windows(metrics.steps, metrics.losses, 20, shipped.divergence_early_steps):
        guard_judge(state, loss, rise=shipped.divergence_rise, patience=shipped.divergence_patience,
                    noise=shipped.divergence_noise, steps=count, patience_steps=shipped.divergence_patience_steps)
    kept = GuardState.from_dict(ckpt.load_checkpoint(ckpt.list_checkpoints(live)[-1]).meta.guard)
    assert kept.seen == state.seen == 6 and kept.recent == state.recent
