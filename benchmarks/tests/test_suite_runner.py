"""The benchmark runner end to end: real ``diffscale train`` and ``eval`` subprocesses of micro
configs on a CPU, their records, tables and provenance; a run's record from its files."""

from __future__ import annotations

import json

import pytest

from benchmarks.suite import defaults
from benchmarks.suite.collapse import Criterion
from benchmarks.suite.launch import RunSpec
from benchmarks.tests.suite_micro import MICRO, set_args


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    """Feature networks and rendered data go to this test's folder, not the user's cache."""
    monkeypatch.setenv("DIFFSCALE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def test_two_image_sets_train_evaluate_and_report_then_a_second_call_reuses_them(tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["--preset", "tiny", "--sets", "strokes", "colour", "--seeds", "1", "--steps", "8", "--log-every", "2",
            "--count", "40", "--eval-count", "16", "--out", str(out), "--gpus", "none", "--jobs", "2",
            *set_args(MICRO), "--variant", "short", "optim.warmup_steps=3"]
    assert defaults.main([*argv, "--prepare-features"]) == 0  # the evaluations' feature networks, ahead
    assert "2 feature networks in the data cache" in capsys.readouterr().out and not (out / "runs").exists()
    assert len(list((tmp_path / "cache" / "quality").glob("features-*.safetensors"))) == 2
    assert defaults.main(argv) == 0
    printed = capsys.readouterr().out
    logs = "".join(log.read_text() for log in out.glob("runs/tiny/*/short/seed0.log"))
    assert logs.count(" eval ") == 2 and "feature network: training" not in logs  # read, not trained again
    suite = json.loads((out / "suite.json").read_text())
    about = suite["about"]
    assert about["command"].startswith("python -m benchmarks.suite.defaults --preset tiny")
    assert about["date_utc"] and about["host"] and about["devices"] and about["commit"]
    assert suite["criterion"] == {"jump": 1.5, "stay": 1.4, "window": 5, "min_records": 3}
    runs = suite["runs"]
    assert [(r["set"], r["variant"], r["seed"]) for r in runs] == [("strokes", "short", 0), ("colour", "short", 0)]
    for run in runs:
        assert run["exit_code"] == 0 and run["steps_reached"] == 8 and run["warmup_steps"] == 3
        assert run["collapsed"] is False and run["restores"] == 0 and run["final_loss"] > 0
        assert run["quality"] == run["eval"]["fd"] and run["quality"] > 0 and run["eval"]["count"] == 16
        assert "optim.warmup_steps=3" in run["overrides"] and run["overrides"][-1] == "train.seed=0"
        assert (tmp_path / "out" / "runs" / "tiny" / run["set"] / "short" / "seed0" / "result.json").is_file()
    assert [(s["set"], s["runs"], s["collapsed"]) for s in suite["summary"]] == [("strokes", 1, 0), ("colour", 1, 0)]
    table = (out / "suite.md").read_text()
    assert "| tiny | strokes | short | 0 | 0 | 8 | no | 0 |" in table and "0 of 2 runs collapsed; 0 restores." in table
    assert table.split("\n", 2)[2] in printed

    assert defaults.main(argv) == 0  # nothing trained again
    again = capsys.readouterr().out
    assert again.count("kept from an earlier call") == 2 and "training" not in again
    assert json.loads((out / "suite.json").read_text())["runs"] == runs

    # time to quality against the plain recipe on one of them, beside its kept run
    assert defaults.main([*argv[:3], "strokes", *argv[5:], "--plain", "2"]) == 0
    plain = json.loads((out / "suite.json").read_text())["plain"]
    assert [(r["preset"], r["set"], r["run"], r["reference"]) for r in plain] == [("tiny", "strokes", "fast", "plain")]
    assert plain[0]["plain_final_fd"] > 0 and plain[0]["final_fd"] > 0 and plain[0]["plain_seconds"] >= 2
    assert (out / "plain" / "tiny-strokes" / "quality_time.json").is_file()
    assert "Time to quality against the plain recipe, 2 s each:" in (out / "suite.md").read_text()


