"""Every output file is written to a temporary file beside it and renamed into place: a write that
fails (a full disk, a writer that raises, a kill) leaves the old file as it was and no partial
file behind, and a reader never sees half a file."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from diffscale.io.paths import current_umask


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path in ``path``'s folder with the same suffix (writers that choose a
    format by suffix -- PIL, imageio, matplotlib, numpy -- see the real one); on a clean exit it
    is flushed to disk and renamed onto ``path``, on any error removed. Creates the folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=f".partial{path.suffix}")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        with open(tmp, "rb+") as fh:  # on disk before the rename: a crash leaves old or new, never empty
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~current_umask())  # what a plain open() gives; mkstemp's is 0600
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def write_text(path: str | Path, text: str, *, encoding: str = "utf-8") -> Path:
    """``Path.write_text``, atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding=encoding)
    return Path(path)


def write_bytes(path: str | Path, data: bytes) -> Path:
    """``Path.write_bytes``, atomically."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)
