"""The start-up benchmark's parts that run without a GPU: the first logged step after a resume,
inductor settings and the steady rate after the compile window."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def test_startup_bench_finds_the_first_logged_step_after_the_resume(tmp_path):
    from benchmarks.startup import _first_logged_step

    run = tmp_path / "run"
    assert _first_logged_step(run, 0) is None  # nothing written yet
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 50, "loss": 0.6}\n{"event": "buffer", "step": 60}\n{"truncat')
    assert _first_logged_step(run, 0) == 50
    assert _first_logged_step(run, 50) is None  # the resumed job has not logged yet
    with (run / "metrics.jsonl").open("a") as out:
        out.write('\n{"step": 100, "loss": 0.1}\n')
    assert _first_logged_step(run, 50) == 100


@pytest.mark.parametrize("item, parsed", [
    ("triton.autotune_pointwise=False", {"triton.autotune_pointwise": False}),
    ("compile_threads=4", {"compile_threads": 4}),
    ("worker_start_method=fork", {"worker_start_method": "fork"}),
])
def test_startup_bench_reads_inductor_settings(item, parsed):
    from benchmarks.startup import parse_inductor

    assert parse_inductor([item]) == parsed
    with pytest.raises(SystemExit):
        parse_inductor(["no_equals_sign"])


def test_startup_bench_child_sets_inductor_config_and_refuses_unknown_keys(tmp_path):
    from benchmarks.startup import _CHILD

    child = tmp_path / "child.py"
    show = "import torch._inductor.config as c; print('pointwise', c.triton.autotune_pointwise)"
    child.write_text(_CHILD.replace('runpy.run_module("diffscale", run_name="__main__")', show))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    env["DIFFSCALE_BENCH_INDUCTOR"] = json.dumps({"triton.autotune_pointwise": False})
    done = subprocess.run([sys.executable, str(child)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "pointwise False" in done.stdout
    env["DIFFSCALE_BENCH_INDUCTOR"] = json.dumps({"triton.no_such_setting": 1})
    done = subprocess.run([sys.executable, str(child)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode != 0 and "no setting 'triton.no_such_setting'" in done.stderr


def test_startup_bench_steady_rate_leaves_out_the_first_window(tmp_path):
    from benchmarks.startup import _rates_after_first

    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in [
        {"step": 50, "loss": 1, "samples_per_s": 10.0}, {"step": 100, "loss": 1, "samples_per_s": 20.0},
        {"step": 150, "loss": 1, "samples_per_s": 900.0}, {"event": "x", "step": 160},
        {"step": 200, "loss": 1, "samples_per_s": 1000.0}]))
    assert _rates_after_first(tmp_path, 50) == [900.0, 1000.0]  # step 100's window held the compile
    assert _rates_after_first(tmp_path / "missing", 0) == []

