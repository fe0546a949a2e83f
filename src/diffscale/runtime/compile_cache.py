"""Dynamo's traced network kept beside its kernels (``runtime.compile_cache``), so a resumed job
skips dynamo's tracing: torch's experimental "caching precompile" (``torch._dynamo.config.
caching_precompile``). The first job saves the traced bytecode, its guards and the compiled
forward/backward once, after its first step, to ``<inductor cache>/dynamo/<key>/entry``; the next
job's ``torch.compile`` installs them, so its first step runs without tracing.

Torch keys the entry by the compiled function alone (``Denoiser.forward``'s name and line), checks
the Python and torch versions and the source of every function it inlined, and drops the guards it
cannot write (object identities, dict versions, closures). A stamp of what else decides the graph
(this config's model, runtime and batch, the world size) stands in for those: an entry written under
another stamp is discarded and the network traced again. The stamp also names the data the network
is sized for (``RunConfig.kernels_built_for``): one folder serves a config's runs on grayscale and
on colour images, and an entry traced for the other data is traced anew without a warning (it was
installed, failed its guards and warned "traced the network again", large on the suite, 2026-11-30).
The precompile package is torch's own, so this module reaches into ``torch._dynamo.package``
(private) and is written against torch 2.11 and 2.13, where it was measured (docs/benchmarks.md,
"Start-up and compile time")."""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import logging
import pickle
import re
import shutil
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from diffscale.config import RunConfig, Toggle
from diffscale.io.atomic import write_text

STAMP = "diffscale-stamp.json"
"""Beside torch's entries: the fingerprint of the run they were traced for."""
DISCARDED = "traced-network-discarded.txt"
"""Beside the entries' folder: why and where the last entry that could not be used failed."""
RETRACED = "traced-network-retraced.txt"
"""Beside the entries' folder: which guards of the installed entry failed for the call that the last
job traced anyway."""

# torch's CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES (torch 2.11, 2.13). Caching
# precompile drops most of these itself, but not a CLASS_MATCH guard that carries no derived ID_MATCH
# (diffusers' ModelMixin.__getattr__ leaves one on type(self.unet)); torch then gives up on the entry
# and fails the compile ("check_fn.guards_state must not be None").
_UNWRITABLE = frozenset({"DICT_VERSION", "NN_MODULE", "ID_MATCH", "FUNCTION_MATCH", "CLASS_MATCH", "MODULE_MATCH",
                         "CLOSURE_MATCH", "WEAKREF_ALIVE"})


