"""Data specs: real loaders on small files made here, and the messages for bad input."""

import numpy as np
import pytest
import torch
from PIL import Image

from diffscale.cli import main
from diffscale.data.device_loader import DeviceBatcher, micro_slice, shift_augment
from diffscale.errors import UserError
from diffscale.tasks.images.dataset import open_image_data
from diffscale.tasks.images.formats import parse_spec
from diffscale.tasks.images.sources import emnist_classes, load_images, load_labels

from helpers import emnist_letters, micro_args, write_idx


def test_builtin_sets_ship_with_dependencies():
    glyphs = load_images("builtin:glyphs", 16)
    digits = load_images("builtin:digits", 16)
    mix = load_images("builtin", 28)
    assert glyphs.dtype == torch.uint8 and glyphs.shape[1:] == (1, 16, 16) and glyphs.shape[0] > 2000
    assert digits.shape == (1797, 1, 16, 16)
    assert mix.shape[2:] == (28, 28)
    assert glyphs.float().mean() > 10 and glyphs.max() == 255  # white strokes on black


def test_builtin_digits_are_scikit_learns_read_without_importing_it_or_matplotlib(tmp_path):
    """Importing scikit-learn and matplotlib cost a cold start ~3 s; the built-in data needs only
    the files they ship."""
    import subprocess
    import sys

    from sklearn.datasets import load_digits

    probe = ("import sys, torch; from diffscale.tasks.images import builtin as b; "
             "x = b._render_builtin('mix', 8); labels, _ = b.builtin_labels('mix', len(x)); "
             "torch.save((x[-1797:], labels[-1797:]), sys.argv[1]); "
             "print(sorted(m for m in ('sklearn', 'matplotlib', 'scipy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "d.pt")], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"
    images, labels = torch.load(tmp_path / "d.pt")
    sk = load_digits()
    assert torch.equal(labels, torch.from_numpy(sk.target).long())
    padded = np.pad(sk.images * (255.0 / 16.0), ((0, 0), (1, 1), (1, 1)))  # 10 x 10, one pixel of border
    assert (images[:, 0].float() - torch.nn.functional.interpolate(
        torch.from_numpy(padded).float()[:, None], size=(8, 8), mode="area")[:, 0].round()).abs().max() == 0


def test_builtin_images_are_rendered_once_then_read_from_the_cache(tmp_path, monkeypatch):
    from diffscale.tasks.images import builtin

    monkeypatch.setenv("DIFFSCALE_CACHE_DIR", str(tmp_path / "cache"))
    first = builtin.load_builtin("numerals", 12)
    (cached,) = (tmp_path / "cache").rglob("*.npy")
    assert cached.name.startswith("numerals-12px-") and not list((tmp_path / "cache").rglob("*.tmp"))

    def no_rendering(variant, size):
        raise AssertionError("rendered although cached")

    with monkeypatch.context() as m:
        m.setattr(builtin, "_render_builtin", no_rendering)
        assert torch.equal(builtin.load_builtin("numerals", 12), first)
        with pytest.raises(AssertionError):  # another size is another file
            builtin.load_builtin("numerals", 10)
    cached.write_bytes(cached.read_bytes()[:100])  # cut short (a job killed while writing elsewhere)
    assert torch.equal(builtin.load_builtin("numerals", 12), first)
    assert torch.equal(torch.from_numpy(np.load(cached)), first)  # written whole again
    monkeypatch.setenv("DIFFSCALE_CACHE_DIR", str(cached))  # a file where the folder should be
    assert torch.equal(builtin.load_builtin("numerals", 12), first)


def test_imagefolder_recursive_rgb_resized_and_cropped(tmp_path, monkeypatch):
    monkeypatch.setenv("DIFFSCALE_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "a" / "b").mkdir(parents=True)
    Image.new("RGB", (40, 20), (255, 0, 0)).save(tmp_path / "a" / "wide.png")
    Image.new("RGB", (30, 30), (0, 0, 255)).save(tmp_path / "a" / "b" / "square.jpg")
    (tmp_path / "a" / "notes.txt").write_text("not an image")
    images = open_image_data(f"imagefolder:{tmp_path / 'a'}", 16).tensor()
    assert images.shape == (2, 3, 16, 16)
    # sorted by path: b/square.jpg (blue) before wide.png (red)
    assert images[0, 2].float().mean() > 200 and images[1, 0].float().mean() > 200 and images[1, 2].float().mean() < 30


def test_imagefolder_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("DIFFSCALE_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(UserError, match="does not exist"):
        open_image_data(f"imagefolder:{tmp_path / 'missing'}", 16)
    (tmp_path / "pics").mkdir()
    with pytest.raises(UserError, match="holds no images"):
        open_image_data(f"imagefolder:{tmp_path / 'pics'}", 16)
    (tmp_path / "pics" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    with pytest.raises(UserError, match="1 of 1 images .* cannot be read .*broken.png.*remove or replace the damaged"):
        open_image_data(f"imagefolder:{tmp_path / 'pics'}", 16)


def test_an_image_folder_is_never_loaded_whole_beside_the_cache(tmp_path):
    with pytest.raises(UserError, match="is decoded into the cache, not loaded whole"):
        load_images(f"imagefolder:{tmp_path}", 16)


@pytest.mark.parametrize("array", [
    np.random.default_rng(0).integers(0, 255, (5, 12, 12), dtype=np.uint8),
    np.random.default_rng(0).integers(0, 255, (5, 12, 12, 3), dtype=np.uint8),
    np.random.default_rng(0).random((5, 12, 12), dtype=np.float32),
    np.random.default_rng(0).random((5, 12, 12), dtype=np.float32) * 2 - 1,
])
def test_npz_layouts(tmp_path, array):
    path = tmp_path / "data.npz"
    np.savez(path, images=array)
    images = load_images(f"npz:{path}", 8)
    channels = 3 if array.ndim == 4 else 1
    assert images.shape == (5, channels, 8, 8) and images.dtype == torch.uint8


def test_max_items_is_taken_before_the_float_copy_and_keeps_the_full_sets_scaling(tmp_path):
    # the first two images hold only values in [0, 1]; a later one is negative, so the whole
    # file is a [-1, 1] set, and the kept images must be scaled as such
    array = np.random.default_rng(1).random((6, 12, 12), dtype=np.float32)
    array[4] -= 1.0
    path = tmp_path / "mixed.npz"
    np.savez(path, images=array)
    whole = load_images(f"npz:{path}", 8)
    first = load_images(f"npz:{path}", 8, max_items=2)
    assert first.shape == (2, 1, 8, 8) and torch.equal(first, whole[:2])
    assert first.float().mean() > 150  # [-1, 1] scaling maps [0, 1] to 127.5..255


def test_max_items_of_mnist_keeps_the_first_images(tmp_path):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    digits = np.arange(4 * 28 * 28, dtype=np.int64).reshape(4, 28, 28) % 251
    write_idx(raw / "train-images-idx3-ubyte.gz", digits)
    whole = load_images(f"mnist:{tmp_path}", 14)
    assert torch.equal(load_images(f"mnist:{tmp_path}", 14, max_items=3), whole[:3])


def test_npz_errors(tmp_path):
    path = tmp_path / "bad.npz"
    np.savez(path, images=np.zeros((4, 8, 8), dtype=np.float32) + 3)
    with pytest.raises(UserError, match="scale floats to"):
        load_images(f"npz:{path}", 8)
    with pytest.raises(UserError, match="does not exist"):
        load_images(f"npz:{tmp_path / 'none.npz'}", 8)


def test_mnist_and_emnist_read_from_disk_without_download(tmp_path):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    digits = np.zeros((3, 28, 28), dtype=np.uint8)
    digits[:, 5:20, 10:12] = 255  # a vertical bar
    write_idx(raw / "train-images-idx3-ubyte.gz", digits)
    images = load_images(f"mnist:{tmp_path}", 28)
    assert images.shape == (3, 1, 28, 28) and images[0, 0, 10, 11] == 255
    eraw = tmp_path / "EMNIST" / "raw"
    eraw.mkdir(parents=True)
    write_idx(eraw / "emnist-letters-train-images-idx3-ubyte.gz", digits)
    letters = load_images(f"emnist:{tmp_path}:letters", 28)
    assert letters[0, 0, 11, 10] == 255  # EMNIST is stored transposed: the bar becomes horizontal
    assert parse_spec(f"emnist:{tmp_path}").option == "balanced"


def test_mnist_and_emnist_labels_follow_their_images_with_the_split_class_names(tmp_path):
    digits = np.zeros((5, 28, 28), np.uint8)
    write_idx(tmp_path / "MNIST" / "raw" / "train-images-idx3-ubyte.gz", digits)
    assert load_labels(f"mnist:{tmp_path}", 5) is None  # no labels file: an unconditional run needs none
    write_idx(tmp_path / "MNIST" / "raw" / "train-labels-idx1-ubyte.gz", [3, 1, 4, 1, 5])
    labels, names = load_labels(f"mnist:{tmp_path}", 3)
    assert labels.tolist() == [3, 1, 4] and names == list("0123456789")
    # letters: 1-26 renumbered 0-25; uncompressed files, as torchvision leaves them
    raw = tmp_path / "EMNIST" / "raw"
    write_idx(raw / "emnist-letters-train-images-idx3-ubyte", digits[:4])
    write_idx(raw / "emnist-letters-train-labels-idx1-ubyte", [1, 2, 26, 2])
    labels, names = load_labels(f"emnist:{tmp_path}:letters", 4)
    assert labels.tolist() == [0, 1, 25, 1] and names == list("abcdefghijklmnopqrstuvwxyz")
    balanced, byclass = emnist_classes("balanced"), emnist_classes("byclass")
    assert len(balanced) == 47 and balanced[10] == "A" and balanced[36:] == list("abdefghnqrt")
    assert emnist_classes("bymerge") == balanced and emnist_classes("digits") == list("0123456789")
    assert len(byclass) == 62 and byclass[:11] == [*"0123456789", "A"] and byclass[36] == "a" and byclass[-1] == "z"


def test_emnist_labels_are_kept_in_the_decoded_cache_with_the_images_order(tmp_path):
    root = emnist_letters(tmp_path, [3, 1, 2, 26, 5])
    for _ in range(2):  # built, then opened from the cache
        data = open_image_data(f"emnist:{root}:letters", 8, max_items=4, say=lambda _: None)
        assert data.labels.tolist() == [2, 0, 1, 25] and data.class_names[:3] == ["a", "b", "c"]
        assert data.shape == (4, 1, 8, 8)
        ink = np.asarray(data.images).reshape(4, -1).sum(axis=1)  # each letter a bar as long as its label
        assert ink.argsort().tolist() == [1, 2, 0, 3]
    labels_file = root / "EMNIST" / "raw" / "emnist-letters-train-labels-idx1-ubyte.gz"
    labels_file.rename(tmp_path / "aside.gz")
    assert open_image_data(f"emnist:{root}:letters", 8, say=lambda _: None).labels is None
    (tmp_path / "aside.gz").rename(labels_file)  # a labels file copied in later: the entry is built again
    notes: list[str] = []
    assert open_image_data(f"emnist:{root}:letters", 8, say=notes.append).labels.tolist() == [2, 0, 1, 25, 4]
    assert "the source files changed" in notes[-1]


def test_bad_emnist_labels_files_say_so(tmp_path):
    root = emnist_letters(tmp_path, [1, 2, 0])  # 0 names no letter
    with pytest.raises(UserError, match=r"holds label 0, outside the 26 classes of EMNIST letters"):
        load_labels(f"emnist:{root}:letters", 3)
    with pytest.raises(UserError, match=r"holds 3 labels for 4 images"):
        load_labels(f"emnist:{root}:letters", 4)
    (root / "EMNIST" / "raw" / "emnist-letters-train-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(UserError) as info:
        load_labels(f"emnist:{root}:letters", 3, required=True)
    assert "looked for EMNIST/raw/emnist-letters-train-labels-idx1-ubyte[.gz]" in info.value.message


def test_missing_torchvision_files_say_how_to_get_them(tmp_path):
    with pytest.raises(UserError) as info:
        load_images(f"emnist:{tmp_path}:balanced", 28)
    assert "EMNIST files not found" in info.value.message
    assert "torchvision.datasets.EMNIST" in info.value.message and "never downloads" in info.value.message


def test_unknown_spec_suggests(tmp_path):
    with pytest.raises(UserError, match="did you mean 'imagefolder'"):
        load_images(f"imagefolda:{tmp_path}", 8)


def test_data_smaller_than_one_batch_via_cli(tmp_path, capsys):
    path = tmp_path / "few.npz"
    np.savez(path, images=np.zeros((3, 8, 8), dtype=np.uint8))
    assert main(["train", "--out", str(tmp_path / "run"), "--data", f"npz:{path}", *micro_args()]) == 2
    assert ("error: the data set has 3 training examples, fewer than one effective batch of 8 -- add data, or lower "
            "train.batch_per_gpu / train.grad_accum") in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # refused before config.yaml, metrics.jsonl, system.json or tb/


def test_global_batches_split_disjointly_over_ranks_and_accumulation():
    batcher = DeviceBatcher(100, 16, seed=3, device=torch.device("cpu"))
    first = batcher.next_indices()
    rows = [first[micro_slice(k, r, 2, 4)] for k in range(2) for r in range(2)]
    assert torch.equal(torch.sort(torch.cat(rows)).values, torch.sort(first).values)
    seen = torch.cat([first] + [batcher.next_indices() for _ in range(5)])
    assert len(set(seen[:96].tolist())) == 96  # one epoch (drop-last) visits distinct items
    assert batcher.position.epoch == 0 and batcher.position.offset == 96
    batcher.next_indices()
    assert batcher.position.epoch == 1


def test_shift_augment_translates_each_image():
    img = torch.zeros(2, 1, 5, 5)
    img[:, :, 2, 2] = 1
    out = shift_augment(img, torch.tensor([[1, 0], [0, -1]]), 1)
    # out[i] = image[i + shift]: content moves by -shift, with edges replicated
    assert out[0, 0, 1, 2] == 1 and out[1, 0, 2, 3] == 1 and out.sum() == 2


def test_a_relative_data_path_is_kept_absolute_so_the_run_resumes_from_anywhere(tmp_path, monkeypatch, capsys):
    import yaml

    monkeypatch.chdir(tmp_path)
    np.savez(tmp_path / "data.npz", images=np.random.default_rng(0).integers(0, 255, (16, 8, 8), dtype=np.uint8))
    run = tmp_path / "run"
    args = ["--data", "npz:data.npz", *micro_args("optim.warmup_steps=5", steps=2)]
    assert main(["train", "--out", str(run), *args]) == 0
    assert yaml.safe_load((run / "config.yaml").read_text())["data"]["source"] == f"npz:{tmp_path / 'data.npz'}"
    # a warm-up longer than the run: it says why its lr stays low
    assert "note: optim.warmup_steps 5 > train.steps 2: the learning rate rises" in capsys.readouterr().err
    monkeypatch.chdir(tmp_path.parent)
    assert main(["train", "--out", str(run), "--resume", "auto", "--max-steps", "4", *micro_args(steps=4)]) == 0
