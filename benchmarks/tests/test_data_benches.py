"""The data benchmarks dry-run on the CPU with tiny sizes: the generated image folder, start-up
before and after the decoded cache, and streamed against resident training (no timings asserted)."""

from __future__ import annotations

import json
import re

import numpy as np
from PIL import Image

from benchmarks import datastart, imagefolder, streaming


def test_the_generated_folder_has_its_images_in_ten_classes_the_same_with_any_worker_count(tmp_path):
    one = imagefolder.make_image_folder(tmp_path / "one", 23, side=12, workers=1)
    two = imagefolder.make_image_folder(tmp_path / "two", 23, side=12, workers=2)
    files = sorted(p.relative_to(one) for p in one.rglob("*.png"))
    assert len(files) == 23 and len({f.parts[0] for f in files}) == 10
    assert files == sorted(p.relative_to(two) for p in two.rglob("*.png"))
    with Image.open(one / files[0]) as a, Image.open(two / files[0]) as b:
        assert a.size == (12, 12) and np.array_equal(np.asarray(a), np.asarray(b))


def test_start_up_before_and_after_the_cache_read_the_same_images(tmp_path, capsys):
    out = tmp_path / "start.json"
    assert datastart.main(["--images", "30", "--side", "16", "--size", "8", "--gen-workers", "2",
                           "--restarts", "1", "--work", str(tmp_path / "w"), "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    shapes = {record["before"]["shape"], record["first_start"]["shape"], record["restarts"][0]["shape"]}
    assert shapes == {"(30, 3, 8, 8)"}
    assert list((tmp_path / "w" / "cache" / "decoded").glob("*.u8"))  # the first start built the cache
    printed = capsys.readouterr().out
    assert "first start (cache build, " in printed and "restart (cache read): " in printed


def test_streamed_and_resident_runs_report_speed_data_wait_and_memory(tmp_path, capsys):
    out = tmp_path / "streaming.json"
    assert streaming.main(["--preset", "tiny", "--images", "40", "--side", "16", "--steps", "4", "--log-every", "2",
                           "--gen-workers", "2", "--work", str(tmp_path / "w"), "--json", str(out),
                           "--set", "train.batch_per_gpu=8", "--set", "train.sample_steps=1"]) == 0
    records = {r["resident"]: r for r in json.loads(out.read_text())["records"]}
    for r in records.values():
        assert r["exit_code"] == 0 and r["samples_per_s"] > 0 and 0 <= r["data_wait_share"] <= 1
        assert r["rank_rss_gib"] > 0 and r["summary"].startswith("data wait: ")
    assert records["on"]["loader_workers"] == 0 and "resident on the device" in records["on"]["data"]
    streamed = records["off"]
    started = int(re.search(r"(\d+) loader workers? per rank", streamed["data"]).group(1))
    assert "streamed from disk" in streamed["data"] and started >= 1
    # sampled twice a second: a worker that lived less than that may be missed, none is invented
    assert streamed["loader_workers"] <= started and all(w > 0 for w in streamed["worker_rss_gib"])
    assert "tiny: streamed " in capsys.readouterr().out
