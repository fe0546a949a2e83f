"""Configs from plain data: YAML files, ``--set section.field=value`` overrides and merges
onto a preset, each value coerced to its field's type with an error that names the field."""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from diffscale.config.choices import Toggle
from diffscale.config.errors import fail as _fail
from diffscale.config.models import MODEL_CONFIGS
from diffscale.config.schema import RunConfig
from diffscale.errors import UserError, closest
from diffscale.io.atomic import write_text


@functools.cache
def _field_types(cls: type) -> dict[str, Any]:
    # evaluating the annotations was most of a config's build (a sweep builds one per element)
    return typing.get_type_hints(cls)


def _coerce(name: str, annotation: Any, value: Any) -> Any:
    """Convert a YAML value to the field's type, or raise a UserError naming the field."""
    origin = typing.get_origin(annotation)
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        if not isinstance(value, Mapping):
            _fail(name, f"expected a mapping of fields, got {value!r}", f"write {name}: followed by indented fields")
        return _build(annotation, value, name)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        choices = [m.value for m in annotation]
        if isinstance(value, annotation):
            return value
        if isinstance(value, bool) and annotation is Toggle:
            return Toggle.ON if value else Toggle.OFF  # YAML reads on/off/yes/no as booleans
        if str(value) not in choices:
            _fail(name, f"'{value}' is not one of {', '.join(choices)}{closest(str(value), choices)}",
                  f"set {name} to one of: {', '.join(choices)}")
        return annotation(str(value))
    if origin is tuple:
        inner = typing.get_args(annotation)[0]
        if isinstance(value, str):
            value = (yaml.safe_load(value) if value.strip().startswith("[")
                     else [v for v in value.split(",") if v.strip()])
        if not isinstance(value, (list, tuple)):
            _fail(name, f"expected a list, got {value!r}", f"write {name}=[a, b, c]")
        return tuple(_coerce(name, inner, v) for v in value)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if value is None:
            return None
        return _coerce(name, args[0], value)
    if annotation is bool:
        if isinstance(value, bool):
            return value
        if str(value).lower() in ("true", "yes", "on", "1"):
            return True
        if str(value).lower() in ("false", "no", "off", "0"):
            return False
        _fail(name, f"expected true or false, got {value!r}", f"set {name} to true or false")
    if annotation is int:
        if isinstance(value, bool) or not (
            isinstance(value, int)
            or (isinstance(value, float) and value.is_integer())
            or (isinstance(value, str) and value.strip().lstrip("-").replace("_", "").isdigit())
        ):
            _fail(name, f"expected a whole number, got {value!r}", f"set {name} to an integer")
        return int(value)
    if annotation is float:
        try:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        except (TypeError, ValueError):
            _fail(name, f"expected a number, got {value!r}", f"set {name} to a number such as 0.001")
    if annotation is str:
        if not isinstance(value, (str, int, float)):
            _fail(name, f"expected text, got {value!r}", f"set {name} to a string")
        return str(value)
    return value


def _build(cls: type, data: Mapping[str, Any], prefix: str = "") -> Any:
    hints = _field_types(cls)
    if cls is RunConfig:  # the model section's class follows the task
        hints["model"] = _model_config_class(data.get("task", "images"))
        if "model" not in data:
            data = {**data, "model": {}}
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        full = f"{prefix}.{key}" if prefix else str(key)
        if key not in names:
            raise UserError(
                f"unknown config key '{full}'{closest(str(key), names)}",
                f"valid keys{' in ' + prefix if prefix else ''}: {', '.join(names)}",
            )
        kwargs[key] = _coerce(full, hints[key], value)
    try:
        return cls(**kwargs)
    except TypeError as exc:  # pragma: no cover - dataclass signature mismatch is a bug
        raise UserError(f"config {prefix or 'root'}: {exc}",
                        "check the config file against `diffscale train --dry-run`") from exc


def _model_config_class(task: Any) -> type:
    if task not in MODEL_CONFIGS:
        choices = list(MODEL_CONFIGS)
        _fail("task", f"'{task}' is not one of {', '.join(choices)}{closest(str(task), choices)}",
              f"set task to one of: {', '.join(choices)}")
    return MODEL_CONFIGS[task]


def from_dict(data: Mapping[str, Any]) -> RunConfig:
    """Build and validate a RunConfig from plain data (e.g. parsed YAML)."""
    return _build(RunConfig, data)


def merge(base: RunConfig, data: Mapping[str, Any]) -> RunConfig:
    """Overlay a (possibly partial) mapping on ``base`` and re-validate."""
    plain = base.to_dict()
    if "task" in data and data["task"] != plain["task"]:
        plain.pop("model")  # another task's network: start from its defaults, not the base's fields
    return from_dict(deep_merge(plain, data))


def deep_merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """``["train.steps=10", "model.attention=[false,true]"]`` -> nested dict (values parsed as YAML)."""
    nested: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise UserError(f"override '{pair}' has no '='",
                            "write --set section.field=value, e.g. --set train.steps=100")
        key, raw = pair.split("=", 1)
        parts = [p for p in key.strip().split(".") if p]
        if not parts:
            raise UserError(f"override '{pair}' has an empty key", "write --set section.field=value")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        cursor = nested
        for part in parts[:-1]:
            cursor = cursor.setdefault(part, {})
            if not isinstance(cursor, dict):
                raise UserError(f"override '{pair}' conflicts with another --set", "set each field once")
        cursor[parts[-1]] = value
    return nested


def load_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"config file '{path}' does not exist", "pass the path of a YAML config, or use --preset NAME")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise UserError(f"config file '{path}' is not UTF-8 text (byte {exc.start} is {exc.object[exc.start]:#04x}; "
                        "a UTF-16 file, as some Windows editors save, starts with 0xff 0xfe)",
                        "save it as UTF-8 (e.g. iconv -f UTF-16 -t UTF-8 FILE > NEW.yaml)") from exc
    except yaml.YAMLError as exc:
        raise UserError(f"config file '{path}' is not valid YAML ({str(exc).splitlines()[0]})",
                        "fix the YAML syntax") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"config file '{path}' does not hold a mapping",
                        "write section: followed by fields, as in RUN_DIR/config.yaml")
    return data


def write_yaml(cfg: RunConfig, path: str | Path) -> None:
    write_text(path, cfg.to_yaml())
