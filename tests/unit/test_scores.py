"""Evaluation scores where runs are read and compared: image eval's reference row (data against
other data of the same count, kept per data set) and its data count, the scores in ``status``,
report.html, TensorBoard and MLflow, and a sweep's collect and report with a column per score."""

from __future__ import annotations

import csv
import json
import os
import re
from pathlib import Path

import pytest
import yaml

from diffscale.cli import main
from diffscale.io.numbers import rounded
from diffscale.io.scores import headline, sort_key, summary
from diffscale.tasks.images import quality

from helpers import micro_args, run_cli, run_in_terminal


def test_scores_know_which_way_is_better_and_print_beside_their_reference():
    record = {"kind": "eval", "step": 4, "recall": 0.85, "fd": 12.345, "reference_fd": 8.31, "count": 64,
              "spread_skill": 0.8, "mode_left": 0.4, "mode_gap": 0.1, "time": 1.7e9}
    assert list(headline(record)) == ["fd", "recall", "spread_skill", "mode_gap", "mode_left"]
    assert summary(record).startswith("fd 12.3 (data 8.31), recall 0.85, spread_skill 0.8")
    assert sorted([3.0, 1.0, 2.0], key=lambda v: sort_key("fd", v)) == [1.0, 2.0, 3.0]
    assert sorted([0.2, 0.9, 0.5], key=lambda v: sort_key("success", v)) == [0.9, 0.5, 0.2]
    assert sorted([0.5, 1.3, 0.95], key=lambda v: sort_key("spread_skill", v)) == [0.95, 1.3, 0.5]


def test_printed_numbers_are_rounded_and_time_stamps_keep_their_seconds():
    assert rounded({"a": 0.03999999999999998, "b": [1 / 3], "t": 1795930123.4567, "n": 3, "s": "x"}) == \
        {"a": 0.04, "b": [0.333333], "t": 1795930123.457, "n": 3, "s": "x"}


@pytest.fixture(scope="module")
def image_run(tmp_path_factory) -> Path:
    """A micro image run on 30 data images, logging to MLflow's file store."""
    run = tmp_path_factory.mktemp("scores") / "run"
    original = quality.TRAIN_STEPS
    quality.TRAIN_STEPS = 5  # the feature network's plumbing is under test, not its quality
    try:
        assert main(["train", "--out", str(run), *micro_args("data.max_items=30", "logging.mlflow=true")]) == 0
    finally:
        quality.TRAIN_STEPS = original
    return run


def test_image_eval_scores_as_many_data_images_with_a_reference_kept_per_data_set(image_run, capsys, monkeypatch):
    monkeypatch.setattr(quality, "TRAIN_STEPS", 5)
    capsys.readouterr()
    assert main(["eval", str(image_run), "--count", "10", "--steps", "2", "--json"]) == 0
    captured = capsys.readouterr()
    record = json.loads(captured.out)
    assert record["count"] == 10 and record["data_count"] == 10 and record["reference_count"] == 10
    assert 0 <= record["density"] and 0 <= record["coverage"] <= 1
    assert record["reference_fd"] >= 0 and 0 < record["reference_recall"] <= 1
    assert "sampling: 10 samples" in captured.err  # progress on stderr, the record alone on stdout
    cfg = yaml.safe_load((image_run / "config.yaml").read_text())
    kept = quality.cache_path(cfg["data"]["source"], 30, 8, 1).with_suffix("")
    stored = json.loads(kept.with_name(f"{kept.name}-reference-10.json").read_text())["scores"]
    assert rounded(stored) == {k: v for k, v in record.items() if k.startswith("reference_")}
    assert main(["eval", str(image_run), "--count", "10", "--steps", "2"]) == 0
    table = capsys.readouterr().out
    assert "data vs data" in table and f"{stored['reference_fd']:.4g}" in table


