"""The one way a run's config is built, for every verb (train, plan/submit, bench):

    preset -> YAML file -> flags (--data, --device, --precision, --recipe) -> --set overrides -> fixed

Later sources win. The preset is ``--preset``, else the YAML file's ``preset:``, else ``tiny``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from diffscale.config.loading import load_yaml, merge, parse_overrides
from diffscale.config.presets import get_preset
from diffscale.config.schema import RunConfig
from diffscale.errors import UserError


@dataclass(kw_only=True)
class ConfigSources:
    """Where a run's settings come from, as a verb's flags name them."""

    preset: str | None = None
    """``--preset NAME``."""
    config_file: str | Path | None = None
    """A YAML config (e.g. a RUN_DIR/config.yaml)."""
    data: str | None = None
    """``--data SPEC`` -> ``data.source``."""
    device: str | None = None
    """``--device`` -> ``runtime.device``."""
    precision: str | None = None
    """``--precision`` -> ``runtime.precision``."""
    recipe: str | None = None
    """``--recipe`` -> ``runtime.recipe``."""
    overrides: Sequence[str] = ()
    """``--set section.field=value`` pairs."""
    fixed: Mapping[str, Any] = field(default_factory=dict)
    """Values the verb itself sets last (a benchmark's step count, say)."""


def resolve_config(sources: ConfigSources) -> RunConfig:
    """The validated ``RunConfig`` of ``sources`` (see the module docstring for the order)."""

    data = load_yaml(sources.config_file) if sources.config_file else {}
    preset = sources.preset or str(data.get("preset") or "tiny")
    cfg = get_preset(preset)
    flags: dict[str, Any] = {}
    if sources.data:
        flags["data"] = {"source": sources.data}
    runtime = {k: v for k, v in (("device", sources.device), ("precision", sources.precision),
                                 ("recipe", sources.recipe)) if v}
    if runtime:
        flags["runtime"] = runtime
    base = cfg
    for layer in (data, flags, parse_overrides(list(sources.overrides)), sources.fixed):
        if layer:
            cfg = merge(cfg, layer)
    if sources.preset:
        cfg.preset = sources.preset
    _refuse_image_options(cfg, base)
    return cfg


IMAGE_ONLY = {"shift_px": 0, "hflip": False}
"""``data`` options only the images task reads, each with its off value."""


def _refuse_image_options(cfg: RunConfig, base: RunConfig) -> None:
    """An image augmentation turned on over the preset in a run of another task would do nothing:
    refused, naming it. A value the preset itself has (an images preset switched to another task)
    is left alone, so such a run's own config.yaml still resumes."""
    if cfg.task == "images":
        return
    for name, off in IMAGE_ONLY.items():
        value = getattr(cfg.data, name)
        if value != off and value != getattr(base.data, name):
            raise UserError(f"config data.{name}: {str(value).lower()} is an image augmentation (task images "
                            f"only); this run's task is {cfg.task}, where it would do nothing",
                            f"drop data.{name} from --set or the config file, or set it to {str(off).lower()}")


__all__ = ["ConfigSources", "resolve_config"]
