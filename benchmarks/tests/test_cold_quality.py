"""The cold time-to-quality benchmark on the CPU: a one-level micro network started on an empty
cache of its own, each checkpoint scored; the plain recipe's record given. (Its stop by the clock,
SIGTERM as a scheduler sends it, is the GPU run's: a CPU test would race the machine's speed.)"""

import json

from benchmarks.cold_quality import TARGET_SHARE, main, summary

MICRO = ["model.sample_size=8", "model.block_out_channels=[8]", "model.attention=[false]",
         "model.layers_per_block=1", "model.norm_num_groups=8", "train.batch_per_gpu=8", "train.steps=200"]


def _plain(path, fd, seconds):
    points = [{"seconds": 0.0, "steps": 0, "images": 0, "fd": 10 * fd}, {"seconds": seconds, "steps": 9, "images": 9,
                                                                          "fd": fd}]
    path.write_text(json.dumps({"runs": [{"preset": "tiny", "recipe": "plain", "name": "plain", "device": "CPU",
                                          "points": points}]}))
    return path


def test_each_checkpoint_of_a_cold_run_is_scored_at_its_seconds_from_the_start(tmp_path, capsys):
    plain = _plain(tmp_path / "plain.json", fd=1e9, seconds=100.0)  # any FD reaches it: the first point does
    args = ["--preset", "tiny", "--seconds", "60", "--checkpoint-every", "50", "--count", "8", "--eval-steps", "2",
            "--plain-json", str(plain), "--out", str(tmp_path / "out"), *[a for s in MICRO for a in ("--set", s)]]
    assert main(args) == 0
    result = json.loads((tmp_path / "out" / "cold_quality.json").read_text())
    points = result["points"]
    assert [p["steps"] for p in points] == [50, 100, 150, 200]  # ended by its steps within the minute
    assert all(0 < a["seconds"] < b["seconds"] for a, b in zip(points, points[1:], strict=False))
    assert all(p["fd"] > 0 for p in points)
    assert result["summary"]["reach_plain_final_s"] == points[0]["seconds"]
    assert result["summary"]["share_of_plain_time"] == points[0]["seconds"] / 100.0
    assert result["events"] == {"first_step_s": None, "compiled_step": None}  # eager on the CPU: no compile to wait for
    # the run started on a cache of its own: the built-in data rendered there, not read from the session's
    assert list((tmp_path / "out" / "cold" / "cache" / "builtin").glob("*.npy"))
    assert "python -m benchmarks.cold_quality --preset tiny" in result["about"]["command"]
    assert "the cold run reached it" in capsys.readouterr().out


def test_the_summary_is_the_first_crossing_as_a_share_of_the_plain_budget():
    plain = {"points": [{"seconds": 0.0, "fd": 400.0}, {"seconds": 240.0, "fd": 40.0}]}
    points = [{"seconds": 30.0, "fd": 100.0}, {"seconds": 50.0, "fd": 20.0}, {"seconds": 70.0, "fd": 10.0}]
    result = summary(plain, points)
    assert result["reach_plain_final_s"] == 45.0  # 100 -> 20 between 30 and 50 s: 40 at 45 s
    assert result["share_of_plain_time"] == 45.0 / 240.0 and result["target_met"] is (45.0 / 240.0 <= TARGET_SHARE)
    assert summary(plain, points[:1])["reach_plain_final_s"] is None and not summary(plain, points[:1])["target_met"]


def test_a_plain_record_trained_beside_the_cold_run_is_waited_for_and_a_missing_one_is_named(tmp_path):
    import argparse
    import threading

    import pytest

    from benchmarks.cold_quality import plain_record

    path = tmp_path / "plain" / "quality_time.json"
    args = argparse.Namespace(plain_json=path, plain_wait=60.0, preset="tiny")
    path.parent.mkdir()
    writer = threading.Timer(0.5, lambda: _plain(path, fd=5.0, seconds=240.0))  # the other GPU's run ends
    writer.start()
    assert plain_record(args)["points"][-1]["fd"] == 5.0
    writer.join()
    args = argparse.Namespace(plain_json=tmp_path / "none.json", plain_wait=0.1, preset="tiny")
    with pytest.raises(SystemExit, match=r"none\.json: not there after 0\.1 s"):
        plain_record(args)
