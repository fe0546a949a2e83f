"""Quality against training wall clock (benchmarks.quality_clock, fields_quality, policy_quality) and
the policy step-count table (benchmarks.policy_steps), on the CPU at tiny sizes. No timings are asserted."""

import json

import pytest
import torch

from benchmarks import fields_quality, policy_quality, policy_steps
from benchmarks.quality_clock import Schedule, first_reaching, recipe_run, train_curve
from diffscale import config as C

TINY_FIELDS = ["model.hidden=32", "model.depth=1", "train.batch_per_gpu=8", "train.steps=10"]


def _tiny_field_run(tmp_path, name):
    cfg = C.resolve_config(C.ConfigSources(preset="field-icon", device="cpu", overrides=TINY_FIELDS))
    return recipe_run(cfg, tmp_path / name)


def test_a_rewound_run_trains_as_a_fresh_one_from_the_same_seed(tmp_path):
    """Warm-up steps then the rewind leave nothing behind: weights, EMA, optimizer moments, step
    counter and data stream are those of a fresh run, so the next steps give the same weights."""
    fresh_state, fresh, _ = _tiny_field_run(tmp_path, "fresh")
    for _ in range(4):
        fresh.step()
    state, runner, rewind = _tiny_field_run(tmp_path, "rewound")
    for _ in range(3):
        runner.step()
    moved = [p.clone() for p in state.net.parameters()]
    rewind(state, runner)
    assert state.step == 0
    assert any(not torch.equal(a, b) for a, b in zip(moved, state.net.parameters(), strict=True))
    for _ in range(4):
        runner.step()
    for net in ("net", "ema"):
        for a, b in zip(getattr(fresh_state, net).parameters(), getattr(state, net).parameters(), strict=True):
            assert torch.equal(a, b), net


def test_the_plain_recipe_rewinds_its_own_ema_and_optimizer(tmp_path):
    cfg = C.resolve_config(C.ConfigSources(preset="field-icon", device="cpu", recipe="plain", overrides=TINY_FIELDS))
    state, runner, rewind = recipe_run(cfg, tmp_path / "plain", plain_workers=0)
    first = [p.clone() for p in state.net.parameters()]
    for _ in range(3):
        runner.step()
    rewind(state, runner)
    assert state.step == 0
    for a, b, ema in zip(first, state.net.parameters(), runner.ema, strict=True):
        assert torch.equal(a, b) and torch.equal(a, ema)
    assert all(float(v.abs().sum()) == 0 for s in runner.opt.state.values() for v in s.values())


def test_a_curve_times_the_steps_and_stops_where_told(tmp_path):
    state, runner, _ = _tiny_field_run(tmp_path, "curve")
    scores = iter([0.5, 0.95, 0.99])
    points = train_curve(runner.step, state, Schedule((2, 4, 6), done=lambda p: p["score"] >= 0.9),
                         lambda: {"score": next(scores)})
    assert [p["step"] for p in points] == [2, 4] and state.step == 4
    assert 0 < points[0]["train_s"] <= points[1]["train_s"]
    assert first_reaching(points, lambda p: p["score"] >= 0.9)["step"] == 4
    assert first_reaching(points, lambda p: p["score"] > 1) is None


def test_settings_become_overrides_with_scaled_step_counts():
    preset = C.resolve_config(C.ConfigSources(preset="field-icon"))
    assert fields_quality.Setting("preset").overrides(preset) == ["train.steps=2400", "optim.warmup_steps=100"]
    setting = fields_quality.Setting("x", batch=128, lr=2e-3, schedule="constant", steps=2000)
    assert setting.overrides(preset, 0.01) == ["train.batch_per_gpu=128", "optim.lr=0.002", "optim.schedule=constant",
                                               "train.steps=20", "optim.warmup_steps=1"]
    assert len({s.label for s in fields_quality.GRID}) == len(fields_quality.GRID)
    assert fields_quality._checkpoints(2000, 10) == (50, 100, *range(200, 2001, 200))


def _row(label, seconds, recipe="fast", batch=16):
    first = {"train_s": seconds, "step": 100} if seconds is not None else None
    return {"label": label, "recipe": recipe, "first_within": first, "batch": batch, "lr": 1e-3,
            "schedule": "cosine", "steps": 2000, "warmup_steps": 100}


@pytest.mark.parametrize("rows, label, clear", [
    ([_row("preset", 1.4), _row("b128", 0.6, batch=128), _row("plain", 0.5, recipe="plain")], "b128", True),
    ([_row("preset", 0.8), _row("b128", 0.7, batch=128)], "b128", False),  # not a quarter faster
    ([_row("preset", 0.8), _row("b128", 0.5, batch=128)], "b128", True),
    ([_row("preset", None), _row("b128", 1.2, batch=128)], "b128", False),  # over the target time
    ([_row("preset", 0.9), _row("b128", None)], "preset", False),
])
def test_the_fastest_setting_is_a_clear_change_only_when_it_beats_the_preset_well(rows, label, clear):
    best = fields_quality.fastest(rows)
    assert best["label"] == label and best["clear_change"] is clear
    assert (best["preset_switch"] is not None) is clear
    assert fields_quality.fastest([_row("preset", None)]) is None


