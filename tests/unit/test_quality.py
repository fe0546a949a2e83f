"""Image quality metrics: the math on known distributions, the per-data-set feature network and
its cache, a user's own feature network, ``diffscale eval`` on an image run and evaluation while
training."""

import json
import math
import re

import numpy as np
import pytest
import torch

from diffscale.cli import main
from diffscale.evaluation.quality import accuracy, frechet_distance, manifold_scores
from diffscale.tasks.images import quality

from helpers import micro_args


@pytest.fixture
def quick_features(monkeypatch):
    """The feature network trains a few steps only: its cache and plumbing are under test here."""
    monkeypatch.setattr(quality, "TRAIN_STEPS", 5)


def _gaussian(n, d, *, mean=0.0, std=1.0, seed=0):
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * std + mean


def test_frechet_distance_is_zero_for_identical_sets_and_grows_with_a_shift():
    a = _gaussian(2000, 8)
    assert frechet_distance(a, a) == pytest.approx(0.0, abs=1e-6)
    distances = [frechet_distance(a, _gaussian(2000, 8, mean=shift, seed=1)) for shift in (0.0, 0.5, 1.0, 2.0)]
    assert distances == sorted(distances) and distances[0] < 0.05
    # mean shift m in each of 8 dimensions: |mu_a - mu_b|^2 = 8 m^2
    assert distances[-1] == pytest.approx(8 * 2.0**2, rel=0.05)


def test_frechet_distance_takes_the_matrix_square_root_of_the_covariances():
    # N(0, I) against N(0, 4 I) in 4 dimensions: tr(I + 4I - 2 (4I)^(1/2)) = 4 (1 + 4 - 4) = 4
    distance = frechet_distance(_gaussian(20000, 4), _gaussian(20000, 4, std=2.0, seed=1))
    assert distance == pytest.approx(4.0, rel=0.05)
    # covariances that do not commute: against scipy's general matrix square root
    from scipy.linalg import sqrtm

    basis = torch.linalg.qr(_gaussian(4, 4, seed=2))[0]
    stretched = _gaussian(5000, 4, seed=3) * torch.tensor([3.0, 1.0, 0.5, 0.1], dtype=torch.float64)
    turned = _gaussian(5000, 4, seed=4) @ basis.T + 0.3
    cov_a, cov_b = torch.cov(stretched.T).numpy(), torch.cov(turned.T).numpy()
    mean_gap = float(((stretched.mean(0) - turned.mean(0)) ** 2).sum())
    expected = mean_gap + np.trace(cov_a + cov_b - 2 * np.real(sqrtm(cov_a @ cov_b)))
    assert frechet_distance(stretched, turned) == pytest.approx(expected, rel=1e-9)


def test_manifold_scores_of_identical_disjoint_and_collapsed_sets():
    real = _gaussian(400, 2)
    assert manifold_scores(real, real) == {"precision": 1.0, "recall": 1.0, "density": pytest.approx(1.0, abs=0.05),
                                           "coverage": 1.0}
    assert manifold_scores(real, real + 100.0) == {"precision": 0.0, "recall": 0.0, "density": 0.0, "coverage": 0.0}
    left = manifold_scores(real, real[real[:, 0] < 0])  # a generator that found only half the data
    assert left["precision"] == 1.0 and 0.35 < left["recall"] < 0.65 and 0.35 < left["coverage"] < 0.65
    crowded = manifold_scores(real, _gaussian(400, 2, std=0.2, seed=1))  # samples crowding the mode
    assert crowded["precision"] == 1.0 and crowded["density"] > 1.1 and crowded["coverage"] < 0.3


def test_manifold_scores_are_the_reference_implementations():
    """prdc is the code of Naeem et al. (2020); the scores are written here in float64 torch
    (prdc prints to stdout and computes in eight threads: docs/decisions.md)."""
    import contextlib
    import io

    from prdc import compute_prdc

    real, fake = _gaussian(300, 16), _gaussian(200, 16, mean=0.3, std=1.2, seed=5)
    with contextlib.redirect_stdout(io.StringIO()):
        expected = compute_prdc(real.numpy(), fake.numpy(), nearest_k=3)
    ours = manifold_scores(real, fake, k=3)
    assert ours == {k: pytest.approx(float(v), abs=1e-12) for k, v in expected.items()}


