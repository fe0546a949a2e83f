"""Root reads and writes every file whatever its mode; tests of unreadable files drop that bypass.

:func:`without_root_bypass` clears CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH and CAP_FOWNER from
the calling thread's *effective* capabilities for the duration of a ``with`` block. They stay
in the permitted set, so they come back afterwards: the kernel checks file modes for root
exactly as for any user in between, in this process (a subprocess per case would cost ~2 s
of imports). Another user (non-root runs, CI) is checked anyway: the block changes nothing.

:func:`bypass_dropped` is the other way, for a whole command: ``setpriv`` removes the three
capabilities from the bounding set, so the process (every thread of it) runs without them.
Another user such as ``nobody`` is not used because it could not run the interpreter (it lives
under /root, mode 700, here).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import shutil
from collections.abc import Iterator

_CAPABILITY_VERSION_3 = 0x20080522
_BYPASS = (1 << 1) | (1 << 2) | (1 << 3)  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER


class _Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _Data(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name, use_errno=True) if name else None


def _caps(libc: ctypes.CDLL) -> ctypes.Array:
    data = (_Data * 2)()
    if libc.capget(ctypes.byref(_Header(_CAPABILITY_VERSION_3, 0)), data) != 0:
        raise OSError(ctypes.get_errno(), "capget failed")
    return data


def _set_caps(libc: ctypes.CDLL, data: ctypes.Array) -> None:
    if libc.capset(ctypes.byref(_Header(_CAPABILITY_VERSION_3, 0)), data) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")


def unavailable() -> str | None:
    """Why file permissions cannot be made to apply here (None: they can)."""
    if os.geteuid() != 0:
        return None  # an ordinary user: modes apply already
    libc = _libc()
    if libc is None or not hasattr(libc, "capset"):
        return "root, and no libc capset() to drop the permission bypass with"
    try:
        _caps(libc)
    except OSError as exc:
        return f"root, and capget() failed ({exc})"
    return None


@contextlib.contextmanager
def without_root_bypass() -> Iterator[None]:
    """File modes apply to this thread inside the block, also for root."""
    if os.geteuid() != 0:
        yield
        return
    libc = _libc()
    assert libc is not None, unavailable()
    saved = _caps(libc)
    dropped = _caps(libc)
    dropped[0].effective &= ~_BYPASS
    _set_caps(libc, dropped)
    try:
        yield
    finally:
        _set_caps(libc, saved)


def bypass_dropped(argv: list[str]) -> list[str] | None:
    """``argv`` as a process whose file accesses are checked against file modes (None: not
    possible here). Not root: ``argv`` itself."""
    if os.geteuid() != 0:
        return argv
    if shutil.which("setpriv") is None:
        return None
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner", "--", *argv]
