"""The arithmetic and tables of the time-to-quality and sampler-quality benches (no timings asserted)."""

import pytest
import torch

from benchmarks.quality_time import eval_marks, train_for
from benchmarks.quality_time_report import markdown, summarize, time_to_reach


def test_time_to_reach_interpolates_the_first_crossing():
    curve = [(0.0, 300.0), (10.0, 100.0), (20.0, 40.0), (30.0, 60.0), (40.0, 20.0)]
    assert time_to_reach(curve, 70.0) == pytest.approx(15.0)  # halfway from 100 to 40
    assert time_to_reach(curve, 100.0) == 10.0  # reached exactly at a point
    assert time_to_reach(curve, 300.0) == 0.0  # already there at the start
    assert time_to_reach(curve, 30.0) == pytest.approx(37.5)  # after the bump at 30 s: 60 -> 20 over 10 s
    assert time_to_reach(curve, 10.0) is None  # never
    assert time_to_reach([], 10.0) is None


def test_eval_marks_end_at_the_budget():
    assert eval_marks(60, 4) == [15.0, 30.0, 45.0, 60.0]


ABOUT_RUNS = {"device": "CPU", "date_utc": "2026-01-01 00:00", "commit": "abc1234",
              "eval": {"count": 512, "sampler": "ddim", "steps": 20}}


def _run(preset, recipe, name, points, startup=5.0):
    rows = [{"seconds": s, "steps": i, "images": i * 100, "fd": fd, "fd_ema": fd, "fd_raw": None}
            for i, (s, fd) in enumerate(points)]
    return {"preset": preset, "recipe": recipe, "name": name, "points": rows, "startup_s": startup,
            "samples_per_s": 1000.0}


def test_summary_compares_each_diffscale_run_with_the_plain_recipe_of_its_preset():
    records = [_run("small", "plain", "plain", [(0, 300), (30, 120), (60, 80)]),
               _run("small", "fast", "fast", [(0, 300), (20, 90), (40, 70), (60, 50)]),
               _run("small", "fast", "fast-minsnr", [(0, 300), (60, 100)]),
               _run("medium", "plain", "plain", [(0, 400), (60, 200)]),
               _run("medium", "fast", "fast", [(0, 400), (10, 150), (60, 90)])]
    summary = {(s["preset"], s["run"]): s for s in summarize(records)}
    assert set(summary) == {("small", "fast"), ("small", "fast-minsnr"), ("medium", "fast")}
    fast = summary[("small", "fast")]
    assert fast["plain_final_fd"] == 80 and fast["plain_seconds"] == 60
    assert fast["reach_plain_final_s"] == pytest.approx(30.0)  # 90 at 20 s, 70 at 40 s: 80 halfway
    assert fast["reach_plain_final_images"] == pytest.approx(150.0)
    assert fast["share_of_plain_time"] == pytest.approx(0.5) and fast["target_met"] is False
    assert summary[("small", "fast-minsnr")]["reach_plain_final_s"] is None
    assert summary[("small", "fast-minsnr")]["target_met"] is False
    medium = summary[("medium", "fast")]
    assert medium["reach_plain_final_s"] == pytest.approx(8.0) and medium["target_met"] is True  # 13 %

    table = markdown(records, summarize(records), ABOUT_RUNS)
    assert "| small | fast | 5.0 | 1,000 | 50.00 | 80.00 | 30.0 (150) | 50.0% | missed |" in table
    assert "| small | fast-minsnr | 5.0 | 1,000 | 100.00 | 80.00 | never | - | missed |" in table
    assert "| medium | fast | 5.0 | 1,000 | 90.00 | 200.00 | 8.0 (80) | 13.3% | met |" in table
    assert "| small | plain | 60.0 | 2 | 200 | 80.00 | 80.00 | - |" in table
    assert "| small | plain | 5.0 | 1,000 | 80.00 |  |  |  |  |" in table  # the reference itself: nothing to compare
    # a diffscale run without a plain recipe beside it is listed, with nothing to compare
    alone = [_run("xl", "fast", "fast", [(0, 300), (60, 100)])]
    assert "| xl | fast | 5.0 | 1,000 | 100.00 |  |  |  |  |" in markdown(alone, summarize(alone), ABOUT_RUNS)


class _Steps:
    """A runner whose steps only count (the loop's bookkeeping, without a network)."""

    def __init__(self):
        self.run_state = type("State", (), {"step": 0})()

    def step(self):
        self.run_state.step += 1
        return 0.0


def test_train_for_evaluates_at_the_start_and_the_end_and_stops_at_the_step_count():
    runner = _Steps()
    seen = []

    def evaluate(clock):
        seen.append(runner.run_state.step)
        return {"seconds": clock, "steps": runner.run_state.step}

    points = train_for(runner, 1e9, [5e8, 1e9], evaluate, check_every=4, stop_step=10, device=torch.device("cpu"))
    assert seen == [0, 10]  # the budget outlasts the step count: one evaluation at its end
    assert points[0]["seconds"] == 0.0 and points[-1]["steps"] == 10