class _QuietDroppedGuards(logging.Filter):
    """Torch warns once per guard it leaves out of an entry (~80 lines for a UNet, every job that
    traces); the leaving out is this feature's design, stated in the module doc."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "is dropped with caching_precompile" not in record.getMessage()


_QUIET = _QuietDroppedGuards()
_GUARDS_LOG = logging.getLogger("torch._dynamo.guards")


def writable_guards(entries: Sequence[Any]) -> list[bool]:
    """``torch.compile``'s ``guard_filter_fn``: keep the guards torch can write into an entry and
    read back (tensor shapes, dtypes, devices, strides, global state such as grad mode and autocast)."""
    return [not (e.guard_type in _UNWRITABLE or _UNWRITABLE.intersection(e.derived_guard_types)
                 or getattr(e.orig_guard, "_unserializable", False) or _on_defaults(e.orig_guard)) for e in entries]


def _on_defaults(guard: Any) -> bool:
    """A guard on a function's default argument. torch 2.11 writes its source (``DefaultsSource``)
    with two fields it cannot read back: loading the entry failed with ``TypeError: DefaultsSource.
    __init__() takes from 3 to 4 positional arguments but 6 were given`` (fixed in 2.13). The
    defaults are in the source torch checksums."""
    source = getattr(guard, "originating_source", None)
    while source is not None:
        if type(source).__name__ == "DefaultsSource":
            return True
        source = getattr(source, "base", None)
    return False


def fingerprint(cfg: RunConfig, world_size: int) -> str:
    """What decides the traced graph beyond the source torch checks itself."""
    parts = {**cfg.graph_parts(world_size), "torch": torch.__version__}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def _graphs_traced() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


@dataclass
class CompileCache:
    """One training job's use of the cache; inert (``active`` False) where it is off."""

    directory: Path | None = None
    """``<inductor cache>/dynamo`` where the cache is on, else None."""
    stamp: str = ""
    """``fingerprint`` of this job's run."""
    built_for: str = ""
    """The data this job's network is sized for (``RunConfig.kernels_built_for``): an entry traced for
    other data in the same folder (colour images where grayscale ones were traced) is traced anew."""
    found: bool = False
    """An entry traced for this run was there when the job started."""
    why_not: str = ""
    """Why the cache is off where it was asked for (said once), else empty."""
    say: Callable[[str], None] = print
    """Where the one-line warnings go (the main rank's console)."""
    _saved: bool = False
    _traced_before: int = 0
    _prior: bool = field(default=False, repr=False)
    _entry_modules: tuple[str, ...] = ()
    _entry_function: tuple[str, int] = ("", 0)
    _why_traced: str | None = None
    _unwatch: Callable[[], None] | None = field(default=None, repr=False)

    @property
    def active(self) -> bool:
        return self.directory is not None

    def __enter__(self) -> CompileCache:
        """Caching precompile on while this job compiles and trains (a later compile in the same
        process, e.g. another test, is not touched)."""
        if self.active:
            self._prior = torch._dynamo.config.caching_precompile
            torch._dynamo.config.caching_precompile = True
            self._traced_before = _graphs_traced()
            _GUARDS_LOG.addFilter(_QUIET)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop_watching()
        if self.active:
            torch._dynamo.config.caching_precompile = self._prior
            _GUARDS_LOG.removeFilter(_QUIET)

    def compile(self, model: torch.nn.Module, options: dict[str, Any],
                calls_under: Callable[[], AbstractContextManager[Any]] = nullcontext) -> torch.nn.Module:
        """``torch.compile(model, options=options)``, installing a saved entry if there is one. A load
        that fails for any reason discards the entry with one warning and compiles to trace.
        ``calls_under``: the context the network is called in (the step's autocast). Torch builds the
        installed guards under the context of the install, and a tensor's guarded dispatch keys
        depend on it: an entry installed outside the step's autocast failed every call ("dispatch key
        set mismatch ... AutocastCUDA", H100, torch 2.11) and the network was traced again."""
        if not self.active:
            return _compile(model, options)
        if not self.found:  # torch finds no entry: it traces at the first call and records what it traced
            return _compile(model, {**options, "guard_filter_fn": writable_guards})
        try:
            with _loading_as_compiled(options), calls_under():
                compiled = _compile(model, {**options, "guard_filter_fn": writable_guards})
            _names_past_installed(self._entry_modules)
            self._unwatch = _explain_first_trace(self)
            return compiled
        except Exception as exc:  # torch falls back by itself only on RuntimeError
            self._discard(f"{type(exc).__name__}: {exc}", exc)
            torch._dynamo.reset()
            return _compile(model, {**options, "guard_filter_fn": writable_guards})

    def save_once(self) -> None:
        """After the first compiled step: write what dynamo traced in this job (nothing when the
        job's network came whole from the cache). Never fails the run."""
        if not self.active or self._saved:
            return
        self._saved = True
        self._stop_watching()
        if _graphs_traced() == self._traced_before:
            return
        assert self.directory is not None
        try:
            # Runs of one network share the folder, and may run at once (two seeds on two GPUs): the
            # stamp goes first and whole, so a job starting meanwhile finds a stamp and no entry yet
            # (it traces) rather than an entry without its stamp (which it would discard).
            stamp = {"fingerprint": self.stamp, "built_for": self.built_for}
            write_text(self.directory / STAMP, json.dumps(stamp) + "\n")
            torch.compiler.save_cache_artifacts()  # caching precompile: also writes the dynamo entries (each whole)
        except Exception as exc:
            self.say(f"[yellow]warning: the traced network was not cached ({type(exc).__name__}: {exc}); "
                     f"a resumed job traces it again[/]")
        if self.found:
            self.say(f"[yellow]warning: the cached traced network was installed, yet dynamo traced the network "
                     f"again at the first step{self._why_traced or ''}; the new trace is cached[/]")

    def _stop_watching(self) -> None:
        if self._unwatch is not None:
            self._unwatch()
            self._unwatch = None

    def explain_trace(self, frame: Any) -> str | None:
        """Why dynamo traces ``frame`` although an entry was installed: the guards installed on its
        function checked on this call, as torch's ``fail_on_recompile`` stance reports them (torch logs
        no reason for an installed entry it passes over). The failed guards go to ``RETRACED`` beside
        the entries. None: ``frame`` is not the network's (another function dynamo meets). Never
        fails: a diagnosis, through torch's private API."""
        assert self.directory is not None
        from torch._C._dynamo.eval_frame import _debug_get_precompile_entries

        code = frame.f_code
        where = f"{code.co_name} at {Path(code.co_filename).name}:{code.co_firstlineno}"
        try:
            installed = _debug_get_precompile_entries(code)
            if not installed:
                if (code.co_name, code.co_firstlineno) != self._entry_function:
                    return None
                return f" (no entry is installed on the code of {where}, which it traced)"
            verdicts = [entry.guard_manager.check_verbose(frame.f_locals) for entry in installed]
        except Exception as exc:
            return f" (its guards could not be checked: {type(exc).__name__}: {exc})"
        if any(verdict.result for verdict in verdicts):
            return f" (the guards installed on {where} hold for this call, yet torch traced it)"
        failed = [part.strip() for verdict in verdicts for part in verdict.verbose_code_parts]
        report = self.directory.parent / RETRACED
        try:
            write_text(report, f"{where}: the installed entry's guards that failed\n" + "\n".join(failed) + "\n")
        except OSError:
            return f" (a guard of the entry failed: {failed[0] if failed else 'unknown'})"
        return f" (a guard of the entry failed: {failed[0] if failed else 'unknown'}; all in {report})"

    def _discard(self, why: str, failure: BaseException | None = None) -> None:
        """Drop the entry with one warning. ``failure``'s traceback goes to ``DISCARDED`` beside the
        entry (the warning names it): what a bug report against torch needs."""
        why = why.strip().splitlines()[0] if why.strip() else "unknown"
        report = ""
        if self.directory is not None and failure is not None:
            kept = self.directory.parent / DISCARDED
            trace = "".join(traceback.format_exception(failure))
            try:
                write_text(kept, f"{self.directory}: {why}\ntorch {torch.__version__}\n\n{trace}")
                report = f"; the traceback is in {kept}"
            except OSError:
                pass
        self.say(f"[yellow]warning: the cached traced network in {self.directory} could not be used ({why}); "
                 f"tracing it again{report} (--set runtime.compile_cache=off stops trying)[/]")
        self.found = False
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)

    def check(self, net: torch.nn.Module) -> None:
        """Before compiling: is there an entry for ``net`` traced for this run, readable by this
        torch and these sources? One that is not is discarded (one warning), so torch traces."""
        assert self.directory is not None
        if not self.directory.is_dir():
            return
        try:
            written = json.loads((self.directory / STAMP).read_text())
            stamp, built_for = written["fingerprint"], written.get("built_for", "")
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            stamp, built_for = None, ""
        if stamp != self.stamp:
            self._discard("it was traced for another config or torch" if stamp else "its stamp is missing")
            return
        if built_for != self.built_for:  # the same config on other data: nothing wrong, one entry a folder
            shutil.rmtree(self.directory, ignore_errors=True)
            return
        from torch._dynamo.package import CompilePackage, DynamoCache

        path = Path(DynamoCache.path_prefix()) / CompilePackage.source_id_from_fn(net.forward) / "entry"
        if not path.is_file():
            return
        try:
            entry = pickle.loads(path.read_bytes())
            # versions and the inlined sources' checksums, as torch checks them; installs nothing
            CompilePackage(net.forward, entry.dynamo)
            for code in entry.dynamo.codes:  # the guards read back (what torch 2.11 could not)
                for guarded in code.guarded_codes:
                    read_guards_state(guarded.guards_state)
        except Exception as exc:
            self._discard(f"{type(exc).__name__}: {exc}", exc)
            return
        self.found = True
        main = entry.dynamo.codes[0].python_code
        self._entry_function = (main.co_name, main.co_firstlineno)
        modules = {getattr(code, "python_module", None) for code in entry.dynamo.codes}
        self._entry_modules = tuple(sorted(m for m in modules if m))


