"""The feature network image quality is measured in, and the metrics on generated images.

No Inception weights can be downloaded, so diffscale trains a small CNN once per data set and
resolution and keeps it in the data cache (``DIFFSCALE_CACHE_DIR``/quality): a classifier of the
data's labels where it has them (the built-in glyphs, npz with ``labels``), else a predictor of
which of four right-angle rotations an image was turned by, a self-supervised target that needs
no labels (docs/decisions.md, "Quality measured in a feature network trained per data set"). Its
penultimate activations are the features; its held-out accuracy is reported beside the metrics.
A user's own network (``train.eval_features`` / ``diffscale eval --features``, ``module:function``)
replaces it.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from diffscale.errors import UserError
from diffscale.io.atomic import atomic_path
from diffscale.io.paths import cache_dir
from diffscale.io.stages import stage

FORMAT = 2
"""Bump when the network or its training changes: older cached networks are trained again (2: the
network's initial weights come from the seed; before, from the process's random state, so two
evaluations of one run on one data set could train networks whose FD differed 1.7-fold)."""
FEATURES = 128
TRAIN_STEPS = 400
BATCH = 128
HELD_OUT_BATCH = 512
TRAININGS = 0
"""Feature networks trained by this process (tests assert a cached one is not trained again)."""


class FeatureNet(torch.nn.Module):
    """A small CNN: images (B, C, S, S) in [-1, 1] -> ``features`` (B, 128); ``head`` maps those
    to logits (B, K)."""

    def __init__(self, channels: int, classes: int) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Conv2d(channels, 32, 3, padding=1), torch.nn.GroupNorm(8, 32), torch.nn.SiLU(),
            torch.nn.Conv2d(32, 64, 3, stride=2, padding=1), torch.nn.GroupNorm(8, 64), torch.nn.SiLU(),
            torch.nn.Conv2d(64, 128, 3, stride=2, padding=1), torch.nn.GroupNorm(8, 128), torch.nn.SiLU(),
            torch.nn.AdaptiveAvgPool2d(2), torch.nn.Flatten(), torch.nn.Linear(512, FEATURES), torch.nn.SiLU(),
        )
        self.head = torch.nn.Linear(FEATURES, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.body(images)


@dataclass
class Featurizer:
    """What the metrics are measured with: ``network`` maps images (B, C, S, S) in [-1, 1] to
    features (B, D); ``head`` (when the network classifies the data's labels) maps them to logits."""

    network: torch.nn.Module
    description: str
    accuracy: float = float("nan")
    head: torch.nn.Module | None = None

    @torch.no_grad()
    def features(self, images: torch.Tensor, batch: int = 256) -> torch.Tensor:
        """(N, D) float32 on the CPU of ``images`` (N, C, S, S) in [-1, 1]."""
        # where its weights are; a network with none (a fixed transform of a user's) runs on the CPU
        held = next(itertools.chain(self.network.parameters(), self.network.buffers()), None)
        device = held.device if held is not None else torch.device("cpu")
        parts = [self.network(images[i:i + batch].to(device).float()).float().cpu()
                 for i in range(0, images.shape[0], batch)]
        if parts and (parts[0].ndim != 2 or parts[0].shape[0] != min(batch, images.shape[0])):
            raise UserError(f"the feature network ({self.description}) mapped images of shape "
                            f"{tuple(images[:batch].shape)} to {tuple(parts[0].shape)}, not (images, features)",
                            "return a network whose output is one feature vector per image, (B, D): end it "
                            "with torch.nn.Flatten() or a pooling and flatten")
        return torch.cat(parts) if parts else torch.zeros(0, FEATURES)


def user_features(spec: str) -> Featurizer:
    """The network ``module:function`` returns (called with no arguments)."""
    module_name, _, function_name = spec.partition(":")
    try:
        build = getattr(importlib.import_module(module_name), function_name)
    except (ImportError, AttributeError) as exc:
        raise UserError(f"cannot load the feature network '{spec}' ({exc})",
                        "name an importable module:function returning a torch module") from exc
    network = build()
    if not isinstance(network, torch.nn.Module):
        raise UserError(f"'{spec}' returned {type(network).__name__}, not a torch module",
                        "return a torch.nn.Module mapping images (B, C, H, W) in [-1, 1] to features (B, D)")
    return Featurizer(network.eval(), f"user network {spec}")


def cache_path(data_spec: str, max_items: int, size: int, channels: int) -> Path:
    key = hashlib.sha256(repr((FORMAT, data_spec, max_items, size, channels)).encode()).hexdigest()[:16]
    return cache_dir() / "quality" / f"features-{size}px-{key}.safetensors"


def trained_features(images: torch.Tensor, labels: torch.Tensor | None, path: Path, *, seed: int = 0,
                     device: torch.device | None = None) -> Featurizer:
    """The feature network of ``images`` (N, C, S, S) uint8 with ``labels`` (N,) (None: rotation
    prediction), read from ``path`` or trained on ``device`` (default the CPU) and written there."""
    device = device or torch.device("cpu")
    from safetensors.torch import load_file, safe_open

    target = "classes" if labels is not None else "rotations"
    classes = int(labels.max()) + 1 if labels is not None else 4
    with torch.random.fork_rng(devices=[]):  # its start from the seed, not from whatever ran before it
        torch.manual_seed(seed)
        network = FeatureNet(images.shape[1], classes)

    def cached() -> float | None:
        try:
            with safe_open(str(path), "pt") as handle:
                meta = handle.metadata()
            network.load_state_dict(load_file(str(path)))
            return float(meta["accuracy"])
        except (OSError, KeyError, RuntimeError, ValueError):  # not there yet, unreadable or another shape
            return None

    accuracy = cached()
    if accuracy is None:
        with _one_trainer(path):  # runs evaluated at once on one data set: one trains, the others read it
            accuracy = cached()
            if accuracy is None:
                # minutes on a CPU at large sizes, before any sample is drawn: said, so a wait is explained
                with _training_on(device) as (where, threads):
                    stage(f"feature network: training on {where} for this data set ({images.shape[0]:,} images, "
                          f"{images.shape[-1]} px{threads}; once: kept in {path.parent} for later evaluations)")
                    start = time.perf_counter()
                    accuracy = _train(network, images, labels, seed, device)
                stage(f"feature network: trained in {time.perf_counter() - start:.1f} s "
                      f"(held-out accuracy {accuracy:.3f})")
                _save(network, path, {"accuracy": repr(accuracy), "target": target})
    network.eval().requires_grad_(False)
    held = "held-out accuracy" + ("" if labels is not None else " of rotation prediction")
    return Featurizer(network, f"diffscale's feature network ({target}; {held} {accuracy:.3f})", accuracy,
                      network.head if labels is not None else None)


@contextlib.contextmanager
def _training_on(device: torch.device) -> Iterator[tuple[str, str]]:
    """Settings the network trains under on ``device``; yields where it trains and its threads as
    said (``("the CPU", ", 16 threads")``, ``("cuda:0", "")``). On a GPU, cuDNN's deterministic
    algorithms, so one device trains the same network each time (a run evaluated on a GPU trains it
    there: on the CPU it took 288-302 s at 64 px beside a GPU host's training runs,
    docs/measurements/2026-11-30.md, "medium on the whole suite, evaluated"). On the CPU, torch's
    threads set to the cores this process may use that other processes leave free, as a CPU training
    run takes them (``runtime.cpu_threads`` auto), unless ``OMP_NUM_THREADS`` is set; a thread per
    core beside busy processes makes the threads wait for each other (309 s where it took 10 s
    alone; "Where an evaluation's time goes")."""
    if device.type != "cpu":
        with torch.backends.cudnn.flags(enabled=True, benchmark=False, deterministic=True):
            yield str(device), ""
        return
    from diffscale.runtime.resources import free_threads_unless_set

    before = torch.get_num_threads()
    threads = free_threads_unless_set(1) or before
    torch.set_num_threads(threads)
    try:
        yield "the CPU", f", {threads} thread{'s' if threads > 1 else ''}"
    finally:
        torch.set_num_threads(before)


TRAINER_WAIT_S = 1800.0
"""How long a process waits for another training the same feature network before training its own."""


@contextlib.contextmanager
def _one_trainer(path: Path) -> Iterator[None]:
    """Held while this process trains the feature network of ``path`` (filelock's ``flock`` lock,
    freed by the kernel if its holder dies). Training takes minutes on a CPU at large sizes, and the
    runs of a sweep or the benchmark suite's seeds are evaluated together; a lock that cannot be had
    (no ``flock`` on the file system, an unwritable cache, a wait past ``TRAINER_WAIT_S``) lets this
    process train as before."""
    from filelock import FileLock, Timeout

    lock = FileLock(str(path.with_suffix(".lock")), thread_local=False)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            lock.acquire(timeout=0)
        except Timeout:
            stage("feature network: another evaluation is training it for this data set; waiting to read it")
            lock.acquire(timeout=TRAINER_WAIT_S)
    except (OSError, NotImplementedError, Timeout):
        yield
        return
    try:
        yield
    finally:
        lock.release()


def _save(network: FeatureNet, path: Path, meta: dict[str, str]) -> None:
    from safetensors.torch import save_file

    with contextlib.suppress(OSError):  # a cache only: where it cannot be written, the next evaluation trains again
        with atomic_path(path) as tmp:
            save_file({k: v.cpu().contiguous() for k, v in network.state_dict().items()}, str(tmp), metadata=meta)


def _examples(images: torch.Tensor, labels: torch.Tensor | None, rows: torch.Tensor,
              device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Float images in [-1, 1] and targets of ``rows`` on ``device`` (the uint8 rows go there, a
    quarter of the bytes): the labels, or each image turned by a right angle chosen by its row (so
    the held-out set is fixed)."""
    x = images[rows].to(device).float() / 127.5 - 1.0
    if labels is not None:
        return x, labels[rows].to(device)
    turns = rows % 4
    turned = torch.stack([torch.rot90(img, int(k), dims=(1, 2)) for img, k in zip(x, turns, strict=True)])
    return turned, turns.to(device)


def _train(network: FeatureNet, images: torch.Tensor, labels: torch.Tensor | None, seed: int,
           device: torch.device) -> float:
    """Train on ``device`` on a seeded 90 % of the rows; returns the accuracy on the other 10 %. The
    rows are drawn on the CPU, the same on every device."""
    global TRAININGS
    TRAININGS += 1
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(images.shape[0], generator=generator)
    held = max(1, images.shape[0] // 10)
    test_rows, train_rows = order[:held], order[held:]
    network.to(device)
    optimizer = torch.optim.AdamW(network.parameters(), lr=2e-3, weight_decay=1e-4)
    network.train()
    for _ in range(TRAIN_STEPS):
        rows = train_rows[torch.randint(0, train_rows.shape[0], (BATCH,), generator=generator)]
        x, y = _examples(images, labels, rows, device)
        loss = F.cross_entropy(network.head(network(x)), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    network.eval()
    correct = 0
    with torch.no_grad():  # in parts: a tenth of 100,000 images at 64 px is ~15 GB of activations at once
        for part in test_rows.split(HELD_OUT_BATCH):
            x, y = _examples(images, labels, part, device)
            correct += int((network.head(network(x)).argmax(1) == y).sum())
    return correct / test_rows.shape[0]


def manifold(real: torch.Tensor, fake: torch.Tensor) -> dict[str, float]:
    """Frechet distance and k-NN precision, recall, density and coverage of ``fake`` against
    ``real`` features (N, D)."""
    from diffscale.evaluation.quality import frechet_distance, manifold_scores

    return {"fd": frechet_distance(real, fake), **manifold_scores(real, fake)}


def scores(featurizer: Featurizer, real: torch.Tensor, fake: torch.Tensor) -> dict[str, float]:
    """:func:`manifold`'s scores, the feature network's accuracy and how the samples spread over
    the data's classes (where the network classifies them)."""
    result = manifold(real, fake)
    if featurizer.accuracy == featurizer.accuracy:  # not NaN: diffscale's own network
        result["feature_net_accuracy"] = featurizer.accuracy
    if featurizer.head is not None:  # a classifier of the data's labels: which classes the samples fall in
        result.update(class_spread(featurizer.head, real, fake))
    return result


@torch.no_grad()
def class_spread(head: torch.nn.Module, real: torch.Tensor, fake: torch.Tensor) -> dict[str, float]:
    """How the classifier spreads ``fake`` (M, D) over the classes it finds in ``real`` (N, D):
    ``classes_covered``, the share of those classes predicted for at least one sample, and
    ``class_balance``, exp(entropy) of the predicted classes over that of the data's (1: as
    balanced as the data, lower: a generator that favours some classes)."""
    device = next(head.parameters()).device

    def predicted(features: torch.Tensor) -> torch.Tensor:
        return head(features.to(device)).argmax(dim=1).cpu()

    ours, theirs = predicted(fake), predicted(real)
    size = max(int(ours.max()), int(theirs.max())) + 1

    def perplexity(labels: torch.Tensor) -> float:
        p = torch.bincount(labels, minlength=size).double() / labels.numel()
        p = p[p > 0]
        return float(torch.exp(-(p * p.log()).sum()))

    present = set(theirs.tolist())
    covered = len(present & set(ours.tolist())) / max(len(present), 1)
    return {"classes_covered": covered, "class_balance": perplexity(ours) / perplexity(theirs)}