def test_accuracy_counts_rows_whose_top_logit_is_the_label():
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [3.0, 1.0], [0.0, 5.0]])
    assert accuracy(logits, torch.tensor([0, 1, 1, 1])) == 0.75
    assert math.isnan(accuracy(torch.zeros(0, 2), torch.zeros(0)))


def test_class_spread_tells_a_balanced_generator_from_a_collapsed_one():
    head = torch.nn.Linear(3, 3)
    with torch.no_grad():
        head.weight.copy_(torch.eye(3))
        head.bias.zero_()
    real = torch.eye(3).repeat(10, 1)  # ten rows of each class
    assert quality.class_spread(head, real, real) == {"classes_covered": 1.0, "class_balance": 1.0}
    collapsed = quality.class_spread(head, real, torch.eye(3)[:1].repeat(30, 1))
    assert collapsed["classes_covered"] == pytest.approx(1 / 3) and collapsed["class_balance"] == pytest.approx(1 / 3)


def _stripes(n=200, size=8):
    """uint8 images (n, 1, size, size) of two classes: horizontal or vertical stripes, and their labels."""
    labels = torch.arange(n) % 2
    line = (torch.arange(size) % 2 * 255).to(torch.uint8)
    rows, cols = line.view(1, size, 1).expand(1, size, size), line.view(1, 1, size).expand(1, size, size)
    images = torch.stack([rows if k == 0 else cols for k in labels])
    return images, labels


def test_the_feature_network_is_trained_once_then_read_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(quality, "TRAIN_STEPS", 60)
    images, labels = _stripes()
    path = tmp_path / "quality" / "features.safetensors"
    trainings = quality.TRAININGS
    first = quality.trained_features(images, labels, path)
    assert path.is_file() and quality.TRAININGS == trainings + 1
    assert first.accuracy > 0.9 and "held-out accuracy" in first.description  # stripes are easy to tell apart
    written = path.stat().st_mtime_ns
    second = quality.trained_features(images, labels, path)
    assert quality.TRAININGS == trainings + 1 and path.stat().st_mtime_ns == written  # read, not trained again
    assert second.accuracy == first.accuracy
    x = images[:16].float() / 127.5 - 1
    torch.testing.assert_close(first.features(x), second.features(x))
    assert second.head is not None and accuracy(second.head(second.features(x)), labels[:16]) > 0.9


def test_one_data_set_and_seed_train_one_network_whatever_the_process_drew_before(tmp_path, monkeypatch):
    """The network starts from its seed, not from the process's random state: evaluations of one run
    that had drawn other random numbers before train the same network (their FDs differed 1.7-fold
    before), another seed trains another, and the caller's random state is left as it was."""
    monkeypatch.setattr(quality, "TRAIN_STEPS", 5)
    images, labels = _stripes()
    x = images[:16].float() / 127.5 - 1
    torch.manual_seed(1)
    first = quality.trained_features(images, labels, tmp_path / "a.safetensors").features(x)
    torch.manual_seed(5)
    after = torch.rand(3)
    torch.manual_seed(5)
    again = quality.trained_features(images, labels, tmp_path / "b.safetensors").features(x)
    assert torch.equal(torch.rand(3), after)  # the global generator went on from where it was
    other_seed = quality.trained_features(images, labels, tmp_path / "c.safetensors", seed=1).features(x)
    assert torch.equal(first, again) and not torch.allclose(first, other_seed)


def test_the_held_out_accuracy_is_counted_in_parts_as_at_once(tmp_path, monkeypatch):
    """A tenth of a large data set at once would not fit a GPU: the held-out images go through the
    network in parts, and the accuracy is the same as in one part."""
    monkeypatch.setattr(quality, "TRAIN_STEPS", 60)  # stripes are easy: nearly all 20 right
    images, labels = _stripes()
    monkeypatch.setattr(quality, "HELD_OUT_BATCH", 7)  # 20 held out: parts of 7, 7 and 6
    parts = quality.trained_features(images, labels, tmp_path / "a.safetensors").accuracy
    monkeypatch.setattr(quality, "HELD_OUT_BATCH", 1000)
    whole = quality.trained_features(images, labels, tmp_path / "b.safetensors").accuracy
    assert parts == whole and parts > 0.9 and parts * 20 == round(parts * 20)