def test_train_for_evaluates_once_when_a_check_passes_several_marks():
    runner = _Steps()
    points = train_for(runner, 1e-12, [1e-13, 1e-12], lambda clock: {"seconds": clock, "steps": runner.run_state.step},
                       check_every=3, stop_step=100, device=torch.device("cpu"))
    assert [p["steps"] for p in points] == [0, 3]


def _row(kind, steps, fd, seconds):
    return {"sampler": kind, "steps": steps, "fd": fd, "seconds": seconds, "precision": 0.5, "recall": 0.5,
            "images_per_s": 1000 / seconds}


ABOUT = {"device": "CPU", "date_utc": "2026-01-01 00:00", "commit": "abc1234", "run": "RUN", "step": 10, "count": 1000}


def test_sampler_verdict_picks_the_cheapest_dpmsolver_within_five_percent_of_ddim50():
    from benchmarks.sampler_quality import markdown, verdict

    rows = [_row("ddim", 50, 10.0, 1.0), _row("ddim", 20, 11.0, 0.4), _row("dpmsolver", 15, 10.4, 0.3),
            _row("dpmsolver", 20, 10.1, 0.4), _row("dpmsolver", 10, 10.2, 0.2)]
    summary = verdict(rows)
    # dpmsolver 10 is not a candidate (outside 15-20 steps), 15 is the cheapest within 5 %
    assert summary["dpmsolver_within"] is True and summary["default_candidate"] == "dpmsolver:15"
    assert summary["cost_ratio"] == pytest.approx(1.0 / 0.3)
    assert rows[2]["fd_vs_ddim50"] == pytest.approx(0.04) and rows[2]["speedup_vs_ddim50"] == pytest.approx(1 / 0.3)
    table = markdown(rows, summary, ABOUT)
    assert "| dpmsolver | 15 | 10.400 | +4.0% | 0.500 | 0.500 | 0.3000 | 3,333 | 0.30 x |" in table
    assert "dpmsolver:15 samples 3.33 x cheaper" in table


def test_sampler_verdict_keeps_ddim_when_dpmsolver_is_worse_or_missing():
    from benchmarks.sampler_quality import markdown, verdict

    rows = [_row("ddim", 50, 10.0, 1.0), _row("dpmsolver", 15, 10.6, 0.3), _row("dpmsolver", 20, 10.51, 0.4)]
    summary = verdict(rows)
    assert summary["dpmsolver_within"] is False and summary["default_candidate"] is None
    assert "not within 5% of DDIM-50's FD: DDIM stays the default" in markdown(rows, summary, ABOUT)
    assert verdict([_row("ddim", 20, 10.0, 1.0)])["dpmsolver_within"] is None
    assert verdict([_row("ddim", 50, 10.0, 1.0), _row("dpmsolver", 10, 9.0, 0.2)])["dpmsolver_within"] is None


def test_sampler_list_refuses_what_is_not_kind_and_steps():
    from benchmarks.sampler_quality import parse_samplers
    from diffscale.errors import UserError

    assert parse_samplers(["ddim:50", "dpmsolver:15"]) == [("ddim", 50), ("dpmsolver", 15)]
    for bad in ("ddim", "euler:10", "ddim:0", "ddim:x"):
        with pytest.raises(UserError, match="is not KIND:STEPS"):
            parse_samplers([bad])


def test_raw_weights_are_scored_through_the_ema_network_which_keeps_its_own_weights(monkeypatch):
    """--raw-weights: diffscale's raw weights sample exactly as its EMA does (through the EMA network),
    and the EMA network holds its own weights again afterwards, the next evaluation and training
    going on from them."""
    from types import SimpleNamespace

    from benchmarks import quality_time

    net, ema = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    with torch.no_grad():
        net.weight.fill_(1.0), net.bias.fill_(1.0), ema.weight.fill_(0.5), ema.bias.fill_(0.5)
    seen = []

    def scores(run_state, network, spec):
        seen.append(network)
        return {"fd": float(sum(p.detach().sum() for p in network.parameters())), "precision": 1.0, "recall": 1.0}

    monkeypatch.setattr(quality_time, "_scores", scores)
    raw = quality_time._raw_scores(SimpleNamespace(net=net, ema=ema), quality_time.EvalSpec(raw_too=True))
    assert raw["fd"] == 8.0 and seen == [ema]  # the raw weights (6 + 2 ones), sampled by the EMA network
    assert all(bool((p == 0.5).all()) for p in ema.parameters()) and bool((net.weight == 1.0).all())


def test_runs_trained_apart_are_summarized_against_each_other(tmp_path, capsys):
    """--merge: the plain recipe and diffscale trained at once on two GPUs, each writing its own
    quality_time.json, compared as one run of the bench would compare them."""
    import json

    from benchmarks import quality_time

    for name, run in (("plain", _run("small", "plain", "plain", [(0, 300), (30, 120), (60, 80)])),
                      ("fast", _run("small", "fast", "fast", [(0, 300), (20, 90), (40, 70), (60, 50)]))):
        (tmp_path / f"{name}.json").write_text(json.dumps({"about": ABOUT_RUNS, "summary": [], "runs": [run]}))
    assert quality_time.main(["--merge", str(tmp_path / "plain.json"), str(tmp_path / "fast.json")]) == 0
    assert "| small | fast | 5.0 | 1,000 | 50.00 | 80.00 | 30.0 (150) | 50.0% | missed |" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        quality_time.main(["--seconds", "3"])  # training needs --out