def test_fields_quality_scores_the_plain_loop_and_settings_against_the_ideal_forecast(tmp_path, capsys):
    out, md = tmp_path / "fields.json", tmp_path / "fields.md"
    assert fields_quality.main(["--device", "cpu", "--only", "preset", "b128-lr2e-3", "--steps-scale", "0.002",
                                "--cases", "16", "--members", "3", "--sample-steps", "2", "--plain-steps", "4",
                                "--plain-evals", "2", "--plain-workers", "0", "--warmup", "1", "--evals", "2",
                                "--set", "model.hidden=16", "--set", "model.depth=1",
                                "--json", str(out), "--markdown", str(md)]) == 0
    record = json.loads(out.read_text())
    assert [r["label"] for r in record["runs"]] == ["preset", "plain", "b128-lr2e-3"]
    assert [r["recipe"] for r in record["runs"]] == ["fast", "plain", "fast"]
    assert record["runs"][2]["batch"] == 128 and record["runs"][1]["schedule"] == "constant"
    assert [p["step"] for p in record["runs"][1]["points"]] == [1, 2, 4]
    assert 0 < record["crps_ideal"] < record["crps_climatology"] and record["crps_ideal_ensemble"] > 0
    for run in record["runs"]:
        assert run["points"][-1]["over_ideal"] == pytest.approx(run["points"][-1]["crps"] / record["crps_ideal"])
    assert "| plain | plain | 16 |" in md.read_text() and "Ideal forecast (closed form)" in capsys.readouterr().out


def test_fields_quality_refuses_an_unknown_setting():
    from diffscale.errors import UserError

    with pytest.raises(UserError, match="--only b7: no such setting"):
        fields_quality.main(["--device", "cpu", "--only", "b7"])


def test_policy_quality_rolls_out_both_recipes_through_the_controller(tmp_path):
    out = tmp_path / "policy.json"
    assert policy_quality.main(["--preset", "policy-tiny", "--device", "cpu", "--eval-every", "2", "--max-steps", "4",
                                "--episodes", "2", "--plain-workers", "0", "--warmup", "1", "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["env"] == "reach2d-routes" and [r["recipe"] for r in record["runs"]] == ["fast", "plain"]
    for run in record["runs"]:
        assert [p["step"] for p in run["points"]] == [2, 4]
        assert {"success", "mode_gap", "mode_middle"} <= set(run["points"][0])


def test_policy_steps_parses_cores_and_tells_which_seeds_meet_the_bar():
    assert policy_steps.parse_cores("6-8,11") == [6, 7, 8, 11]
    rows = [{"steps": 800, "seed": s, "success": ok, "mode_gap": gap, "train_s": 1.0, "mode_left": 0.5,
             "demo_left": 0.5} for s, ok, gap in ((0, 0.91, 0.08), (1, 0.95, 0.12), (2, 0.89, 0.01))]
    rows.append({"steps": 800, "seed": 3, "error": "exit 1", "log_tail": ""})
    summary = policy_steps.summarize(rows)
    assert summary[0]["meeting_bar"] == 1 and summary[0]["failed"] == 1 and summary[0]["seeds"] == [0, 1, 2]
    assert summary[0]["mean_success"] == pytest.approx((0.91 + 0.95 + 0.89) / 3)


def test_policy_steps_trains_each_pair_in_its_own_process_and_tabulates_it(tmp_path):
    out, md = tmp_path / "steps.json", tmp_path / "steps.md"
    # compile off: the worker's Controller.load stays eager instead of compiling on the CPU (most of
    # this test's time otherwise); the compiled load is checked in tests/unit/test_controller.py
    assert policy_steps.main(["--steps", "2", "--seeds", "0", "--episodes", "2", "--set", "runtime.compile=off",
                              "--json", str(out), "--markdown", str(md)]) == 0
    record = json.loads(out.read_text())
    (run,) = record["runs"]
    assert run["steps"] == 2 and run["seed"] == 0 and run["finished"] and run["episodes"] == 2
    assert record["by_steps"][0]["steps"] == 2 and "| 2 |" in md.read_text()


def test_settings_group_by_batch_size_in_the_order_named():
    import argparse

    args = argparse.Namespace(preset="field-icon", set=None, steps_scale=1.0, device="cpu")
    named = {s.label: s for s in fields_quality.GRID}
    order = ["b512-lr4e-3", "preset", "b128-lr2e-3", "b512-lr4e-3-500", "b16-1200"]
    groups = fields_quality._groups([named[label] for label in order], args)
    assert [[s.label for s in group] for group in groups] == [["b512-lr4e-3", "b512-lr4e-3-500"],
                                                              ["preset", "b16-1200"], ["b128-lr2e-3"]]
