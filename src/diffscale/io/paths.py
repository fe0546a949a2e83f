"""Paths diffscale writes to or reads from, checked before any work starts.

A folder or file target at or under a regular file, or in a folder the user may not write
to, is one clear message up front instead of a traceback halfway through (and nothing is
created on the way). :func:`os_error` turns what the operating system refused later --
no space left, permission denied -- into the same kind of message.
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

from diffscale.errors import UserError


def _nearest_existing(path: Path) -> Path:
    """``path`` itself or its closest ancestor that exists (``.`` for a relative path's root)."""
    for candidate in (path, *path.parents):
        if os.path.lexists(candidate):
            return candidate
    return Path(".")


def _check_ancestors(path: Path, flag: str) -> None:
    """The folders ``path`` needs are folders (or can be made) and the nearest one is writable."""
    existing = _nearest_existing(path.parent)
    if not existing.is_dir():
        raise UserError(f"{flag} '{path}' lies under '{existing}', which is a regular file, not a folder",
                        "choose a path whose parent folders are folders (or move that file away)")
    if not os.access(existing, os.W_OK | os.X_OK, effective_ids=os.access in os.supports_effective_ids):
        raise UserError(f"{flag} '{path}': no permission to write in '{existing}'",
                        "choose a folder you may write to, or ask its owner for write permission")


def folder_target(path: str | Path, flag: str) -> Path:
    """A folder diffscale will create or write into (``train --out``, ``export --diffusers``, ...)."""
    path = Path(path).expanduser()
    if os.path.lexists(path) and not path.is_dir():
        raise UserError(f"{flag} '{path}' is a regular file, not a folder",
                        f"pass a folder (new or existing) to {flag}, or move the file away")
    if path.is_dir():
        if not os.access(path, os.W_OK | os.X_OK, effective_ids=os.access in os.supports_effective_ids):
            raise UserError(f"{flag} '{path}': no permission to write in it",
                            "choose a folder you may write to, or ask its owner for write permission")
        return path
    _check_ancestors(path, flag)
    return path


def file_target(path: str | Path, flag: str, *, example: str = "out.png") -> Path:
    """A file diffscale will write (``sample --out``, ``cluster discover --out``)."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise UserError(f"{flag} '{path}' is a folder, not a file", f"pass a file path, e.g. {flag} {path / example}")
    _check_ancestors(path, flag)
    return path


_CAUSES = {
    errno.ENOSPC: ("no space left on the device", "free space there (df -h shows how much is left) or write elsewhere"),
    errno.EDQUOT: ("the disk quota is exceeded", "free space in your quota (quota -s) or write elsewhere"),
    errno.EACCES: ("permission denied", "check the permissions of the file and its folders (ls -ld), "
                                        "or run as a user who may access them"),
    errno.EPERM: ("operation not permitted", "check the owner and permissions of the file (ls -l)"),
    errno.EROFS: ("the file system is read-only", "write somewhere else"),
    errno.ENOTDIR: ("a part of the path is a regular file, not a folder",
                    "choose a path whose parent folders are folders"),
    errno.EISDIR: ("it is a folder, not a file", "pass a file path"),
    errno.EEXIST: ("a file is in the way", "remove it or choose another path"),
    errno.ENAMETOOLONG: ("the name is too long", "choose a shorter path"),
    errno.EMFILE: ("too many open files", "raise the limit (ulimit -n) or close other programs"),
}


def os_error(exc: OSError) -> UserError | None:
    """The UserError for an operating-system refusal the user can fix; None for anything else
    (a missing internal file is a bug and keeps its traceback)."""
    cause = _CAUSES.get(exc.errno or 0)
    if cause is None:
        return None
    where = f" ('{exc.filename}')" if exc.filename else ""
    if exc.filename2:
        where = f" ('{exc.filename}' -> '{exc.filename2}')"
    return UserError(f"{cause[0]}{where}", cause[1])


def refused(exc: BaseException) -> UserError | None:
    """:func:`os_error` also for libraries that wrap the system's refusal in their own exception
    (safetensors' Rust writer says "I/O error: No space left on device (os error 28)")."""
    if isinstance(exc, OSError):
        return os_error(exc)
    wrapped = re.search(r"\(os error (\d+)\)", str(exc))
    if wrapped is None:
        return None
    code = int(wrapped.group(1))
    return os_error(OSError(code, os.strerror(code)))


def check_export_dir(out_dir: Path) -> Path:
    """``out_dir`` if it is absent or empty: an export never mixes its files with others."""
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise UserError(f"export folder '{out_dir}' is not empty", "pass a new or empty folder to --diffusers")
    return out_dir


def current_umask() -> int:
    """The process's file-mode creation mask (read from /proc on Linux, where setting it to read
    it back would race with other threads creating files)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def give_default_modes(folder: Path) -> None:
    """Give every file and folder under ``folder`` (and ``folder`` itself) the mode the umask
    gives new ones. safetensors writes through a temporary file that is created 0600 and renamed,
    so a weights file would otherwise stay private to its owner while the rest of a folder shared
    with a group is readable."""
    mask = current_umask()
    for path in (Path(folder), *Path(folder).rglob("*")):
        if not path.is_symlink():
            path.chmod((0o777 if path.is_dir() else 0o666) & ~mask)


def cache_dir() -> Path:
    """``DIFFSCALE_CACHE_DIR``, else the user's cache folder (``XDG_CACHE_HOME`` or ``~/.cache``) / diffscale."""
    if os.environ.get("DIFFSCALE_CACHE_DIR"):
        return Path(os.environ["DIFFSCALE_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "diffscale"
