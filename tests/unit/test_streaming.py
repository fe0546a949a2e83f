"""The streaming path: the resident path's batches read from the decoded cache by loader workers,
exact resume through it, and how the path and the workers are chosen."""

from __future__ import annotations

import numpy as np
import psutil
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from diffscale.cli import main
from diffscale.data.device_loader import DataPosition, DeviceBatcher, micro_slice
from diffscale.data.streaming import StreamingBatcher, resident_choice, stream_workers
from diffscale.runtime import checkpoint as ckpt

from helpers import micro_args


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DIFFSCALE_CACHE_DIR", str(tmp_path / "cache"))


def _array(tmp_path, n=40):
    images = np.random.default_rng(1).integers(0, 255, (n, 1, 4, 4), dtype=np.uint8)
    path = tmp_path / "rows.u8"
    path.write_bytes(images.tobytes())
    return path, images


@pytest.mark.parametrize("workers", [0, 1])
def test_each_rank_streams_its_rows_of_the_resident_global_batch(tmp_path, workers):
    path, images = _array(tmp_path)
    world, per_gpu, accum = 2, 3, 2
    glob = world * per_gpu * accum
    resident = DeviceBatcher(40, glob, 7, torch.device("cpu"), DataPosition(0, 24))
    resident.restrict(0.9, 3)
    streams = [StreamingBatcher(path, images.shape, glob, 7, torch.device("cpu"), DataPosition(0, 24), rank=r,
                                world_size=world, batch_per_gpu=per_gpu, workers=workers) for r in range(world)]
    for stream in streams:
        stream.restrict(0.9, 3)
    for _ in range(5):  # across epoch ends
        indices = resident.next_indices()
        for rank, stream in enumerate(streams):
            assert torch.equal(stream.next_indices(), indices)
            for micro in range(accum):
                rows = micro_slice(micro, rank, world, per_gpu)
                assert torch.equal(stream.rows_of(rows), torch.from_numpy(images)[indices[rows]])
    assert streams[0].position == resident.position
    for stream in streams:  # its loader workers stop here, not in a later test's garbage collection
        stream.close()


def _folder(root, n=48):
    root.mkdir()
    rng = np.random.default_rng(0)
    for i in range(n):
        Image.fromarray(rng.integers(0, 255, (10, 10, 3), dtype=np.uint8)).save(root / f"{i:03d}.png")


def _weights(run_dir):
    last = ckpt.list_checkpoints(run_dir)[-1]
    return last.name, load_file(str(last / "model.safetensors"))


def test_streamed_training_resumes_bit_for_bit_and_matches_resident_training(tmp_path, capsys):
    _folder(tmp_path / "imgs")
    data = ["--data", f"imagefolder:{tmp_path / 'imgs'}"]
    streamed = micro_args("data.resident=off", "data.workers=1", "train.grad_accum=2", steps=8)
    straight, split, resident = tmp_path / "straight", tmp_path / "split", tmp_path / "resident"
    before = {child.pid for child in psutil.Process().children()}
    assert main(["train", "--out", str(straight), *data, *streamed]) == 0
    assert {child.pid for child in psutil.Process().children()} <= before  # its loader worker stopped with it
    out = capsys.readouterr().err
    assert "streamed from disk" in out and "data.resident off" in out and "1 loader workers per rank" in out
    assert main(["train", "--out", str(split), "--max-steps", "4", *data, *streamed]) == 0
    assert main(["train", "--out", str(split), "--resume", "auto", *data, *streamed]) == 0
    assert main(["train", "--out", str(resident), *data,
                 *micro_args("data.resident=on", "train.grad_accum=2", steps=8)]) == 0
    assert "resident on the device" in capsys.readouterr().err
    (name_a, a), (name_b, b), (name_c, c) = _weights(straight), _weights(split), _weights(resident)
    assert name_a == name_b == name_c == "step_00000008"
    for key in a:
        assert torch.equal(a[key], b[key]), key
        assert torch.equal(a[key], c[key]), key


def test_auto_keeps_data_resident_when_it_fits_a_share_of_memory():
    cpu = torch.device("cpu")
    assert resident_choice("auto", 1000, cpu)[0]
    fits, why = resident_choice("auto", 1 << 60, cpu)
    assert not fits and why.startswith("streamed from disk (") and "exceeds 25% of" in why and "host memory" in why


def test_more_workers_asked_than_fit_get_fewer_with_the_reason(monkeypatch):
    from diffscale.runtime import resources

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.setattr(resources, "host_memory_bytes", lambda: 16 * resources.GIB)
    monkeypatch.setattr(resources, "cpus_for_rank", lambda ranks: 8)
    workers, why = stream_workers(6)
    assert workers == 1 and why == "6 requested, 1 fit: 4 ranks share 16 GiB (~1.0 GiB per worker)"
    monkeypatch.setattr(resources, "host_memory_bytes", lambda: 256 * resources.GIB)
    assert stream_workers(0) == (7, "7 of 8 CPUs per rank")


@pytest.mark.parametrize("resident", ["on", "off"])
def test_every_window_records_its_data_wait_share_in_metrics_tensorboard_and_the_summary(tmp_path, capsys,
                                                                                         resident):
    import json

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _folder(tmp_path / "imgs")
    run = tmp_path / "run"
    assert main(["train", "--out", str(run), "--data", f"imagefolder:{tmp_path / 'imgs'}",
                 *micro_args(f"data.resident={resident}", "data.workers=1", steps=6)]) == 0
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    windows = [r for r in records if "loss" in r]
    assert [r["step"] for r in windows] == [2, 4, 6]
    assert all(0.0 <= r["data_wait_share"] <= 1.0 for r in windows)
    events = EventAccumulator(str(run / "tb"))
    events.Reload()
    assert [e.step for e in events.Scalars("train/data_wait_share")] == [2, 4, 6]
    out = capsys.readouterr().err
    assert "data wait " in next(line for line in out.splitlines() if line.startswith("step 6/6"))
    [summary] = [line for line in out.splitlines() if line.startswith("data wait: ")]
    assert summary.endswith(" s waiting for the next batch)") and "% of the training time (" in summary


@pytest.mark.parametrize("resident, feed", [("on", DeviceBatcher), ("off", StreamingBatcher)])
def test_the_time_the_loop_waits_on_a_slow_feed_is_counted(tmp_path, capsys, monkeypatch, resident, feed):
    """A feed whose every batch takes at least 0.25 s (a sleep: never shorter) over 4 steps: the
    summary counts at least 1 s of waiting, and every window a share above 0."""
    import json
    import re
    import time

    prompt = feed.next_indices

    def late(self, out=None):
        time.sleep(0.25)
        return prompt(self, out)

    monkeypatch.setattr(feed, "next_indices", late)
    _folder(tmp_path / "imgs")
    run = tmp_path / "run"
    assert main(["train", "--out", str(run), "--data", f"imagefolder:{tmp_path / 'imgs'}",
                 *micro_args(f"data.resident={resident}", steps=4)]) == 0
    summary = next(line for line in capsys.readouterr().err.splitlines() if line.startswith("data wait: "))
    waited, total = (float(v) for v in re.search(r"\(([\d.]+) s of (\d+) s waiting", summary).groups())
    assert waited >= 1.0 and total >= round(waited) - 1
    shares = [json.loads(line)["data_wait_share"] for line in (run / "metrics.jsonl").read_text().splitlines()
              if '"loss"' in line]
    assert len(shares) == 2 and all(share > 0 for share in shares)
