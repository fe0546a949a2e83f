"""The decoded cache of image data sets: built once, in parallel, shared, rebuilt when stale;
image folders, WebDataset shards and Parquet / Arrow tables; bad images counted and skipped."""

from __future__ import annotations

import io
import json
import os
import tarfile
import threading

import numpy as np
import pytest
from PIL import Image

from diffscale.data import decoded_cache
from diffscale.errors import UserError
from diffscale.tasks.images import decoded
from diffscale.tasks.images.dataset import open_image_data


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DIFFSCALE_CACHE_DIR", str(tmp_path / "cache"))


def _png(color, size=(20, 20), mode="RGB") -> bytes:
    out = io.BytesIO()
    Image.new(mode, size, color).save(out, format="PNG")
    return out.getvalue()


def _classes(root, per_class=3):
    for c, color in enumerate([(255, 0, 0), (0, 255, 0), (0, 0, 255)]):
        (root / f"class{c}").mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            (root / f"class{c}" / f"{i}.png").write_bytes(_png(color))


def test_imagefolder_is_decoded_once_then_memory_mapped_with_class_labels(tmp_path):
    _classes(tmp_path / "data")
    notes: list[str] = []
    first = open_image_data(f"imagefolder:{tmp_path / 'data'}", 8, say=notes.append)
    assert first.shape == (9, 3, 8, 8) and isinstance(first.images, np.memmap)
    assert first.class_names == ["class0", "class1", "class2"]
    assert first.labels.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert first.images[4, 1].min() == 255 and first.images[4, 0].max() == 0  # class1 is green
    header = json.loads(first.cache.with_suffix(".json").read_text())
    assert header["format"] == decoded_cache.CACHE_FORMAT and header["count"] == 9 and header["shape"] == [9, 3, 8, 8]
    mtime = first.cache.stat().st_mtime_ns
    again = open_image_data(f"imagefolder:{tmp_path / 'data'}", 8, say=notes.append)
    assert again.cache.stat().st_mtime_ns == mtime and np.array_equal(again.images, first.images)
    assert notes == []


def test_parallel_decoding_writes_the_same_array_as_one_process(tmp_path, monkeypatch):
    _classes(tmp_path / "data", per_class=5)
    from diffscale.tasks.images import formats
    monkeypatch.setattr(formats, "JOB_ITEMS", 4)
    monkeypatch.setattr(decoded, "decode_workers", lambda jobs: 2)
    pooled = np.array(open_image_data(f"imagefolder:{tmp_path / 'data'}", 8).images)
    monkeypatch.setattr(decoded, "decode_workers", lambda jobs: 1)
    monkeypatch.setenv("DIFFSCALE_CACHE_DIR", str(tmp_path / "other"))
    inline = np.array(open_image_data(f"imagefolder:{tmp_path / 'data'}", 8).images)
    assert np.array_equal(pooled, inline) and pooled.shape == (15, 3, 8, 8)


def test_changed_files_and_another_format_rebuild_with_a_note(tmp_path, monkeypatch):
    _classes(tmp_path / "data", per_class=1)
    notes: list[str] = []
    first = open_image_data(f"imagefolder:{tmp_path / 'data'}", 8, say=notes.append)
    (tmp_path / "data" / "class0" / "extra.png").write_bytes(_png((9, 9, 9)))
    assert open_image_data(f"imagefolder:{tmp_path / 'data'}", 8, say=notes.append).shape[0] == 4
    assert "the source files changed" in notes[-1]
    monkeypatch.setattr(decoded_cache, "CACHE_FORMAT", decoded_cache.CACHE_FORMAT + 1)
    assert open_image_data(f"imagefolder:{tmp_path / 'data'}", 8, say=notes.append).shape[0] == 4
    assert f"written by cache format {decoded_cache.CACHE_FORMAT - 1}" in notes[-1]
    first.cache.write_bytes(b"short")  # a cut-short array file is rebuilt too
    assert open_image_data(f"imagefolder:{tmp_path / 'data'}", 8, say=notes.append).shape[0] == 4
    assert "cannot be read" in notes[-1]


