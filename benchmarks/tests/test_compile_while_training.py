"""The train-while-compiling benchmark's reading of a job's records (the jobs themselves need a
compile: its CPU dry run is ``SMOKE=1 OUT=DIR bash scripts/gpu/compile_while_training.sh``)."""

import json


def _write(run, records):
    run.mkdir(parents=True, exist_ok=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_the_steady_windows_start_a_whole_window_after_the_switch_or_after_a_compiled_runs_first(tmp_path):
    from benchmarks.compile_while_training import steady_since, windows_after

    eager = tmp_path / "eager"
    _write(eager, [{"kind": "first_step", "step": 1, "eager": True, "since_start_s": 5.0},
                   {"step": 50, "loss": 1, "samples_per_s": 10.0}, {"step": 100, "loss": 1, "samples_per_s": 11.0}])
    assert steady_since(eager) is None  # still eager: no steady compiled window yet
    with (eager / "metrics.jsonl").open("a") as out:
        for record in ({"kind": "compiled", "step": 100, "switch_s": 9.0, "eager_samples_per_s": 11.0},
                       {"step": 150, "loss": 1, "samples_per_s": 5.0}, {"step": 200, "loss": 1, "samples_per_s": 30.0},
                       {"step": 250, "loss": 1, "samples_per_s": 31.0}):
            out.write(json.dumps(record) + "\n")
    assert steady_since(eager) == 199  # the window to 150 holds the switch's compile
    assert windows_after(eager, 199) == [30.0, 31.0]
    between = tmp_path / "between"  # switched between logged steps: the window to 200 holds steps 131-150
    _write(between, [r for r in map(json.loads, (eager / "metrics.jsonl").read_text().splitlines())])
    (between / "metrics.jsonl").write_text((between / "metrics.jsonl").read_text().replace('"step": 100, "switch_s"',
                                                                                          '"step": 130, "switch_s"'))
    assert steady_since(between) == 229 and windows_after(between, 229) == [31.0]
    compiled = tmp_path / "compiled"
    _write(compiled, [{"kind": "first_step", "step": 1, "eager": False, "since_start_s": 20.0},
                      {"step": 50, "loss": 1, "samples_per_s": 3.0}, {"step": 100, "loss": 1, "samples_per_s": 29.0}])
    assert steady_since(compiled) == 50 and windows_after(compiled, 50) == [29.0]
    assert steady_since(tmp_path / "missing") is None


def test_the_summary_compares_the_steady_speed_after_the_switch_with_a_run_compiled_from_its_start():
    from benchmarks.compile_while_training import comparison, summary_line

    cold = {"first_step_s": 9.5, "compiled_s": 131.2, "steady_samples_per_s": 30_900.0, "ended_by": "enough windows",
            "compiled": {"step": 1500, "switch_s": 8.1, "eager_samples_per_s": 14_000.0, "background_compile_s": 118.0}}
    reference = {"first_step_s": 17.0, "steady_samples_per_s": 31_000.0, "ended_by": "enough windows",
                 "compiled": None}
    assert summary_line("small", "cold", cold) == (
        "small cold: first step 9.5 s, compiled 131.2 s, steady 30,900 samples/s; switch at step 1500 (8.1 s, eager "
        "14,000 samples/s, background compile 118.0 s) [enough windows]")
    cold["compiled"]["paused_for_tuning_s"] = 9.84  # runs since the pause for kernel timing record it
    assert summary_line("small", "cold", cold).endswith(
        "background compile 118.0 s, eager steps paused 9.8 s) [enough windows]")
    assert summary_line("small", "warm", reference) == (
        "small warm: first step 17.0 s, compiled -, steady 31,000 samples/s [enough windows]")
    record = {"preset": "small", "cold": cold, "warm": reference, "warm-eager": {"steady_samples_per_s": None}}
    assert comparison(record) == "small: steady after the switch vs compiled from the start: cold -0.3 %"
