"""Which part of a data spec (``data.source``) is a path on the file system, and the spec with
that path made absolute.

Every task's specs that read files have the form ``kind:PATH[:OPTION]`` (data/sources.py,
data/fields.py, data/episodes.py, data/spool.py); ``builtin`` data is generated and ``online``
data pushed from Python, so they name no path. A cluster job runs in its run directory
(``cd $RUN_DIR``), where a relative path written into its config would name something else:
plan and submit make the path absolute where they resolve the config.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..config import RunConfig

PATH_KINDS = ("imagefolder", "npz", "emnist", "mnist", "zarr", "lerobot", "spool")
"""Spec kinds whose first part is a path."""


def local_path(source: str) -> str | None:
    """The path ``source`` reads, as written (None: data without a path). The option after it
    (an EMNIST split, a spool's buffer size, zarr keys or LeRobot columns) is split off as the
    reader of that kind splits it."""
    kind, _, rest = source.partition(":")
    kind = kind.strip().lower()
    if kind not in PATH_KINDS or not rest:
        return None
    if kind == "emnist":
        from .sources import parse_spec

        return parse_spec(source).path
    if kind in ("zarr", "lerobot"):
        from .episodes import split_spec

        return split_spec(source)[1]
    if kind == "spool":  # spool:DIR[:N], as parse_spool_spec reads it
        head, sep, tail = rest.rpartition(":")
        return head if sep and tail.isdigit() and head else rest
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
