"""The data's side of image quality: the data images samples are scored against, and the
reference row, the data scored against other data images of the same count.

Rows are taken in one seeded order: N samples are scored against its first N images (as many as
there are samples, or every image where the data holds fewer), and the reference scores the next
N against those same first N. A score of samples reads against that row: the Frechet distance of
two finite draws of the same data is not 0, nor its precision and recall 1. The reference depends
only on the data, the feature network and N, so diffscale's own network's is kept in the data
cache beside that network (one JSON file per count).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import torch

from diffscale.io.atomic import write_text
from diffscale.tasks.images.quality import Featurizer, manifold

REFERENCE_FORMAT = 1
"""Bump when the reference's scores change meaning: kept ones are computed again."""


class DataFeatures:
    """Features of the data images (uint8 (N, C, S, S) on the CPU) in ``featurizer``'s space, taken
    in a seeded order and computed as far as asked; ``reference_cache``: the file stem the
    reference scores are kept under (None: not kept, e.g. a user's own feature network)."""

    def __init__(self, images: torch.Tensor, featurizer: Featurizer, reference_cache: Path | None) -> None:
        self._images = images
        self._featurizer = featurizer
        self._order = torch.randperm(images.shape[0], generator=torch.Generator().manual_seed(0))
        self._features = torch.zeros(0, 0)
        self._cache = reference_cache

    @property
    def size(self) -> int:
        return int(self._images.shape[0])

    def _first(self, count: int) -> torch.Tensor:
        """Features of the first ``count`` rows of the order (computed once, then kept)."""
        count = min(count, self.size)
        if self._features.shape[0] < count:
            rows = self._order[self._features.shape[0]:count]
            more = self._featurizer.features(self._images[rows].float() / 127.5 - 1.0)
            self._features = more if self._features.numel() == 0 else torch.cat([self._features, more])
        return self._features[:count]

    def real(self, count: int) -> torch.Tensor:
        """The features ``count`` samples are scored against: as many data images, or all there are."""
        return self._first(count)

    def reference(self, count: int) -> dict[str, float]:
        """``reference_fd``, ``reference_precision``, ... of data images against the ``count`` that
        ``count`` samples are scored against (fewer where the data holds fewer than twice that many:
        ``reference_count`` says how many), and ``data_count``; without the reference where fewer
        than 2 images are left over."""
        real_count = min(count, self.size)
        others = min(real_count, self.size - real_count)
        found: dict[str, float] = {"data_count": real_count}
        if others < 2:
            return found
        path = self._cache.with_name(f"{self._cache.name}-reference-{real_count}.json") if self._cache else None
        kept = _read(path)
        if kept is None:
            features = self._first(real_count + others)
            kept = {f"reference_{k}": v for k, v in manifold(features[:real_count], features[real_count:]).items()}
            kept["reference_count"] = others
            if path is not None:
                with contextlib.suppress(OSError):  # a cache only: computed again where it cannot be kept
                    write_text(path, json.dumps({"format": REFERENCE_FORMAT, "scores": kept}))
        return {**found, **kept}


def _read(path: Path | None) -> dict[str, float] | None:
    if path is None:
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != REFERENCE_FORMAT or not isinstance(data.get("scores"), dict):
        return None
    return {k: v for k, v in data["scores"].items() if isinstance(v, (int, float))}
