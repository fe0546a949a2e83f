"""Inductor's generated Python loaded through Python's own bytecode cache (``runtime.generated_bytecode``).

Torch loads every module inductor generates -- the output code that runs a compiled graph, each
Triton kernel's module -- by compiling its source again in every process
(``torch._inductor.codecache._reload_python_module``: ``compile`` of the file, then ``exec``).
A job that installs a cached compile therefore still compiles the output code's source (~20,000
lines for small's backward): loading it took 0.42-0.44 s of a resumed small or medium job on a
2 x H200 host, 0.23-0.34 s with the bytecode kept (docs/measurements/2026-11-28.md, "The generated code's
bytecode kept").

:func:`keep_generated_bytecode` has torch load those files with importlib's ``SourceFileLoader``
instead, as an import would: the first process writes the bytecode (``__pycache__`` beside the
source, or under ``sys.pycache_prefix``), later processes read it, checked against the source's
modification time and size (``PYTHONDONTWRITEBYTECODE`` is honoured as imports honour it).
Inductor names each file by a hash of its content and writes it once.
Everything else is torch's: the module's name, ``__file__`` and ``key``, ``sys.modules``; a file
the loader cannot compile goes to torch's own function, which raises torch's error.

It replaces a private torch function, written against torch 2.11 and 2.13; where torch has no
function by that name, nothing changes.
"""

from __future__ import annotations

import importlib.machinery
import sys
from collections.abc import Callable
from types import ModuleType

TORCH_LOADER = "_diffscale_torch_loader"
"""On the loader this module installs: torch's own (a second call leaves the installed one in place)."""


def keep_generated_bytecode() -> bool:
    """Load inductor's generated modules with kept bytecode from now on in this process; returns
    whether torch's loader was replaced (or already had been)."""
    try:
        from torch._inductor import codecache
    except ImportError:  # a torch without inductor
        return False
    torch_loader = getattr(codecache, "_reload_python_module", None)
    if torch_loader is None:
        return False
    if hasattr(torch_loader, TORCH_LOADER):
        return True
    prefix = getattr(torch_loader, "__module__", "torch._inductor.runtime.compile_tasks")

    def load(key: str, path: str, set_sys_modules: bool = True) -> ModuleType:
        return load_with_bytecode(f"{prefix}.{key}", key, path, set_sys_modules, torch_loader)

    setattr(load, TORCH_LOADER, torch_loader)
    codecache._reload_python_module = load
    return True


def load_with_bytecode(name: str, key: str, path: str, set_sys_modules: bool,
                       torch_loader: Callable[..., ModuleType]) -> ModuleType:
    """The module at ``path`` as torch's ``_reload_python_module`` builds it, its code read from
    kept bytecode where the source has not changed since it was written."""
    try:
        code = importlib.machinery.SourceFileLoader(name, path).get_code(name)
    except Exception:  # torch's own loader raises what torch raises for such a file
        code = None
    if code is None:
        return torch_loader(key, path, set_sys_modules=set_sys_modules)
    module = ModuleType(name)
    module.__file__ = path
    module.key = key  # type: ignore[attr-defined]
    exec(code, module.__dict__, module.__dict__)
    if set_sys_modules:
        sys.modules[name] = module
    return module
