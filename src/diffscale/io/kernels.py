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
it holds a whole build of the step, not the part a killed compile left. It lists the data each build
was for (``RunConfig.kernels_built_for``): the folder is keyed by the config, and where a network's
sizes follow its data (image channels) one config compiles one step for grayscale images and another
for colour ones. large on colour images after grayscale ones compiled first from such a folder and
waited 98.5 s without a step (four H200, 2026-11-30)."""

BUILT_FOR = "built for: "
"""The prefix of ``STEP_BUILT``'s lines naming the data a whole build was for."""


def builds_recorded(folder: Path) -> frozenset[str] | None:
    """The data ``folder``'s whole builds were for (``STEP_BUILT``'s lines; empty for a build that
    follows no data, or one marked before the file named it), None where it holds no whole build."""
    try:
        text = (folder / STEP_BUILT).read_text()
    except (OSError, UnicodeDecodeError):
        return None
    return frozenset(line[len(BUILT_FOR):] for line in text.splitlines() if line.startswith(BUILT_FOR))


def _one_line(built_for: str) -> str:
    return " ".join(built_for.splitlines())


def _made_for(recorded: frozenset[str], built_for: str) -> bool:
    """Whether whole builds made for the data ``recorded`` names serve a run of ``built_for`` (any
    data where it names none)."""
    return not built_for or _one_line(built_for) in recorded


def step_built(folder: Path, built_for: str = "") -> bool:
    """Whether ``folder`` holds a whole build of a training step (``STEP_BUILT``), made for the data
    ``built_for`` names where it names one (``RunConfig.kernels_built_for``)."""
    recorded = builds_recorded(folder)
    return recorded is not None and _made_for(recorded, built_for)


def mark_step_built(folder: Path, built_for: str = "") -> None:
    """Mark ``folder`` as holding a whole build, made for the data ``built_for`` names (if any); a
    cache the job cannot write to stays unmarked (its next runs then train eager while a background
    process loads the kernels, as on a cold cache)."""
    recorded = builds_recorded(folder)
    if recorded is not None and _made_for(recorded, built_for):
        return
    lines = "" if recorded is not None else "a training step compiled through this folder ran\n"
    if built_for:
        lines += f"{BUILT_FOR}{_one_line(built_for)}\n"
    try:
        with (folder / STEP_BUILT).open("a") as marker:  # runs of other data may add theirs beside it
            marker.write(lines)
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
    built_for: tuple[frozenset[str], ...] = ()
    """For each of ``compiled``: the data its whole builds were for (``builds_recorded``)."""
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
        built_for: list[frozenset[str]] = []
        try:
            builds = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
            for build in builds:
                for graph in sorted(build.iterdir()):
                    recorded = builds_recorded(graph)
                    if recorded is not None:
                        compiled.append((build.name, graph.name))
                        built_for.append(recorded)
        except OSError:
            pass
        return cls(str(root), tuple(compiled), tuple(built_for), version)

    def builds_of(self, graph_key: str, gpu_kind: str | None, built_for: str = "") -> list[str]:
        """The builds holding kernels of ``graph_key`` for ``gpu_kind`` (a partition's GPU type, e.g.
        ``A100-80GB``: its model word, ``a100``, is one word of the build's device name; None or no model
        word: any device) and, where ``built_for`` names data, for that data (``step_built``)."""
        word = _model_word(gpu_kind) if gpu_kind else ""
        recorded = self.built_for or (frozenset(),) * len(self.compiled)
        return [build for (build, graph), sources in zip(self.compiled, recorded, strict=True)
                if graph == graph_key and (not word or word in build.split("-"))
                and _made_for(sources, built_for)]


def _model_word(gpu_kind: str) -> str:
    """``"A100-80GB"`` -> ``"a100"``, ``"L40S"`` -> ``"l40s"``: the first word of letters and digits;
    empty where there is none (``"any (compute capability >= 7.0)"``: the GPU kind is not known)."""
    words = re.split(r"[^a-z0-9]+", gpu_kind.lower())
    return next((w for w in words if re.search(r"[a-z]", w) and re.search(r"[0-9]", w)), "")
