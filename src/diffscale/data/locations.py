"""Which part of a data spec (``data.source``) is a path on the file system, and the spec with
that path made absolute.

Every task's specs that read files have the form ``kind:PATH[:OPTION]`` (tasks/images/sources.py,
tasks/fields/data.py, tasks/policy/episodes.py, data/spool.py); how a spec separates its path
from an option after it is defined here, once, and those readers split specs with it. ``builtin``
data is generated and ``online`` data pushed from Python, so they name no path. A cluster job runs in its run directory
(``cd $RUN_DIR``), where a relative path written into its config would name something else:
plan and submit make the path absolute where they resolve the config.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from diffscale.errors import UserError

if TYPE_CHECKING:
    from diffscale.config import RunConfig

PATH_KINDS = ("imagefolder", "npz", "emnist", "mnist", "webdataset", "parquet", "zarr", "lerobot", "spool")
"""Spec kinds whose first part is a path."""

EMNIST_SPLITS = ("byclass", "bymerge", "balanced", "letters", "digits", "mnist")
"""The splits ``emnist:ROOT:SPLIT`` may name."""


def emnist_path_split(rest: str) -> tuple[str, str]:
    """``ROOT[:SPLIT]`` -> (root, split or ""): the split is the part after the last ':' when it
    names a split (paths may hold ':')."""
    head, _, tail = rest.rpartition(":")
    if head and tail in EMNIST_SPLITS:
        return head, tail
    return rest, ""


def path_option_split(rest: str) -> tuple[str, str]:
    """``PATH[:OPTION]`` of zarr and LeRobot specs -> (path, option or ""): the option is the part
    after the last ':' when the whole rest is not an existing path (paths may hold ':')."""
    head, sep, tail = rest.rpartition(":")
    if sep and head and "/" not in tail and not Path(rest).exists():
        return head, tail
    return rest, ""


DEFAULT_CAPACITY = 3840
"""Samples the buffer of ``spool:DIR`` holds without ``:N`` (the users' 48 output steps of 80 cells)."""


SPOOL_END_NAME = "ended.json"
"""A spool's end marker (tasks/fields/spool.py): written once the simulation's command has ended by
itself, after its last file."""
SPOOL_JOB_NAME = "job.json"
"""The scheduler job that runs a spool's simulation (``runtime/job_end.py`` writes and reads it)."""


@dataclass(frozen=True)
class SpoolSpec:
    """``spool:DIR[:N]``: follow DIR into a FIFO buffer of the newest N samples."""

    directory: Path
    capacity: int

    @property
    def source(self) -> str:
        return f"spool:{self.directory}:{self.capacity}"


def _spool_parts(rest: str) -> tuple[str, int]:
    """``DIR[:N]`` -> (DIR, N or the default)."""
    head, sep, tail = rest.rpartition(":")
    return (head, int(tail)) if sep and tail.isdigit() else (rest, DEFAULT_CAPACITY)


def parse_spool_spec(spec: str) -> SpoolSpec:
    """``spool:/scratch/run/spool:3840`` -> SpoolSpec(/scratch/run/spool, 3840). The capacity is
    the last ``:`` part when it is a number, so a directory may contain colons."""
    directory, capacity = _spool_parts(spec.partition(":")[2])
    if not directory or capacity < 1:
        raise UserError(f"data source '{spec}' is not a spool directory",
                        "write spool:DIR or spool:DIR:N with N the samples the buffer keeps, "
                        f"e.g. spool:/scratch/run/spool:{DEFAULT_CAPACITY}")
    return SpoolSpec(Path(directory), capacity)


def local_path(source: str) -> str | None:
    """The path ``source`` reads, as written (None: data without a path). The option after it
    (an EMNIST split, a spool's buffer size, zarr keys or LeRobot columns) is split off as the
    reader of that kind splits it."""
    kind, _, rest = source.partition(":")
    kind = kind.strip().lower()
    if kind not in PATH_KINDS or not rest:
        return None
    if kind == "emnist":
        return emnist_path_split(rest)[0]
    if kind in ("zarr", "lerobot", "parquet"):
        return path_option_split(rest)[0]
    if kind == "spool":
        return _spool_parts(rest)[0] or rest
    return rest


def absolute(source: str) -> str:
    """``source`` with a relative path made absolute from the current directory (``~`` left to
    the reader, which expands it); other specs unchanged."""
    path = local_path(source)
    if path is None or Path(path).expanduser().is_absolute():
        return source
    kind, _, rest = source.partition(":")
    assert rest.startswith(path), "every reader takes the path from the front of the spec"
    return f"{kind}:{Path(path).absolute()}{rest[len(path):]}"


def with_absolute_path(cfg: RunConfig) -> RunConfig:
    """``cfg`` with a relative data path that exists here made absolute, so that the config.yaml
    of a run (resumed from another directory) or of a job (run in its run directory) reads the
    same data; any other ``cfg`` unchanged (a path that names nothing is left to its reader)."""
    from dataclasses import replace

    path = local_path(cfg.data.source)
    if path is None or not Path(path).expanduser().exists():
        return cfg
    return replace(cfg, data=replace(cfg.data, source=absolute(cfg.data.source)))