def test_field_and_policy_sets_are_scored_on_held_out_pairs_and_in_their_environment(tmp_path):
    out = tmp_path / "out"
    argv = ["--preset", "field-icon", "--preset", "policy-tiny", "--sets", "rain", "routes", "--seeds", "1",
            "--steps", "6", "--log-every", "2", "--count", "20", "--eval-count", "3", "--out", str(out),
            "--gpus", "none", "--set", "optim.warmup_steps=2", "--set", "train.checkpoint_every=6"]
    assert defaults.main(argv) == 0
    field, policy = json.loads((out / "suite.json").read_text())["runs"]
    assert (field["preset"], field["set"], policy["preset"], policy["set"]) == ("field-icon", "rain", "policy-tiny",
                                                                               "routes")
    assert field["eval"]["held_out"] == 1 and field["eval"]["data"].endswith("fields-rain-n20-seed0-heldout.npz")
    assert field["quality"] == field["eval"]["crps"] > 0 and "model.coarse_index=-1" in field["overrides"]
    assert policy["eval"]["env"] == "reach2d-routes" and policy["eval"]["episodes"] == 3
    assert policy["quality"] == policy["eval"]["success"] and 0 <= policy["quality"] <= 1


def test_a_record_counts_restores_and_judges_the_curve_from_the_run_folder(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("optim:\n  warmup_steps: 20\n")
    losses = [1.0, 0.5, 0.3, 0.2, 0.2, 0.2, 0.7, 0.7, 0.7, 0.7, 0.7, 0.7]
    lines = [{"step": 10 * (i + 1), "loss": loss, "nonfinite_skipped": 0} for i, loss in enumerate(losses)]
    lines.insert(8, {"kind": "divergence", "step": 80})
    lines.insert(10, {"kind": "divergence", "step": 100})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    spec = RunSpec("tiny", "flat", "images", "on", 1, "npz:x.npz", ("train.seed=1",), (), run_dir)
    record = defaults.finish(Criterion())(spec, {"exit_code": 0, "train_s": 1.0, "log": "x.log", "eval": None})
    assert record["restores"] == 2 and record["collapsed"] is True and record["step"] == 90
    assert record["quality"] is None and record["steps_reached"] == 120 and record["warmup_steps"] == 20
    assert record["summary"].startswith("COLLAPSED: loss rose to 3.5x its running minimum")


def test_a_run_trained_with_the_guard_off_says_where_the_guard_would_have_restored(tmp_path):
    """The guard's first decision replayed on the logged windows (a heavy-tailed field set's, which
    the rise factor alone took for a divergence at its 33rd window), with the run's own settings."""
    from benchmarks.suite.report import summarize, summary_table

    rain = [1.423, 1.97, 0.827, 1.234, 0.8, 0.705, 0.808, 0.864, 0.673, 0.656, 0.767, 0.764, 1.058, 0.712, 0.563,
            0.944, 0.951, 0.532, 0.68, 0.662, 0.983, 0.475, 0.782, 0.639, 0.701, 0.493, 0.877, 0.466, 0.426, 0.51,
            0.639, 0.789, 0.779, 0.594, 0.699, 0.525, 0.956, 0.444, 0.861, 0.574]
    records = []
    for name, train in (("shipped", "divergence_guard: false"),
                        ("factor", "divergence_guard: false\n  divergence_noise: 0.0\n  divergence_patience_steps: 0"),
                        ("on", "divergence_guard: true")):
        run_dir = tmp_path / name
        run_dir.mkdir()
        (run_dir / "config.yaml").write_text(f"optim:\n  warmup_steps: 0\ntrain:\n  {train}\n")
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": 10 * (i + 1), "loss": loss}) + "\n"
                                                       for i, loss in enumerate(rain)))
        spec = RunSpec("field-icon", "rain", "fields", name, 0, "npz:x.npz", (), (), run_dir)
        records.append(defaults.finish(Criterion())(spec, {"exit_code": 0, "train_s": 1.0, "log": "x.log",
                                                            "eval": None}))
    shipped, factor, on = records
    assert shipped["guard_off"] and shipped["guard_would_restore_at"] is None
    assert factor["guard_would_restore_at"] == 330 and factor["summary"].endswith(
        "the guard would have restored at step 330")
    assert not on["guard_off"] and on["guard_would_restore_at"] is None  # the live guard decided there
    assert "The divergence guard would have restored in 1 of the 2 runs trained with it off." in summary_table(
        summarize(records))