_NUMBERED = re.compile(r"^__\w+?_(\d+)$")


def _names_past_installed(modules: Sequence[str]) -> None:
    """Installing an entry puts globals named by the tracing job's counter (``__builtins_dict___0``,
    ``__compiled_fn_1``) into the traced modules. A trace in this job -- a guard that fails, a new
    shape -- draws the same names from a fresh counter, and torch stops with "AssertionError: Name
    '__builtins_dict___0' already exists in scope" (torch 2.11 on an H100, 2.13 on a CPU). Moving
    dynamo's counter past every such name lets that trace go on beside the installed entry."""
    from torch._dynamo import bytecode_transformation

    numbers = [int(m.group(1)) for name in modules if name in sys.modules
               for key in vars(sys.modules[name]) if (m := _NUMBERED.match(key))]
    if numbers:
        counter = bytecode_transformation._unique_id_counter
        bytecode_transformation._unique_id_counter = itertools.count(max(next(counter), max(numbers) + 1))


def open_compile_cache(cfg: RunConfig, cache_dir: Path, *, world_size: int, own_cache: bool,
                       net: torch.nn.Module, say: Callable[[str], None], on_cuda: bool = False) -> CompileCache:
    """The job's cache: on where ``runtime.compile_cache`` is on (``auto``: on CUDA), one process
    trains and the kernels go to diffscale's own folder (a cache the user set may be shared by
    different networks, whose entries torch keys by the function alone). Where it was asked for
    and cannot be used, ``why_not`` says so; ``auto`` stays quiet."""
    setting = cfg.runtime.compile_cache
    asked = setting == Toggle.ON
    if not (asked or (setting == Toggle.AUTO and on_cuda)):
        return CompileCache(say=say)
    why_not = ""
    if world_size > 1:
        why_not = (f"runtime.compile_cache is for one process (this run has {world_size}): "
                   "the network is traced as before")
    elif not own_cache:
        why_not = ("runtime.compile_cache needs the run's own kernel cache (TORCHINDUCTOR_CACHE_DIR is set): "
                   "the network is traced as before")
    if why_not:
        return CompileCache(say=say, why_not=why_not if asked else "")
    cache = CompileCache(directory=cache_dir / "dynamo", stamp=fingerprint(cfg, world_size),
                         built_for=cfg.kernels_built_for(), say=say)
    cache.check(net)
    return cache


