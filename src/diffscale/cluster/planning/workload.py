"""What a job runs: a diffscale training run, or any user command given after ``--``.

Both carry the run directory (jobs.json, logs, race claim and, for diffscale, the
resolved config and checkpoints live there) and give the per-rank argv that the job
script starts once per rank (srun) or once per host (torchrun under Grid Engine).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from diffscale.cluster.planning.usage import RankUsage
from diffscale.cluster.scripts.launcher import Launcher
from diffscale.config import RunConfig
from diffscale.errors import UserError
from diffscale.io.kernels import KernelCache

if TYPE_CHECKING:
    from diffscale.data.placement import DataSize

Env = tuple[tuple[str, str], ...]

UNBUFFERED: Env = (("PYTHONUNBUFFERED", "1"),)
"""A job log is a file, and Python block-buffers what it prints to a file: without this a
user's ``print`` lines appear only when the buffer fills or the command exits."""


@dataclass(frozen=True, eq=False)
class DiffscaleRun:
    """``python -m diffscale train RUN_DIR/config.yaml --out RUN_DIR --resume auto``."""

    config: RunConfig
    run_dir: str
    """Absolute path of the run directory, exactly as the job will see it."""
    python: str
    """Interpreter on the cluster nodes (by default the one running diffscale now)."""
    data_bytes: int = 0
    """Bytes of training data each data-loading process holds in memory (npz files are loaded whole)."""
    data_found: bool | None = None
    """Whether the path ``data.source`` reads exists on the host that plans the job (None: data
    without a path, or not looked at)."""
    sizes_note: str = ""
    """Where the network sizes that ``config`` leaves to the data came from, for the plan's notes."""
    data_size: DataSize | None = None
    """Items and decoded bytes of an image run's data, read here cheaply (None: not readable here)."""
    kernels: KernelCache | None = None
    """The user's kernel cache as this host sees it: the job is told where it is (``DIFFSCALE_CACHE_DIR``)
    and the plan says whether the job starts warm or cold (None: not looked at)."""

    @property
    def config_path(self) -> str:
        return str(PurePosixPath(self.run_dir) / "config.yaml")

    def argv(self) -> tuple[str, ...]:
        return (self.python, "-m", "diffscale", "train", self.config_path, "--out", self.run_dir, "--resume", "auto")

    def torchrun_args(self) -> tuple[str, ...]:
        """What torchrun runs per rank (``-m diffscale train ...``)."""
        return ("-m", "diffscale", "train", self.config_path, "--out", self.run_dir, "--resume", "auto")

    @property
    def resumable(self) -> bool:
        return True

    @property
    def job_env(self) -> Env:
        # diffscale's console flushes every line itself; the cache the plan looked in is the job's
        return (("DIFFSCALE_CACHE_DIR", str(PurePosixPath(self.kernels.root).parent)),) if self.kernels else ()

    @property
    def notes(self) -> tuple[str, ...]:
        return (self.sizes_note,) if self.sizes_note else ()

    @property
    def title(self) -> str:
        return f"diffscale train (preset {self.config.preset})"


def job_config(cfg: RunConfig) -> RunConfig:
    """``cfg`` as a job's config.yaml holds it: a relative data path made absolute from here, since
    the job reads it from its run directory. A relative path that names nothing here is refused:
    made absolute it would name nothing on the cluster either."""
    from diffscale.data.locations import local_path, with_absolute_path

    path = local_path(cfg.data.source)
    if path is not None and not Path(path).expanduser().is_absolute() and not Path(path).exists():
        raise UserError(f"data path '{path}' (data.source {cfg.data.source}) does not exist under {Path.cwd()}",
                        "the job runs in its run directory, so plan and submit make a relative path absolute from "
                        "the current one: run them from the folder the path is relative to, or give the path on the "
                        "cluster's file system as an absolute one")
    return with_absolute_path(cfg)


def diffscale_run(cfg: RunConfig, run_dir: str, python: str, *, kernel_cache: bool = False) -> DiffscaleRun:
    """The job training ``cfg`` (a ``job_config``): with the bytes of an npz it loads whole, whether
    its data path exists on this host, and for the estimates the network sizes that ``cfg`` leaves
    to the data (the config the job writes keeps them following the data). ``kernel_cache``: with
    the user's kernel cache as this host sees it (a sweep's elements keep the sweep's own)."""
    from diffscale.cluster.planning.estimates import with_data_sizes
    from diffscale.data.locations import local_path

    path = local_path(cfg.data.source)
    where = Path(path).expanduser() if path is not None else None
    data_bytes = 0
    if where is not None and cfg.data.source.startswith("npz:") and where.is_file():
        data_bytes = where.stat().st_size
    sized, note = with_data_sizes(cfg)
    size = None
    if where is not None and where.exists():
        from diffscale.tasks.registry import data_size

        size = data_size(cfg)
    return DiffscaleRun(config=sized, run_dir=run_dir, python=python, data_bytes=data_bytes,
                        data_found=None if where is None else where.exists(), sizes_note=note, data_size=size,
                        kernels=KernelCache.read() if kernel_cache else None)


@dataclass(frozen=True)
class UserCommand:
    """Any command, e.g. ``python train.py --epochs 10`` for a Lightning or plain PyTorch trainer."""

    argv_: tuple[str, ...]
    run_dir: str
    python: str
    env: Env = ()
    """Variables the command needs on every rank beyond PYTHONUNBUFFERED (a coupled
    simulation's ``DIFFSCALE_SPOOL``)."""
    launcher: Launcher = Launcher.PLAIN
    """How the command starts its ranks (a Lightning Trainer gets the script Lightning expects)."""
    usage: RankUsage | None = None
    """What one rank uses (a probe or the user's statement); None: unknown."""

    def __post_init__(self) -> None:
        if not self.argv_:
            raise UserError("no command after `--`", "write e.g. `diffscale submit --cluster X -- python train.py`")

    def argv(self) -> tuple[str, ...]:
        return self.argv_

    def torchrun_args(self) -> tuple[str, ...]:
        """What follows torchrun's own options. ``--no-python`` runs the command exactly as
        given once per rank (python scripts, ``python -c``, shell wrappers alike)."""
        return ("--no-python",) + self.argv_

    @property
    def resumable(self) -> bool:
        # We cannot know whether a user's command resumes from its own checkpoints.
        return False

    @property
    def job_env(self) -> Env:
        return UNBUFFERED + self.env

    @property
    def notes(self) -> tuple[str, ...]:
        lightning = ("a Lightning command: the Trainer must say devices=<GPUs per node> and num_nodes=<nodes> "
                     "(Lightning checks them against the job's tasks)",) if self.launcher is Launcher.LIGHTNING else ()
        probed = self.usage.notes if self.usage is not None else ()
        return lightning + probed + (
            "the job exports PYTHONUNBUFFERED=1, so what your command prints reaches the job log as it happens "
            "(Python block-buffers output to a file); the profile's env: can set it to 0",)

    @property
    def title(self) -> str:
        kind = "Lightning command" if self.launcher is Launcher.LIGHTNING else "user command"
        return f"{kind}: " + shlex.join(self.argv_)  # as a shell would take it back (the header is copied)


Workload = DiffscaleRun | UserCommand