def test_gpu_indices_count_among_the_gpus_cuda_visible_devices_allows(monkeypatch):
    """Two suites side by side on a two-GPU host, one under CUDA_VISIBLE_DEVICES=1 with --gpus 0,0:
    its runs go to GPU 1, not to GPU 0 beside the other suite's."""
    from diffscale.errors import UserError

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert defaults.gpu_slots("0,0,1") == ("0", "0", "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert defaults.gpu_slots("0,0,0") == ("1", "1", "1") and defaults.gpu_slots("auto") == ("1",)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert defaults.gpu_slots("1,0") == ("3", "2")
    with pytest.raises(UserError) as refused:
        defaults.gpu_slots("0,2")
    assert "--gpus 0,2: 2 is not among the 2 GPU(s) CUDA_VISIBLE_DEVICES=2,3 allows" in str(refused.value)
    assert defaults.gpu_slots("none") == ()


@pytest.mark.parametrize(("extra", "message"), [
    (["--set", "optim.lrr=1"], "error: unknown config key 'optim.lrr'"),
    (["--variant", "a=b"], "error: --variant label 'a=b' is not a new name -- start each --variant with its own "
                           "label, then its overrides: --variant off KEY=VALUE"),
    (["--variant", "low", "optim.lr"], "error: --variant low: 'optim.lr' is not KEY=VALUE -- e.g. --variant low "
                                       "optim.lr=5e-4"),
    (["--sets", "rain"], "error: preset tiny trains images, and none of the chosen sets holds images data -- pick "
                         "images sets with --sets, or leave --sets out for all of them"),
])
def test_bad_arguments_end_in_one_line_before_anything_trains(tmp_path, capsys, extra, message):
    assert defaults.main(["--preset", "tiny", "--out", str(tmp_path / "out"), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_the_seconds_budget_asks_a_run_to_stop(tmp_path):
    """A process that would sleep a minute gets SIGTERM at the budget; one that handles it (as
    diffscale train does: checkpoint, exit 85) exits with its own code."""
    import signal
    import sys

    from benchmarks.suite.launch import run_logged

    child = ("import signal, sys, time\n"
             "signal.signal(signal.SIGTERM, lambda *_: sys.exit(85))\n"
             "print('ready', flush=True)\n"
             "time.sleep(60)\n")
    code, _, last = run_logged([sys.executable, "-c", child], {}, tmp_path / "log", budget_s=3)
    # 85 once the handler is in; SIGTERM's own exit if a very busy machine started it later than 3 s
    assert code in (85, -signal.SIGTERM)
    assert (tmp_path / "log").read_text().startswith(f"$ {sys.executable} -c import signal")
    assert last in ("ready", "")


def test_plain_needs_an_image_preset(tmp_path, capsys):
    assert defaults.main(["--preset", "field-icon", "--plain", "5", "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == ("error: --plain measures time to quality of image presets, and no image preset "
                                       "is chosen -- add an image preset (tiny, small, medium, large, xl), or leave "
                                       "--plain out\n")
    assert not (tmp_path / "out").exists()


def test_runs_train_500_steps_past_their_warm_up_unless_told(tmp_path):
    """large's 1,000 warm-up steps would outlast a fixed 600-step run, which then never trained at the
    learning rate under test; --steps, a --set or a variant's train.steps still decide where given."""
    def steps(*argv: str) -> dict[tuple[str, str], list[str]]:
        args = defaults.parse_args(["--sets", "textures", "--seeds", "1", "--out", str(tmp_path), *argv])
        return {(spec.preset, spec.variant): [o for o in spec.overrides if o.startswith("train.steps=")]
                for spec in defaults.plan(args, tmp_path / "data")}

    assert steps("--preset", "tiny", "--preset", "large") == {
        ("tiny", "defaults"): ["train.steps=600"], ("large", "defaults"): ["train.steps=1500"]}
    assert steps("--preset", "large", "--variant", "long", "optim.warmup_steps=2000") == {
        ("large", "long"): ["train.steps=2500"]}
    assert steps("--preset", "large", "--steps", "300") == {("large", "defaults"): ["train.steps=300"]}
    assert steps("--preset", "large", "--steps", "0") == {("large", "defaults"): []}
    told = steps("--preset", "large", "--set", "train.steps=50")[("large", "defaults")]
    assert told[-1] == "train.steps=50"  # the last override wins


def test_on_gpus_the_seeds_of_one_step_start_after_its_first_run_has_logged_a_step(tmp_path):
    """Staggered as on GPUs (here on two CPU slots): of two seeds of one set and variant, whichever
    claims the step first trains; the other starts once that run has logged a step (its kernels are
    in the cache by then); a run of another set does not wait; nothing is left waiting when the first
    run fails before its first step."""
    from benchmarks.suite.launch import STEP_LOGGED, Slots, run_all

    def spec(name: str, seed: int, *extra: str) -> RunSpec:
        return RunSpec("tiny", name, "images", "v", seed, "builtin:mix",
                       (*MICRO, "train.steps=30", "train.log_every=10", f"train.seed={seed}", *extra), (),
                       tmp_path / name / f"seed{seed}")

    said: list[tuple[str, list[str]]] = []

    def say(text: str) -> None:  # what each run's log holds when a run starts
        logs = {p.parent.name + "/" + p.stem: p.read_text() for p in tmp_path.glob("*/seed*.log")}
        said.append((text, [name for name, log in logs.items() if STEP_LOGGED.search(log)]))

    def record(_: RunSpec, outcome: dict) -> dict:
        return {"exit_code": outcome["exit_code"], "summary": ""}

    specs = [spec("a", 0), spec("a", 1), spec("b", 0)]
    records = run_all(specs, Slots(jobs=2, cores=2), record, say, stagger=True, budget_s=None, evaluate=False,
                      eval_count=None)
    assert [r["exit_code"] for r in records] == [0, 0, 0]
    waited = [text.split(":")[0] for text, _ in said if "waits for the first run of its step" in text]
    assert len(waited) == 1 and waited[0] in ("tiny/a/v/seed0", "tiny/a/v/seed1"), said
    leader = "a/seed1" if waited[0].endswith("seed0") else "a/seed0"
    started = next(stepped for text, stepped in said if text == f"{waited[0]}: training")
    assert leader in started  # the leader had logged a step when the other seed started
    assert next(stepped for text, stepped in said if text == "tiny/b/v/seed0: training") is not None
    assert not any("tiny/b/v/seed0: waits" in text for text, _ in said)

    failing = [spec("c", 0, "model.sample_size=-1"), spec("c", 1, "model.sample_size=-1")]
    records = run_all(failing, Slots(jobs=2, cores=2), record, lambda text: None, stagger=True, budget_s=None,
                      evaluate=False, eval_count=None)
    assert [r["exit_code"] for r in records] == [2, 2]


def test_the_lines_a_run_writes_on_stderr_reach_on_line_while_it_runs(tmp_path):
    """``diffscale train`` logs its steps on stderr when stdout is a pipe: the stagger's leader is read
    there. The child writes a step line on stderr and exits 0 only once ``on_line`` has seen it (a file
    the callback writes), so a line held back until the child ends fails the test instead of hanging it."""
    import sys

    from benchmarks.suite.launch import STEP_LOGGED, run_logged

    seen = tmp_path / "seen"
    child = ("import sys, time, pathlib\n"
             "print('step 10/30  loss 0.5', file=sys.stderr, flush=True)\n"
             f"p = pathlib.Path({str(seen)!r}); end = time.monotonic() + 60\n"
             "while not p.exists() and time.monotonic() < end: time.sleep(0.05)\n"
             "print('/run/folder'); sys.exit(0 if p.exists() else 1)\n")

    def on_line(line: str) -> None:
        if STEP_LOGGED.search(line):
            seen.write_text(line)

    code, _, last = run_logged([sys.executable, "-c", child], {}, tmp_path / "run.log", None, on_line)
    assert code == 0 and seen.read_text().startswith("step 10/30")
    assert last == "/run/folder"
    assert "step 10/30" in (tmp_path / "run.log").read_text()


@pytest.mark.parametrize("lines, ready_at", [
    # compiled first (as logged by an H200 run, 2026-11-30): ready at its first step
    (["[    5.9 s] diffscale | cuda: NVIDIA H200 | bf16 | compiled (CUDA graphs)",
      "[   89.7 s] first step of this job (step 1) 89.7 s after it started: compiled",
      "step 10/600  loss 0.5 ..."], 1),
    # eager while compiling: not at its eager steps, once the background process has built the step
    (["[    5.9 s] diffscale | cuda: NVIDIA H200 | bf16 | eager while compiling, then compiled (CUDA graphs)",
      "[    5.9 s] eager while compiling: training starts now on eager steps; a background process compiles",
      "[    8.3 s] first step of this job (step 1) 8.3 s after it started: eager while compiling",
      "step 10/600  loss 0.5  12681 samples/s",
      "[  103.5 s] the background compile has built the step in 101.0 s: compiling from its kernels at step 480",
      "[  111.4 s] compiled from step 480: the switch took 7.9 s"], 4),
    # the background compile failed: once the run compiled the step itself
    (["eager while compiling: training starts now on eager steps; a background process compiles",
      "step 10/600  loss 0.5",
      "warning: the background compile failed (its log: x): the training process compiles the step itself now",
      "step 480/600  loss 0.2",
      "compiled from step 480: the switch took 90.2 s"], 4),
    # eager throughout (runtime.compile off): at its first logged step
    (["diffscale | cpu: CPU | fp32", "step 10/30  loss 0.73  213 samples/s"], 1),
])
def test_the_others_wait_until_the_first_runs_compiled_step_is_in_the_cache(lines, ready_at):
    from benchmarks.suite.launch import KernelsReady

    watch = KernelsReady()
    said = [watch(line) for line in lines]
    assert said.index(True) == ready_at, said