def _compile(model: torch.nn.Module, options: dict[str, Any]) -> torch.nn.Module:
    compiled: torch.nn.Module = torch.compile(model, options=options)  # type: ignore[assignment]
    return compiled


def read_guards_state(guards_state: bytes) -> Any:
    """torch's ``load_guards_state`` inside a throwaway tracing context. On CUDA the traced step's
    guards name ``__import__('torch')`` (an ImportSource, through ``torch.cuda``); unpickling one
    installs a guard, which needs an ongoing trace, so torch's own reader failed outside one
    ("TracingContext.get() must be called within an ongoing trace", H100, torch 2.11; the same in
    2.13) and every resumed job traced again. The guard that building it installs is an identity
    guard caching precompile drops anyway."""
    from torch._guards import TracingContext, tracing

    if TracingContext.try_get() is not None:
        return _torch_read_guards()(guards_state)
    with tracing(TracingContext(None)):
        return _torch_read_guards()(guards_state)


def _explain_first_trace(cache: CompileCache) -> Callable[[], None]:
    """Until the returned function is called, dynamo's first trace of the network is explained by
    ``cache.explain_trace`` before it starts. Dynamo calls its frame converter only on a cache miss,
    so a job whose installed entry holds pays nothing."""
    from torch._dynamo import convert_frame

    converter = convert_frame.ConvertFrameAssert
    torch_call = converter.__call__

    def restore() -> None:
        converter.__call__ = torch_call  # type: ignore[method-assign]

    def call(self: Any, frame: Any, *args: Any, **kwargs: Any) -> Any:
        why = cache.explain_trace(frame)
        if why is not None:  # the network's frame: explained once
            restore()
            cache._why_traced = why
        return torch_call(self, frame, *args, **kwargs)

    converter.__call__ = call  # type: ignore[method-assign]
    return restore


@functools.cache
def _torch_read_guards() -> Callable[[bytes], Any]:
    """torch's own reader, kept before ``_loading_as_compiled`` puts ``read_guards_state`` in its place."""
    from torch._dynamo import package

    reader: Callable[[bytes], Any] = package.load_guards_state
    return reader


@contextmanager
def _loading_as_compiled(options: dict[str, Any]) -> Iterator[None]:
    """Inductor's config as the compile options set it, and guards read by ``read_guards_state``,
    while ``torch.compile`` installs an entry: torch rebuilds the saved forward/backward with the
    global config (``triton.cudagraphs`` decides whether it replays as CUDA graphs), not with the
    options the entry was compiled with."""
    from torch._dynamo import package

    inductor = {k: v for k, v in options.items() if k != "guard_filter_fn"}
    torch_reader = _torch_read_guards()
    with torch._inductor.config.patch(inductor):
        package.load_guards_state = read_guards_state
        try:
            yield
        finally:
            package.load_guards_state = torch_reader  # type: ignore[assignment]  # torch's own function