def test_bad_images_are_skipped_up_to_max_bad_fraction(tmp_path):
    _classes(tmp_path / "data", per_class=10)
    (tmp_path / "data" / "class0" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    notes: list[str] = []
    data = open_image_data(f"imagefolder:{tmp_path / 'data'}", 8, max_bad_fraction=0.05, say=notes.append)
    assert data.shape[0] == 30 and len(data.labels) == 30
    assert notes == [f"warning: skipped 1 of 31 images in imagefolder:{tmp_path / 'data'} that cannot be read "
                     f"({tmp_path / 'data' / 'class0' / 'broken.png'} (OSError))"]
    with pytest.raises(UserError) as err:
        open_image_data(f"imagefolder:{tmp_path / 'data'}", 12, max_bad_fraction=0.01, say=notes.append)
    assert err.value.message == (
        f"1 of 31 images in imagefolder:{tmp_path / 'data'} cannot be read "
        f"({tmp_path / 'data' / 'class0' / 'broken.png'} (OSError)), more than data.max_bad_fraction = 0.01 allows "
        "-- remove or replace the damaged files, or raise data.max_bad_fraction to skip them")
    written = [p for p in (tmp_path / "cache" / "decoded").glob("*12px*") if p.suffix != ".lock"]
    assert not written  # nothing half-written


def test_mixed_modes_and_sizes_are_converted_and_said_once(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.png").write_bytes(_png(128, (30, 20), mode="L"))
    (tmp_path / "d" / "b.png").write_bytes(_png((255, 0, 0, 255), (16, 16), mode="RGBA"))
    (tmp_path / "d" / "c.png").write_bytes(_png(3, (16, 16), mode="P"))
    notes: list[str] = []
    data = open_image_data(f"imagefolder:{tmp_path / 'd'}", 8, say=notes.append)
    assert data.shape == (3, 3, 8, 8) and data.labels is None
    assert data.images[0].min() == 128 == data.images[0].max()  # gray repeated into RGB
    assert len(notes) == 1 and "mixes 3 image modes (L, P, RGBA) and 2 sizes: all converted to RGB 8x8" in notes[0]
    gray = open_image_data(f"imagefolder:{tmp_path / 'd' }", 8, max_items=1, say=notes.append)
    assert gray.shape == (1, 1, 8, 8)  # all gray: one channel


def _shard(path, samples):
    with tarfile.open(path, "w") as tar:
        for name, raw in samples:
            info = tarfile.TarInfo(name)
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))


def test_webdataset_shards_grouped_by_key_with_cls_labels(tmp_path):
    (tmp_path / "wds").mkdir()
    _shard(tmp_path / "wds" / "train-000.tar", [("s0.png", _png((255, 0, 0))), ("s0.cls", b"2"),
                                                ("s1.jpg", _png((0, 255, 0))), ("s1.cls", b"0\n")])
    _shard(tmp_path / "wds" / "train-001.tar", [("d/s2.jpeg", _png((0, 0, 255))), ("d/s2.cls", b"1"),
                                                ("d/s2.json", b"{}")])
    data = open_image_data(f"webdataset:{tmp_path / 'wds'}", 8)
    assert data.shape == (3, 3, 8, 8) and data.labels.tolist() == [2, 0, 1]
    assert data.images[2, 2].min() == 255
    glob_data = open_image_data(f"webdataset:{tmp_path / 'wds' / 'train-00[1].tar'}", 8)
    assert glob_data.shape[0] == 1
    _shard(tmp_path / "wds" / "train-002.tar", [("x.txt", b"no image")])
    with pytest.raises(UserError, match="train-002.tar' holds no samples with an image .* -- remove the empty shard"):
        open_image_data(f"webdataset:{tmp_path / 'wds'}", 8)
    with pytest.raises(UserError, match="no .tar shards at"):
        open_image_data(f"webdataset:{tmp_path / 'nothing'}", 8)