def test_image_eval_of_more_samples_than_data_images_says_so(image_run, capsys, monkeypatch):
    monkeypatch.setattr(quality, "TRAIN_STEPS", 5)
    capsys.readouterr()
    assert main(["eval", str(image_run), "--count", "40", "--steps", "2", "--json"]) == 0
    captured = capsys.readouterr()
    record = json.loads(captured.out)
    assert record["data_count"] == 30 and "reference_fd" not in record
    assert "note: 40 samples scored against all 30 images the data holds" in captured.err
    assert "note: the reference scores no other data images (too few) against those 30" in captured.err


def test_scores_reach_status_the_report_tensorboard_and_mlflow(image_run, capsys, monkeypatch):
    monkeypatch.setattr(quality, "TRAIN_STEPS", 5)
    assert main(["eval", str(image_run), "--count", "10", "--steps", "2", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert main(["status", str(image_run)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("eval at step"))
    assert line.startswith(f"eval at step 8: fd {record['fd']:.3g} (data {record['reference_fd']:.3g}), precision ")
    assert main(["report", str(image_run)]) == 0
    page = (image_run / "report.html").read_text()
    section = page.split('<section id="evaluations">', 1)[1].split("</section>", 1)[0]
    assert '<img alt="fd over training"' in section and '<img alt="coverage over training"' in section
    assert "<th>density</th>" in section and f"(data {record['reference_fd']:.4g})" in section
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(image_run / "tb"))
    events.Reload()
    assert events.Scalars("eval/fd")[-1].step == 8
    assert events.Scalars("eval/fd")[-1].value == pytest.approx(record["fd"], rel=1e-5)
    found = list((image_run / "mlruns").rglob("metrics/eval/fd"))
    assert found and found[0].read_text().split()[-1] == "8"  # timestamp value step


_SCORING = ("import json, os, sys; k = float(sys.argv[1]); d = sys.argv[2]; os.makedirs(d, exist_ok=True); "
            "open(os.path.join(d, 'metrics.jsonl'), 'w').write(json.dumps({'step': 1, 'loss': 1 / k}) + '\\n' "
            "+ json.dumps({'kind': 'eval', 'step': 1, 'fd': 10 / k, 'recall': k / 10, 'reference_fd': 1.0}) + '\\n')")


def test_sweep_collect_and_report_have_a_column_per_score_sorted_best_first(tmp_path):
    done = run_cli("sweep", "run", "--axis", "k=2,5,1", "--out", str(tmp_path / "sw"), "--",
                   "python3", "-c", _SCORING, "{k}", "{run_dir}", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    code, shown = run_in_terminal("sweep", "collect", str(tmp_path / "sw"), "--sort", "fd")  # 80 columns
    assert code == 0, shown
    assert all(len(line) <= 80 for line in shown.splitlines() if not line.startswith("wrote "))
    assert re.search(r"┃\s+fd\s+┃", shown) and re.search(r"┃\s+recall\s+┃", shown)  # each score's name whole
    with (tmp_path / "sw" / "collect-summary.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["k"] for r in rows] == ["5", "2", "1"]  # lowest FD first
    assert [float(r["fd_mean"]) for r in rows] == [2.0, 5.0, 10.0] and float(rows[0]["recall_mean"]) == 0.5
    with (tmp_path / "sw" / "collect-runs.csv").open() as f:
        assert list(csv.DictReader(f))[0]["fd"] == "5"
    by_recall = run_cli("sweep", "collect", str(tmp_path / "sw"), "--sort", "recall", "--json", cwd=tmp_path)
    assert [(r["k"], r["recall_mean"]) for r in json.loads(by_recall.stdout)] == [("5", 0.5), ("2", 0.2),
                                                                                  ("1", 0.1)]
    refused = run_cli("sweep", "collect", str(tmp_path / "sw"), "--sort", "crps", cwd=tmp_path)
    assert refused.returncode == 2 and "error: --sort crps is not a column of this table" in refused.stderr
    assert main(["sweep", "report", str(tmp_path / "sw")]) == 0
    page = (tmp_path / "sw" / "report.html").read_text()
    assert "<th>fd_mean</th>" in page and "<th>recall</th>" in page and 'alt="fd (lower is better)"' in page
    assert os.path.getsize(tmp_path / "sw" / "report.html") > 0
