"""The suite's catalogue: every data set by name, its task, and how it is written and read.

A set is written once to ``ROOT/<task>-<name>-n<count>-seed<seed>.npz`` (fields also a
``...-heldout.npz`` of 1,024 pairs drawn with another seed, which ``diffscale eval --data`` scores
on) and found there again by later calls; files are written whole or not at all. The same name,
count and seed give the same bytes on every machine: images are drawn in chunks of
``CHUNK`` images, each from its own seed sequence (seed, set, chunk), so the chunking, not the
machine, fixes the random streams.
"""

from __future__ import annotations

import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.suite import fields, images, policies
from diffscale.errors import UserError, closest
from diffscale.io.atomic import atomic_path

CHUNK = 1000
"""Images drawn per random stream (changing it changes every image set)."""
HELD_OUT = 1024
"""Held-out pairs written beside each field set."""
TASKS = ("images", "fields", "policy")


@dataclass(frozen=True)
class SuiteSet:
    """One data set of the suite."""

    name: str
    task: str
    """The diffscale task that trains on it: images, fields or policy."""
    default_count: int
    """Images, pairs or episodes written unless ``--count`` says otherwise."""
    summary: str
    overrides: tuple[str, ...] = ()
    """``--set`` overrides every run on this set needs (sizes the preset fixes otherwise)."""
    env: str = ""
    """Policies: the environment ``diffscale eval --env`` rolls them out in."""

    def path(self, root: Path, count: int, seed: int, suffix: str = "") -> Path:
        return Path(root) / f"{self.task}-{self.name}-n{count}-seed{seed}{suffix}.npz"

    def files(self, root: Path, count: int, seed: int) -> list[Path]:
        """The files this set is made of (the training file first)."""
        main = self.path(root, count, seed)
        return [main, self.path(root, count, seed, "-heldout")] if self.task == "fields" else [main]

    def ensure(self, root: Path, count: int | None = None, seed: int = 0) -> Path:
        """The training file, written now unless it is already there; returns its path."""
        count = count or self.default_count
        if count < 1:
            raise UserError(f"--count {count} for set '{self.name}'", "pass a positive number of items")
        if not all(p.is_file() for p in self.files(root, count, seed)):
            _WRITERS[self.task](self, root, count, seed)
        return self.path(root, count, seed)

    def eval_args(self, root: Path, count: int | None = None, seed: int = 0) -> list[str]:
        """What ``diffscale eval RUN`` needs beside the run for this set."""
        if self.task == "fields":
            return ["--data", f"npz:{self.path(root, count or self.default_count, seed, '-heldout')}"]
        if self.task == "policy":
            return ["--env", self.env]
        return []


def _stream(seed: int, name: str, chunk: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, zlib.crc32(name.encode()), chunk]))


def image_array(name: str, count: int, seed: int = 0, px: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The set's first ``count`` images and labels in memory (tests, small counts)."""
    make, native, _ = images.GENERATORS[name]
    parts = [make(_stream(seed, name, i), min(CHUNK, count - start), px or native)
             for i, start in enumerate(range(0, count, CHUNK))]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def _write_images(entry: SuiteSet, root: Path, count: int, seed: int) -> None:
    """``images`` (count, px, px[, 3]) uint8 streamed chunk by chunk into the archive (a 100,000-image
    colour set never sits in memory twice), then ``labels``."""
    make, px, channels = images.GENERATORS[entry.name]
    shape = (count, px, px) + ((channels,) if channels > 1 else ())
    labels = []
    with atomic_path(entry.path(root, count, seed)) as tmp, \
            zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        with archive.open("images.npy", "w", force_zip64=True) as member:
            np.lib.format.write_array_header_1_0(member, {"descr": "|u1", "fortran_order": False, "shape": shape})
            for i, start in enumerate(range(0, count, CHUNK)):
                pixels, chunk_labels = make(_stream(seed, entry.name, i), min(CHUNK, count - start), px)
                member.write(np.ascontiguousarray(pixels).tobytes())
                labels.append(chunk_labels)
        with archive.open("labels.npy", "w") as member:
            np.lib.format.write_array(member, np.concatenate(labels), allow_pickle=False)


def _write_fields(entry: SuiteSet, root: Path, count: int, seed: int) -> None:
    make = fields.GENERATORS[entry.name]
    for path, n, stream in ((entry.path(root, count, seed), count, 0),
                            (entry.path(root, count, seed, "-heldout"), HELD_OUT, 1)):
        cond, x = make(_stream(seed, entry.name, stream), n)
        with atomic_path(path) as tmp:
            np.savez(tmp, cond=cond, x=x)


def _write_policy(entry: SuiteSet, root: Path, count: int, seed: int) -> None:
    make, _ = policies.GENERATORS[entry.name]
    episodes = make(_stream(seed, entry.name, 0), count)
    ends = np.cumsum([len(obs) for obs, _ in episodes])
    with atomic_path(entry.path(root, count, seed)) as tmp:
        np.savez(tmp, obs=np.concatenate([o for o, _ in episodes]), action=np.concatenate([a for _, a in episodes]),
                 episode_ends=ends)


_WRITERS = {"images": _write_images, "fields": _write_fields, "policy": _write_policy}

_FIELD_SIZES = ("model.cond_dim=0", "model.x_dim=0")  # follow the file: the field presets fix 7 -> 256
SETS: dict[str, SuiteSet] = {s.name: s for s in [
    SuiteSet("strokes", "images", 5000, "32 px grey: 1-3 one-pixel strokes on black (sparse thin strokes)"),
    SuiteSet("textures", "images", 5000, "64 px grey: oriented band-pass noise (dense texture, no flat pixel)"),
    SuiteSet("flat", "images", 5000, "64 px grey: 2-4 large flat shapes on a flat background (large flat regions)"),
    SuiteSet("colour", "images", 5000, "32 px colour: soft saturated disks on a colour gradient"),
    SuiteSet("hifreq", "images", 5000, "128 px grey: fine gratings (2-16 px periods) and speckle (high frequencies)"),
    SuiteSet("clouds", "images", 5000, "128 px colour: power-law noise through two-colour palettes (smooth)"),
    SuiteSet("fronts", "fields", 3840, "7 -> 16 x 16: a sharp front whose high side is a coin flip (bimodal)"),
    SuiteSet("rain", "fields", 3840, "5 -> 8 x 8: intermittent log-normal intensities, 58 % zeros (heavy tail)",
             overrides=(*_FIELD_SIZES, "model.coarse_index=-1")),
    SuiteSet("wobbly", "policy", 200, "reach2d: swaying, varied-speed demonstrations passing left 70 %, right 30 %",
             env="reach2d"),
    SuiteSet("routes", "policy", 200, "reach2d-routes: three routes in equal shares, swaying paths (multimodal)",
             env="reach2d-routes"),
]}


def chosen(names: list[str] | None, task: str | None = None) -> list[SuiteSet]:
    """The sets ``names`` lists (None or ``all``: every set, of ``task`` where given), in catalogue
    order; an unknown name is one clear error."""
    if not names or names == ["all"]:
        return [s for s in SETS.values() if task is None or s.task == task]
    unknown = [n for n in names if n not in SETS]
    if unknown:
        raise UserError(f"unknown data set '{unknown[0]}'{closest(unknown[0], SETS)}",
                        f"pick from: {', '.join(SETS)} (or all)")
    return [SETS[n] for n in dict.fromkeys(names)]