def test_a_training_choice_is_weighed_against_diffscales_defaults(tmp_path, capsys):
    """--merge --against fast: a variant trained beside the defaults (no plain recipe in the call)
    is summarized against the defaults' final FD; the plain recipe's 40 % target is not judged."""
    import json

    from benchmarks import quality_time
    from diffscale.errors import UserError

    runs = {"fast": _run("small", "fast", "fast", [(0, 300), (30, 120), (60, 80)]),
            "b1024": _run("small", "fast", "fast-b1024", [(0, 300), (20, 90), (40, 70), (60, 50)])}
    for name, run in runs.items():
        (tmp_path / f"{name}.json").write_text(json.dumps({"about": ABOUT_RUNS, "summary": [], "runs": [run]}))
    files = [str(tmp_path / "fast.json"), str(tmp_path / "b1024.json")]
    assert quality_time.main(["--against", "fast", "--merge", *files]) == 0
    out = capsys.readouterr().out
    assert "| fast final FD | reaches it at s (images) | of fast's time |" in out
    assert "| small | fast-b1024 | 5.0 | 1,000 | 50.00 | 80.00 | 30.0 (150) | 50.0% | - |" in out
    assert "| small | fast | 5.0 | 1,000 | 80.00 |  |  |  |  |" in out  # the reference itself
    summary = summarize(list(runs.values()), against="fast")
    assert [(s["run"], s["reference"], s["target_met"]) for s in summary] == [("fast-b1024", "fast", None)]
    with pytest.raises(UserError, match="--against 'plain' names no run in these files .*fast, fast-b1024") as error:
        quality_time.main(["--against", "plain", "--merge", *files])
    assert "e.g. --against fast," in str(error.value)
    with pytest.raises(UserError, match="e.g. --against fast-b1024,"):  # a name the files hold
        quality_time.main(["--against", "fast-v", "--merge", files[1]])
    with pytest.raises(SystemExit):
        quality_time.main(["--against", "fast", "--out", str(tmp_path / "o")])  # nothing trained to compare


def test_features_only_prepares_each_presets_feature_network_and_trains_nothing(tmp_path, monkeypatch):
    """--features-only: the feature network prepared once, before runs started apart share it (the
    real preparation runs in scripts/gpu/quality_side_by_side.sh's dry run)."""
    from benchmarks import quality_time

    prepared = []
    monkeypatch.setattr(quality_time, "prepare_features",
                        lambda preset, overrides, spec, say: prepared.append((preset, overrides, spec.count)) or {})
    monkeypatch.setattr(quality_time, "run_one", lambda *args: pytest.fail("--features-only trained a run"))
    monkeypatch.chdir(tmp_path)
    assert quality_time.main(["--features-only", "--preset", "tiny", "--count", "32",
                              "--set", "train.batch_per_gpu=16"]) == 0
    assert prepared == [("tiny", ["train.batch_per_gpu=16"], 32)] and not list(tmp_path.iterdir())


def test_variants_only_trains_the_variants_without_the_defaults(capsys):
    """--variants-only: diffscale's recipe trains each --variant and not its defaults (a process
    on another GPU trains those); without a variant it names the missing flag."""
    from benchmarks import quality_time

    args = quality_time.parse_args(["--recipe", "fast", "--variants-only", "--out", "o",
                                    "--variant", "minsnr", "diffusion.loss_weighting=min-snr"])
    assert [plan.name for plan in quality_time._plans(args)] == ["fast-minsnr"]
    both = quality_time.parse_args(["--out", "o", "--variant", "minsnr", "diffusion.loss_weighting=min-snr"])
    assert [plan.name for plan in quality_time._plans(both)] == ["plain", "fast", "fast-minsnr"]
    with pytest.raises(SystemExit):
        quality_time.parse_args(["--recipe", "fast", "--variants-only", "--out", "o"])
    assert "--variants-only needs at least one --variant" in capsys.readouterr().err


def test_the_plain_recipe_predicts_the_noise_whatever_the_preset_trains():
    """small trains v-prediction; the plain recipe it is compared with stays the common one."""
    from benchmarks import quality_time
    from diffscale.config import LossWeighting, Prediction

    spec = quality_time.EvalSpec(count=64)
    plain = quality_time._config("small", "plain", ["diffusion.loss_weighting=min-snr"], spec)
    fast = quality_time._config("small", "fast", [], spec)
    assert (plain.diffusion.prediction_type, plain.diffusion.loss_weighting) == \
        (Prediction.EPSILON, LossWeighting.NONE)
    assert fast.diffusion.prediction_type == Prediction.V_PREDICTION and plain.train.eval_count == 64
