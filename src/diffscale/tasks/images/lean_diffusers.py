"""diffusers' ``UNet2DModel`` without the 60 transformer models and scipy it drags in.

Importing ``diffusers.models.unets.unet_2d`` runs the ``__init__`` of its parent packages, and
those of ``diffusers.models.unets`` and ``diffusers.models.transformers`` (diffusers 0.42) import
every UNet and every transformer model eagerly; one of those loads ``diffusers.loaders``'
single-file code, which imports most schedulers and with them ``scipy.stats``. None of that is
used to train or sample a ``UNet2DModel``, yet it was a noticeable part of each start (hundreds of
modules; more on a machine whose installation has no cached bytecode; docs/decisions.md,
"diffusers' UNet2DModel imported alone"). Likewise ``diffusers.quantizers``, which every model's
``modeling_utils`` imports for two classes, imports transformers wherever it is installed (for a
pipeline's quantization config): 1.4 s of a start on an H100 host (docs/measurements/2026-11-28.md).

:func:`defer_package_init` puts such a package into ``sys.modules`` with its ``__init__`` not run
yet: its submodules import as usual (``unet_2d`` and the two transformer modules its blocks
use), a name listed in ``DEFERRED`` comes from its own submodule, and the first lookup of any
other name on the package runs the real ``__init__``, so ``from diffusers.models.unets import
UNet2DConditionModel`` or ``from diffusers.quantizers import PipelineQuantizationConfig`` in the
same process still works.
"""

from __future__ import annotations

import importlib.util
import sys
import types

DEFERRED: dict[str, dict[str, str]] = {
    "diffusers.models.unets": {},
    "diffusers.models.transformers": {},
    "diffusers.quantizers": {"DiffusersAutoQuantizer": "auto", "DiffusersQuantizer": "base"},
}
"""Packages whose ``__init__`` waits until a name on them is looked up, with the names that come
from one submodule of theirs without it (diffusers 0.42's layout; elsewhere the ``__init__`` runs)."""


class _DeferredPackage(types.ModuleType):
    """A package module whose ``__init__`` has not run: the first lookup of a name it lacks
    (that is not one of its submodules, which the import system loads on its own) runs it."""

    def __getattr__(self, name: str) -> object:
        if name.startswith("__"):
            raise AttributeError(name)
        spec = self.__spec__
        if spec is None or spec.loader is None:  # pragma: no cover - set by defer_package_init
            raise AttributeError(name)
        if importlib.util.find_spec(f"{self.__name__}.{name}") is not None:
            # `from package import submodule`: the import system loads it after this AttributeError
            raise AttributeError(name)
        submodule = DEFERRED.get(self.__name__, {}).get(name)
        if submodule is not None:
            try:
                value = getattr(importlib.import_module(f"{self.__name__}.{submodule}"), name)
            except (ImportError, AttributeError):  # another layout: the package's own __init__ knows
                pass
            else:
                object.__setattr__(self, name, value)
                return value
        object.__setattr__(self, "__class__", types.ModuleType)  # from now on an ordinary package
        spec.loader.exec_module(self)
        return getattr(self, name)


def defer_package_init(name: str) -> bool:
    """Register package ``name`` with its ``__init__`` deferred; False (and nothing changed) when
    it is already imported or cannot be found, so an installation laid out otherwise imports as usual."""
    if name in sys.modules:
        return False
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return False
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        return False
    module = importlib.util.module_from_spec(spec)
    module.__class__ = _DeferredPackage
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent in sys.modules and not isinstance(sys.modules[parent], _DeferredPackage):
        # what the import system does once a package has loaded; diffusers' lazy modules accept it
        setattr(sys.modules[parent], child, module)
    return True


for _name in DEFERRED:
    defer_package_init(_name)

from diffusers.models.unets.unet_2d import UNet2DModel  # noqa: E402  (after the deferral, on purpose)

__all__ = ["UNet2DModel", "defer_package_init"]