def test_evaluations_started_together_on_one_data_set_train_its_feature_network_once(tmp_path, monkeypatch):
    """Two evaluations that look for the feature network at the same moment (a barrier) and find
    none: one trains it while holding the lock, the other waits and reads it. Without the lock both
    would train (each looked before either had written it)."""
    import threading

    monkeypatch.setattr(quality, "TRAIN_STEPS", 120)
    images, labels = _stripes()
    path = tmp_path / "quality" / "features.safetensors"
    trainings = quality.TRAININGS
    barrier = threading.Barrier(2)
    found: list[quality.Featurizer] = []

    def evaluate() -> None:
        barrier.wait()
        found.append(quality.trained_features(images, labels, path))

    threads = [threading.Thread(target=evaluate) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert len(found) == 2 and quality.TRAININGS == trainings + 1
    assert found[0].accuracy == found[1].accuracy
    x = images[:8].float() / 127.5 - 1
    torch.testing.assert_close(found[0].features(x), found[1].features(x))


def test_an_evaluation_waiting_for_anothers_training_says_so_then_trains_itself_if_none_was_written(
        tmp_path, monkeypatch):
    """While another process holds the feature network's lock, an evaluation says it waits (it would
    otherwise be silent for the minutes a large network trains on a CPU); once the lock is free and
    no network was written (the other failed), it trains one itself and says that too."""
    import threading
    import time

    from filelock import FileLock

    from diffscale.io.stages import saying

    monkeypatch.setattr(quality, "TRAIN_STEPS", 5)
    images, labels = _stripes()
    path = tmp_path / "quality" / "features.safetensors"
    path.parent.mkdir(parents=True)
    said: list[str] = []

    def evaluate() -> None:
        with saying(said.append):
            quality.trained_features(images, labels, path)

    other = FileLock(str(path.with_suffix(".lock")), thread_local=False)
    other.acquire()
    thread = threading.Thread(target=evaluate)
    thread.start()
    deadline = time.monotonic() + 120
    while not said and time.monotonic() < deadline:
        time.sleep(0.05)
    assert said == ["feature network: another evaluation is training it for this data set; waiting to read it"]
    other.release()
    thread.join(timeout=300)
    threads = torch.get_num_threads()
    assert said[1] == (f"feature network: training on the CPU for this data set (200 images, 8 px, {threads} "
                       f"thread{'s' if threads > 1 else ''}; once: kept in {path.parent} for later evaluations)")
    assert re.fullmatch(r"feature network: trained in \d+\.\d s \(held-out accuracy [01]\.\d{3}\)", said[2]), said
    assert len(said) == 3 and path.is_file()


def test_the_feature_network_trains_on_the_cores_other_processes_leave_free(tmp_path, monkeypatch):
    """Without OMP_NUM_THREADS, the feature network trains with the threads ``free_cpu_threads``
    finds (a thread per core beside busy processes waited on each other: 309 s instead of 10 s on a
    GPU host), says how many, and leaves torch's thread count as it was; OMP_NUM_THREADS is kept."""
    from diffscale.io.stages import saying
    from diffscale.runtime import resources

    monkeypatch.setattr(quality, "TRAIN_STEPS", 2)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(resources, "free_cpu_threads", lambda local_world_size: 1)
    seen: list[int] = []
    train = quality._train
    monkeypatch.setattr(quality, "_train", lambda *a: seen.append(torch.get_num_threads()) or train(*a))
    images, labels = _stripes()
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        said: list[str] = []
        with saying(said.append):
            quality.trained_features(images, labels, tmp_path / "a.safetensors")
        assert seen == [1] and torch.get_num_threads() == 2
        assert "(200 images, 8 px, 1 thread; once:" in said[0], said
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
        quality.trained_features(images, labels, tmp_path / "b.safetensors")
        assert seen == [1, 2]
    finally:
        torch.set_num_threads(before)


def test_without_labels_the_feature_network_predicts_rotations(tmp_path, quick_features):
    images, _ = _stripes()
    featurizer = quality.trained_features(images, None, tmp_path / "f.safetensors")
    assert featurizer.head is None and "rotation" in featurizer.description
    assert featurizer.features(images[:3].float()).shape == (3, quality.FEATURES)


def _trained(tmp_path, *extra):
    run = tmp_path / "run"
    assert main(["train", "--out", str(run), *micro_args(*extra, steps=4)]) == 0
    return run


def test_eval_of_an_image_run_scores_its_samples_and_appends_to_metrics(tmp_path, capsys, quick_features,
                                                                       monkeypatch):
    run = _trained(tmp_path)
    monkeypatch.setenv("DIFFSCALE_CACHE_DIR", str(tmp_path / "cache"))  # no feature network of these data yet
    capsys.readouterr()
    assert main(["eval", str(run), "--count", "8", "--steps", "2", "--sampler", "dpmsolver", "--json"]) == 0
    printed = capsys.readouterr()
    record = json.loads(printed.out)
    # the wait before the first sample is explained on stderr (stdout holds the JSON alone)
    assert "feature network: training on the CPU for this data set" in printed.err
    assert re.search(r"^feature network: trained in \d+\.\d s", printed.err, re.M), printed.err
    assert record["kind"] == "eval" and record["step"] == 4 and record["sampler"] == "dpmsolver"
    assert record["fd"] >= 0 and 0 <= record["precision"] <= 1 and 0 <= record["recall"] <= 1
    assert 0 <= record["feature_net_accuracy"] <= 1 and "classes" in record["features"]  # the glyphs have labels
    assert 0 < record["classes_covered"] <= 1 and record["class_balance"] > 0
    assert (run / "eval" / "step_00000004" / "samples.png").is_file()
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert lines[-1]["fd"] == pytest.approx(record["fd"], rel=1e-5)  # printed rounded
    # the same seed and checkpoint give the same scores; an earlier checkpoint is chosen by its step
    assert main(["eval", str(run), "--count", "8", "--steps", "2", "--sampler", "dpmsolver", "--json"]) == 0
    printed = capsys.readouterr()
    assert json.loads(printed.out)["fd"] == record["fd"] and "feature network" not in printed.err  # read, not trained
    assert main(["eval", str(run), "--count", "8", "--steps", "2", "--checkpoint", "4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["sampler"] == "dpmsolver"  # the run's train.sample_sampler


def test_eval_uses_a_feature_network_of_the_users_own(tmp_path, capsys, monkeypatch, quick_features):
    (tmp_path / "my_features.py").write_text(
        "import torch\n"
        "CALLS = []\n"
        "def build():\n"
        "    CALLS.append(1)\n"
        "    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 5))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import my_features

    run = _trained(tmp_path)
    trainings = quality.TRAININGS
    capsys.readouterr()
    assert main(["eval", str(run), "--count", "6", "--steps", "2", "--features", "my_features:build", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["features"] == "user network my_features:build" and "feature_net_accuracy" not in record
    assert my_features.CALLS == [1] and quality.TRAININGS == trainings  # no network of diffscale's trained


def test_a_users_feature_network_without_weights_runs_and_one_of_the_wrong_shape_is_named(tmp_path, capsys,
                                                                                         monkeypatch, quick_features):
    (tmp_path / "fixed_features.py").write_text(
        "import torch\n"
        "def pixels():\n"
        "    return torch.nn.Flatten()  # no parameters, no buffers: a fixed transform\n"
        "def maps():\n"
        "    return torch.nn.Conv2d(1, 4, 3)  # (B, 4, H-2, W-2): no feature vector per image\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    run = _trained(tmp_path)
    capsys.readouterr()
    assert main(["eval", str(run), "--count", "6", "--steps", "2", "--features", "fixed_features:pixels",
                 "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["features"] == "user network fixed_features:pixels" and record["fd"] >= 0
    assert main(["eval", str(run), "--count", "6", "--steps", "2", "--features", "fixed_features:maps"]) == 2
    printed = capsys.readouterr()
    assert printed.err.strip().splitlines()[-1] == (
        "error: the feature network (user network fixed_features:maps) mapped images of shape (6, 1, 8, 8) to "
        "(6, 4, 6, 6), not (images, features) -- return a network whose output is one feature vector per image, "
        "(B, D): end it with torch.nn.Flatten() or a pooling and flatten"), printed.err
    assert "Traceback" not in printed.err


def test_training_evaluates_every_n_steps_into_metrics_and_tensorboard(tmp_path, quick_features, capsys):
    run = _trained(tmp_path, "train.eval_every=2", "train.eval_count=6", "train.sample_sampler=dpmsolver")
    said = capsys.readouterr().err  # training's progress, on stderr
    assert "sampling: 6 samples, dpmsolver" in said and "eval at step 4: fd " in said  # its progress and scores
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if r.get("kind") == "eval"]
    assert [r["step"] for r in evals] == [2, 4]
    assert all(r["fd"] >= 0 and 0 <= r["recall"] <= 1 and r["sampler"] == "dpmsolver" and r["count"] == 6
               for r in evals)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tb"))
    events.Reload()
    assert [e.step for e in events.Scalars("eval/fd")] == [2, 4]
