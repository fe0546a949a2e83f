"""Typed run configuration.

A run is described by one :class:`RunConfig` made of small keyword-only dataclasses
(``schema``). Configs come from a preset, then a YAML file, then ``--set
section.field=value`` overrides (``loading``), in one order for every verb
(``resolve``), and the resolved config is written to ``RUN_DIR/config.yaml`` by every run.
"""

from diffscale.config.choices import (
    Attention,
    BetaSchedule,
    CompileMode,
    Device,
    LossWeighting,
    LrScaling,
    LrSchedule,
    Precision,
    Prediction,
    Recipe,
    SamplerName,
    TimestepSpacing,
    Toggle,
)
from diffscale.config.loading import deep_merge, from_dict, load_yaml, merge, parse_overrides, write_yaml
from diffscale.config.models import MODEL_CONFIGS, FieldModelConfig, ModelConfig, PolicyModelConfig, TaskModelConfig
from diffscale.config.resolve import ConfigSources, resolve_config
from diffscale.config.runtime import RuntimeConfig
from diffscale.config.schema import DataConfig, DiffusionConfig, OptimConfig, RunConfig, TrainConfig
from diffscale.config.trackers import LoggingConfig, WandbMode

__all__ = [
    "MODEL_CONFIGS", "FieldModelConfig", "PolicyModelConfig", "TaskModelConfig", "Attention", "BetaSchedule",
    "CompileMode", "DataConfig", "Device", "DiffusionConfig", "LossWeighting", "LrScaling",
    "LrSchedule", "ModelConfig", "OptimConfig", "Precision", "Prediction", "Recipe", "RunConfig", "RuntimeConfig",
    "SamplerName", "TimestepSpacing", "Toggle", "TrainConfig", "LoggingConfig", "WandbMode",
    "ConfigSources", "resolve_config", "deep_merge", "from_dict", "load_yaml", "merge",
    "parse_overrides", "write_yaml",
]
