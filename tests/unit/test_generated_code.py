"""Inductor's generated Python loaded through Python's bytecode cache (runtime/generated_code.py)."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest
import torch

from diffscale.runtime.generated_code import TORCH_LOADER, load_with_bytecode


def _torch_loader(key, path, set_sys_modules=True):
    from torch._inductor.runtime.compile_tasks import _reload_python_module

    return _reload_python_module(key, path, set_sys_modules=set_sys_modules)


def test_a_second_load_reads_the_kept_bytecode_not_the_source(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", False)  # CI machines may set PYTHONDONTWRITEBYTECODE
    source = tmp_path / "cabc123.py"
    source.write_text("def call():\n    return 'first'\n")
    first = load_with_bytecode("generated.cabc123", "cabc123", str(source), False, _torch_loader)
    assert first.call() == "first" and first.key == "cabc123" and first.__file__ == str(source)
    kept = importlib.util.cache_from_source(str(source))
    assert os.path.exists(kept)
    # The same size and modification time with other text: a load that compiled the source again
    # would return "other"; one that read the kept bytecode returns what the first load ran.
    stat = source.stat()
    source.write_text("def call():\n    return 'other'\n")
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    second = load_with_bytecode("generated.cabc123", "cabc123", str(source), False, _torch_loader)
    assert second.call() == "first"
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # a newer source is compiled again
    assert load_with_bytecode("generated.cabc123", "cabc123", str(source), False, _torch_loader).call() == "other"


def test_where_python_writes_no_bytecode_none_is_written(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    path = _module(tmp_path)
    assert load_with_bytecode("generated.cmodule", "cmodule", str(path), False, _torch_loader).VALUE == 1
    assert not os.path.exists(importlib.util.cache_from_source(str(path)))


def test_a_file_that_does_not_compile_fails_as_torch_fails_it(tmp_path):
    source = tmp_path / "cbroken.py"
    source.write_text("def call(:\n")
    with pytest.raises(RuntimeError, match=r"Failed to import .*cbroken.py\nSyntaxError"):
        load_with_bytecode("generated.cbroken", "cbroken", str(source), False, _torch_loader)
    loaded = load_with_bytecode("generated.cmodule", "cmodule", str(_module(tmp_path)), True, _torch_loader)
    assert sys.modules.pop("generated.cmodule") is loaded  # set_sys_modules as torch's loader does


def _module(folder):
    path = folder / "cmodule.py"
    path.write_text("VALUE = 1\n")
    return path


def test_runs_that_compile_keep_the_generated_bytecode_unless_turned_off(monkeypatch):
    from torch._inductor import codecache

    from diffscale import config as C
    from diffscale.runtime.device import configure_backends, resolve_policy

    cpu = torch.device("cpu")
    assert not resolve_policy(C.RuntimeConfig(), cpu).generated_bytecode  # auto: the CPU does not compile
    assert resolve_policy(C.RuntimeConfig(compile=C.Toggle.ON), cpu).generated_bytecode
    off = C.RuntimeConfig(compile=C.Toggle.ON, generated_bytecode=C.Toggle.OFF)
    assert not resolve_policy(off, cpu).generated_bytecode
    # torch's own loader, also where an earlier test of this process installed diffscale's; restored after
    torch_loader = getattr(codecache._reload_python_module, TORCH_LOADER, codecache._reload_python_module)
    monkeypatch.setattr(codecache, "_reload_python_module", torch_loader)
    configure_backends(resolve_policy(off, cpu))
    assert codecache._reload_python_module is torch_loader
    configure_backends(resolve_policy(C.RuntimeConfig(compile=C.Toggle.ON), cpu))
    installed = codecache._reload_python_module
    assert installed is not torch_loader
    configure_backends(resolve_policy(C.RuntimeConfig(compile=C.Toggle.ON), cpu))
    assert codecache._reload_python_module is installed  # once per process
