"""Where compiled kernels are kept, read without torch: ``DIFFSCALE_CACHE_DIR/kernels/BUILD/GRAPH``.

BUILD names the device kind and the torch release that compiled them (``nvidia-h200-torch-2.11.0-cu130``):
kernels and a traced network compiled for one GPU kind or torch release serve no other, and a
cluster whose partitions hold several GPU kinds shares one home. GRAPH is ``RunConfig.graph_key``:
what of the config changes the compiled graph (task, network, runtime settings, per-rank batch,
world size). Training writes there (``training/build.py``); ``plan`` reads the folder names to say
whether a job starts warm (kernels for its GPU kind, torch and graph are there) or cold.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from diffscale.io.paths import cache_dir


def build_name(device_name: str, torch_version: str) -> str:
    """``"NVIDIA H200", "2.11.0+cu130"`` -> ``"nvidia-h200-torch-2.11.0-cu130"`` (``"CPU"`` for the CPU)."""
    return _words(f"{device_name} torch {torch_version}")


def torch_part(torch_version: str) -> str:
    """How a build name ends for ``torch_version``: ``"2.11.0+cu130"`` -> ``"torch-2.11.0-cu130"``."""
    return _words(f"torch {torch_version}")


def _words(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-")


def kernels_root() -> Path:
    """The user's kernel cache: ``DIFFSCALE_CACHE_DIR/kernels`` (``~/.cache/diffscale/kernels``)."""
    return cache_dir() / "kernels"


STEP_BUILT = "step-built"
"""The file a kernel folder gets once a training step compiled through it has run (``mark_step_built``):
it holds a whole build of the step, not the part a killed compile left."""


def step_built(folder: Path) -> bool:
    """Whether ``folder`` holds a whole build of a training step (``STEP_BUILT``)."""
    try:
        return (folder / STEP_BUILT).is_file()
    except OSError:
        return False


def mark_step_built(folder: Path) -> None:
    """Mark ``folder`` as holding a whole build; a cache the job cannot write to stays unmarked (its
    next runs then train eager while a background process loads the kernels, as on a cold cache)."""
    try:
        (folder / STEP_BUILT).write_text("a training step compiled through this folder ran\n")
    except OSError:
        pass


def holds_files(folder: Path) -> bool:
    """Whether ``folder`` exists and holds anything (an empty folder is a cold cache)."""
    try:
        return folder.is_dir() and any(folder.iterdir())
    except OSError:
        return False


@dataclass(frozen=True)
class KernelCache:
    """What the user's kernel cache held when a job was planned: its folder, as the planning host
    resolved it, and the (BUILD, GRAPH) folders in it that hold a whole build of a step (``step_built``)."""

    root: str
    compiled: tuple[tuple[str, str], ...] = ()
    torch_version: str | None = None
    """The torch release of the environment that plans (None: not installed there)."""

    @classmethod
    def read(cls, root: Path | None = None) -> KernelCache:
        """The cache at ``root`` (default: the user's), listed two levels deep."""
        from importlib import metadata

        root = (root or kernels_root()).absolute()
        try:
            version: str | None = metadata.version("torch")
        except metadata.PackageNotFoundError:
            version = None
        compiled: list[tuple[str, str]] = []
        try:
            builds = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
            for build in builds:
                compiled += [(build.name, g.name) for g in sorted(build.iterdir()) if step_built(g)]
        except OSError:
            pass
        return cls(str(root), tuple(compiled), version)

    def builds_of(self, graph_key: str, gpu_kind: str | None) -> list[str]:
        """The builds holding kernels of ``graph_key`` for ``gpu_kind`` (a partition's GPU type, e.g.
        ``A100-80GB``: its model word, ``a100``, is one word of the build's device name; None or no model
        word: any device)."""
        word = _model_word(gpu_kind) if gpu_kind else ""
        return [build for build, graph in self.compiled
                if graph == graph_key and (not word or word in build.split("-"))]


def _model_word(gpu_kind: str) -> str:
    """``"A100-80GB"`` -> ``"a100"``, ``"L40S"`` -> ``"l40s"``: the first word of letters and digits;
    empty where there is none (``"any (compute capability >= 7.0)"``: the GPU kind is not known)."""
    words = re.split(r"[^a-z0-9]+", gpu_kind.lower())
    return next((w for w in words if re.search(r"[a-z]", w) and re.search(r"[0-9]", w)), "")