def test_parquet_and_arrow_tables_with_image_bytes_or_structs(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    images = [_png((255, 0, 0)), _png((0, 255, 0)), b"broken", _png((0, 0, 255))]
    table = pa.table({"image": [{"bytes": b, "path": None} for b in images], "label": [0, 1, 1, 2]})
    meta = {b"huggingface": json.dumps({"info": {"features": {"label": {"names": ["r", "g", "b"]}}}}).encode()}
    pq.write_table(table.replace_schema_metadata(meta), tmp_path / "t.parquet")
    notes: list[str] = []
    data = open_image_data(f"parquet:{tmp_path / 't.parquet'}", 8, max_bad_fraction=0.5, say=notes.append)
    assert data.shape == (3, 3, 8, 8) and data.labels.tolist() == [0, 1, 2] and data.class_names == ["r", "g", "b"]
    assert "t.parquet#2" in notes[0]
    (tmp_path / "hf").mkdir()
    plain = pa.table({"pixels": images[:2]})
    with pa.OSFile(str(tmp_path / "hf" / "data-00000-of-00001.arrow"), "wb") as sink:
        with pa.ipc.new_stream(sink, plain.schema) as writer:
            writer.write_table(plain)
    arrow = open_image_data(f"parquet:{tmp_path / 'hf'}:pixels", 8)
    assert arrow.shape == (2, 3, 8, 8) and arrow.labels is None
    with pytest.raises(UserError, match="has no column 'image' \\(columns: pixels\\) -- name the image column"):
        open_image_data(f"parquet:{tmp_path / 'hf'}", 8)


def test_npz_labels_are_carried(tmp_path):
    images = np.random.default_rng(0).integers(0, 255, (6, 12, 12), dtype=np.uint8)
    np.savez(tmp_path / "d.npz", images=images, labels=np.arange(6) % 3)
    data = open_image_data(f"npz:{tmp_path / 'd.npz'}", 12)
    assert data.shape == (6, 1, 12, 12) and np.array_equal(data.images[:, 0], images)
    assert data.labels.tolist() == [0, 1, 2, 0, 1, 2]


def test_one_process_builds_while_the_others_wait(tmp_path, monkeypatch):
    _classes(tmp_path / "data", per_class=2)
    name, source = "x", "src"
    entered, release = threading.Event(), threading.Event()
    builds = []

    def build(path):
        builds.append(path)
        entered.set()
        release.wait(10)
        path.write_bytes(bytes(2 * 3 * 4 * 4))
        return decoded_cache.Built((2, 3, 4, 4))

    results = []
    builder = threading.Thread(target=lambda: results.append(
        decoded_cache.open_or_build(name, source, "f", build, say=print)))
    builder.start()
    assert entered.wait(10)
    with pytest.raises(UserError, match=r"waited 0 s for another process \(pid \d+ on .*\) building the decoded "
                                        r"cache of src .*delete the .lock file and start again"):
        decoded_cache.open_or_build(name, source, "f", build, say=print, wait_s=0.0)
    waiter = threading.Thread(target=lambda: results.append(
        decoded_cache.open_or_build(name, source, "f", build, say=print)))
    waiter.start()
    release.set()
    builder.join(10)
    waiter.join(10)
    assert len(builds) == 1 and len(results) == 2 and {r.built_here for r in results} == {True, False}


def test_a_lock_left_by_a_dead_process_is_taken_over(tmp_path):
    _, _, _, lock = decoded_cache.entry_paths("y")
    lock.parent.mkdir(parents=True)
    import socket
    import subprocess
    import sys
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    lock.write_text(json.dumps({"host": socket.gethostname(), "pid": int(dead.stdout)}))

    def build(path):
        path.write_bytes(bytes(4))
        return decoded_cache.Built((1, 1, 2, 2))

    assert decoded_cache.open_or_build("y", "s", "f", build, say=print, wait_s=0.0).array.shape == (1, 1, 2, 2)
    assert not lock.with_suffix(".holder").exists() and os.path.exists(lock.with_suffix(".json"))


def test_the_lock_of_a_builder_killed_while_it_holds_it_is_free_at_once(tmp_path):
    """filelock's flock lock: the kernel frees it when its holder dies, with nothing to judge stale."""
    import signal
    import subprocess
    import sys

    _, _, _, lock = decoded_cache.entry_paths("z")
    lock.parent.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen([sys.executable, "-c", f"import filelock, time; held = filelock.FileLock({str(lock)!r}, "
                               "thread_local=False); held.acquire(); print('held', flush=True); time.sleep(600)"],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"

    def build(path):
        path.write_bytes(bytes(4))
        return decoded_cache.Built((1, 1, 2, 2))

    with pytest.raises(UserError, match="waited 0 s for another process"):
        decoded_cache.open_or_build("z", "s", "f", build, say=print, wait_s=0.0)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    holder.stdout.close()
    assert decoded_cache.open_or_build("z", "s", "f", build, say=print, wait_s=0.0).built_here


def test_a_script_without_a_main_guard_builds_the_cache_in_parallel(tmp_path):
    import subprocess
    import sys

    _classes(tmp_path / "data", per_class=4)
    script = tmp_path / "script.py"
    script.write_text("from diffscale.tasks.images import decoded, formats\n"
                      "from diffscale.tasks.images.dataset import open_image_data\n"
                      "formats.JOB_ITEMS = 2\n"
                      "decoded.decode_workers = lambda jobs: 2\n"
                      f"print(open_image_data('imagefolder:{tmp_path / 'data'}', 8).shape)\n")
    env = dict(os.environ, DIFFSCALE_CACHE_DIR=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "(12, 3, 8, 8)"
