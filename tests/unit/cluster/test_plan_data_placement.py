"""plan's preflight of an image run's data: its size read cheaply here (the decoded cache's header
or the format's listing), resident on the device beside the model or streamed by loader workers
budgeted with the host-memory model, on a SLURM and a Grid Engine profile."""

from __future__ import annotations

import io
import re
import tarfile

import numpy as np
import pytest
from PIL import Image

from diffscale.cli import main
from diffscale.cluster.planning.plan import make_plan
from diffscale.cluster.planning.shape import Shape
from diffscale.cluster.planning.workload import diffscale_run, job_config
from diffscale.cluster.profiles.loading import load_profile
from diffscale.config import merge, presets
from diffscale.tasks.images.datasize import data_size

from cluster_fixtures import FIXTURES, fixture_profile

SGE = str(FIXTURES / "sge-two-host.yaml")
"""Grid Engine: 2 A100-80GB per host, 4 cores and 64 GiB per host."""


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DIFFSCALE_CACHE_DIR", str(tmp_path / "cache"))


def idx_images(root, count, side=28):
    """An MNIST image file of ``count`` images whose pixels are never written: a sparse file, so
    a data set larger than a GPU costs no disk (plan reads its 16-byte header only)."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "train-images-idx3-ubyte", "wb") as out:
        out.write(b"".join(v.to_bytes(4, "big") for v in (2051, count, side, side)))
        out.truncate(16 + count * side * side)
    return root


def _png(gray=False) -> bytes:
    out = io.BytesIO()
    Image.new("L" if gray else "RGB", (12, 12), 200).save(out, format="PNG")
    return out.getvalue()


def _folder(root, count, gray=False):
    (root / "a").mkdir(parents=True)
    for i in range(count):
        (root / "a" / f"{i}.png").write_bytes(_png(gray))
    return root


def _run(tmp_path, spec, preset="medium", **data):
    cfg = merge(presets.get_preset(preset), {"data": {"source": spec, **data}})
    return diffscale_run(job_config(cfg), str(tmp_path / "run"), "python3")


def _row(plan, name="data on the device"):
    return next(c for c in plan.checks if c.name == name)


def test_each_format_is_sized_from_its_listing_without_decoding(tmp_path):
    folder = _folder(tmp_path / "pics", 5)
    assert data_size(f"imagefolder:{folder}", 64).describe() == (
        "5 items x 3x64x64 = 0.1 MiB (listed: image files; 3 channels assumed until decoded)")
    assert data_size(f"imagefolder:{folder}", 64, max_items=2).items == 2
    (tmp_path / "shards").mkdir()
    with tarfile.open(tmp_path / "shards" / "0.tar", "w") as tar:
        for name, raw in (("k1.png", _png()), ("k1.cls", b"3"), ("k2.jpg", _png()), ("k3.txt", b"no image")):
            info = tarfile.TarInfo(name)
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    shards = data_size(f"webdataset:{tmp_path / 'shards'}", 32)
    assert (shards.items, shards.how) == (2, "listed: tar headers; 3 channels assumed until decoded")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"image": [_png()] * 7, "label": list(range(7))}), tmp_path / "t.parquet")
    assert data_size(f"parquet:{tmp_path / 't.parquet'}", 16).items == 7
    np.savez(tmp_path / "a.npz", images=np.zeros((9, 8, 8, 3), np.uint8), labels=np.arange(9))
    npz = data_size(f"npz:{tmp_path / 'a.npz'}", 8)
    assert (npz.items, npz.channels, npz.how) == (9, 3, "the array's header")
    mnist = idx_images(tmp_path / "mn", 123)
    assert data_size(f"mnist:{mnist}", 28).describe() == "123 items x 1x28x28 = 0.1 MiB (the IDX header)"
    assert data_size(f"imagefolder:{tmp_path / 'missing'}", 8) is None and data_size("builtin:mix", 8) is None


def test_the_decoded_cache_header_gives_the_exact_channels(tmp_path):
    from diffscale.tasks.images.dataset import open_image_data

    folder = _folder(tmp_path / "gray", 4, gray=True)
    assert data_size(f"imagefolder:{folder}", 16).channels == 3  # assumed before decoding
    open_image_data(f"imagefolder:{folder}", 16)
    size = data_size(f"imagefolder:{folder}", 16)
    assert (size.items, size.channels, size.how) == (4, 1, "the decoded cache's header on this host")


def test_grid_engine_small_data_stays_resident_beside_the_model(tmp_path):
    folder = _folder(tmp_path / "pics", 5)
    plan = make_plan(fixture_profile("sge-two-host"), Shape(1, 2), _run(tmp_path, f"imagefolder:{folder}"))
    row = _row(plan)
    assert (row.status, row.fix) == ("pass", "")
    assert row.detail == (
        "5 items x 3x64x64 = 0.1 MiB (listed: image files; 3 channels assumed until decoded): resident on the "
        "device (0.1 MiB fits 25% of 75 GiB A100-80GB memory); with the model (~25.8 GB, estimated) ~25.8 GB of "
        "80 GB per A100-80GB")
    assert "loader workers" not in _row(plan, "host RAM per node").detail


def test_grid_engine_data_larger_than_the_gpu_streams_with_the_workers_its_cores_allow(tmp_path):
    mnist = idx_images(tmp_path / "mn", 8_000_000)
    plan = make_plan(fixture_profile("sge-two-host"), Shape(1, 2), _run(tmp_path, f"mnist:{mnist}"))
    row = _row(plan)
    assert (row.status, row.fix) == ("pass", "")
    assert row.detail == (
        "8,000,000 items x 1x64x64 = 30.52 GiB (the IDX header): streamed from disk (30.52 GiB exceeds 25% of "
        "75 GiB A100-80GB memory); 1 loader worker per rank (1 of 2 CPUs per rank), counted in the host RAM row")
    assert _row(plan, "host RAM per node").detail == (
        "2 ranks x (1 rank ~3.0 GiB + 1 loader workers x ~1.0 GiB) = 8 GiB (estimated) of 64 GiB")
    assert any(n.startswith("host memory 10 GiB per node: 2 ranks x (1 rank ~3.0 GiB + 1 loader workers")
               for n in plan.notes)


def test_grid_engine_workers_that_do_not_fit_the_memory_asked_warn_with_the_reason(tmp_path, capsys):
    mnist = idx_images(tmp_path / "mn", 8_000_000)
    run = _run(tmp_path, f"mnist:{mnist}", workers=4)
    row = _row(make_plan(fixture_profile("sge-two-host"), Shape(1, 2, mem_per_node_gb=8), run))
    assert (row.status, row.fix) == ("WARN", "ask for more host memory (--mem), or fewer ranks per node "
                                             "(--gpus-per-node), for 4 workers")
    assert row.detail.endswith("1 loader worker per rank (4 requested, 1 fit: 2 ranks share 8 GiB (~1.0 GiB per "
                               "worker)), counted in the host RAM row")
    assert main(["plan", "--cluster", SGE, "--gpus-per-node", "2", "--mem", "8", "--preset", "medium",
                 "--data", f"mnist:{mnist}", "--set", "data.workers=4", "--out", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert re.search(r"│ data on the device +│ WARN +│", out)
    assert "preflight (1x2): 11 of 11 checks passed (1 with a warning)" in out


def test_slurm_streamed_data_asks_for_the_workers_memory(tmp_path, capsys):
    mnist = idx_images(tmp_path / "mn", 20_000_000)
    assert main(["plan", "--cluster", "nyu-torch", "--account", "a", "--gpus-per-node", "4", "--preset", "medium",
                 "--data", f"mnist:{mnist}", "--out", str(tmp_path / "run")]) == 0
    out = " ".join(capsys.readouterr().out.split())  # notes wrap
    assert "#SBATCH --mem=30G" in out  # 4 x (3 + 3 workers x 1 GiB), + a quarter
    assert ("note: host memory 30 GiB per node: 4 ranks x (1 rank ~3.0 GiB + 3 loader workers x ~1.0 GiB) = 24 GiB, "
            "plus a quarter for headroom; 3 loader workers per rank counted (the streaming path") in out
    plan = make_plan(load_profile("nyu-torch"), Shape(1, 4), _run(tmp_path, f"mnist:{mnist}"))
    assert _row(plan).detail == (
        "20,000,000 items x 1x64x64 = 76.29 GiB (the IDX header): streamed from disk (76.29 GiB exceeds 25% of "
        "45 GiB L40S memory); 3 loader workers per rank (3 of 4 CPUs per rank), counted in the host RAM row")
    assert _row(plan, "host RAM per node").status == "pass"


def test_slurm_resident_data_forced_beyond_the_gpu_fails_naming_the_fix(tmp_path, capsys):
    mnist = idx_images(tmp_path / "mn", 8_000_000)
    argv = ["plan", "--cluster", "nyu-torch", "--account", "a", "--gpus-per-node", "1", "--preset", "medium",
            "--data", f"mnist:{mnist}", "--set", "data.resident=on", "--out", str(tmp_path / "run")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "error: preflight check 'data on the device' failed: 8,000,000 items x 1x64x64 = 30.52 GiB (the IDX header): "
        "resident on the device (30.52 GiB; data.resident on); with the model (~25.8 GB, estimated) ~58.5 GB > 90% "
        "of 48 GB per L40S -- stream it from the decoded cache: --set data.resident=auto, or train on fewer items "
        "(--set data.max_items=4260176); or pass --force to go ahead anyway")
    assert not (tmp_path / "run").exists()
    assert main([*argv[:-4], "--set", "data.resident=on", "--set", "data.max_items=4260176", *argv[-2:]]) == 0


def test_plan_of_an_image_folder_loads_no_torch(tmp_path):
    import subprocess
    import sys

    folder = _folder(tmp_path / "pics", 3)
    code = ("import json, sys\nfrom diffscale.cli import main\nmain(sys.argv[1:])\n"
            "print('loaded:', json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'torch')))")
    done = subprocess.run([sys.executable, "-c", code, "plan", "--cluster", "nyu-torch", "--account", "a",
                           "--preset", "medium", "--data", f"imagefolder:{folder}", "--out", str(tmp_path / "r")],
                          capture_output=True, text=True, timeout=300)
    assert re.search(r"│ data on the device +│ pass +│", done.stdout), done.stderr
    assert done.stdout.strip().endswith("loaded: []")


def test_a_gpu_of_unknown_memory_leaves_auto_to_the_job_but_plans_a_forced_stream(tmp_path):
    mnist = idx_images(tmp_path / "mn", 1000)
    bu = load_profile("bu-scc")  # Grid Engine; its any-gpu class documents no GPU memory
    auto = _row(make_plan(bu, Shape(1, 1, partition="any-gpu"), _run(tmp_path, f"mnist:{mnist}")))
    assert (auto.status, auto.detail) == ("unknown", "1,000 items x 1x64x64 = 3.9 MiB (the IDX header); the "
                                                     "profile does not say how much memory a 'any-gpu' GPU has: the "
                                                     "job decides as it starts (data.resident auto)")
    off = _row(make_plan(bu, Shape(1, 1, partition="any-gpu"), _run(tmp_path, f"mnist:{mnist}", resident="off")))
    assert (off.status, off.detail) == ("pass", "1,000 items x 1x64x64 = 3.9 MiB (the IDX header): streamed from disk "
                                                "(3.9 MiB; data.resident off); 3 loader workers per rank (3 of 4 CPUs "
                                                "per rank), counted in the host RAM row")


def test_a_streamed_rank_with_one_cpu_warns_that_it_reads_its_own_batches(tmp_path):
    mnist = idx_images(tmp_path / "mn", 8_000_000)
    plan = make_plan(fixture_profile("sge-two-host"), Shape(1, 2, cpus_per_rank=1), _run(tmp_path, f"mnist:{mnist}"))
    row = _row(plan)
    assert (row.status, row.fix) == ("WARN", "give each rank a CPU for a loader worker (--cpus-per-task 2 or more): "
                                             "without one the training process reads its own batches and waits for "
                                             "them")
    assert "0 loader workers per rank (0 of 1 CPUs per rank)" in row.detail
