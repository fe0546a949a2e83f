"""Cluster profile files: find, read (every problem named by file and field) and write.

Where profiles come from, first match wins:
  1. a path to a ``.yaml`` file,
  2. ``$DIFFSCALE_CLUSTERS_DIR/NAME.yaml`` (default ``~/.config/diffscale/clusters``),
     which is where ``diffscale cluster discover`` writes,
  3. the profiles bundled in ``diffscale/cluster/profiles/``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from enum import Enum
from importlib import resources
from pathlib import Path
from typing import Any, NoReturn

import yaml

from diffscale.cluster.profiles.types import (
    SAFE_NAME,
    ClusterProfile,
    Fact,
    GpuRequest,
    GpuScope,
    Partition,
    Requirement,
    SchedulerKind,
    SgeSettings,
)
from diffscale.cluster.scripts.timefmt import parse_duration
from diffscale.errors import UserError, closest


def bundled_dir() -> Path:
    return Path(str(resources.files("diffscale.cluster.profiles")))


def user_dir() -> Path:
    env = os.environ.get("DIFFSCALE_CLUSTERS_DIR")
    return Path(env) if env else Path.home() / ".config" / "diffscale" / "clusters"


def available() -> dict[str, Path]:
    """Profile name -> file, user profiles shadowing bundled ones of the same name."""
    found: dict[str, Path] = {}
    for directory in (bundled_dir(), user_dir()):
        if directory.is_dir():
            for path in sorted(directory.glob("*.yaml")):
                found[path.stem] = path
    return found


def load_profile(name_or_path: str) -> ClusterProfile:
    """Load a profile by name or path; every problem is a UserError naming file and field."""
    path = Path(name_or_path).expanduser()
    if name_or_path.endswith((".yaml", ".yml")) or os.sep in name_or_path:
        if not path.is_file():
            raise UserError(f"cluster profile file '{name_or_path}' does not exist",
                            "pass a bundled name (`diffscale cluster list`) or the path of a profile YAML")
    else:
        profiles = available()
        if name_or_path not in profiles:
            raise UserError(
                f"unknown cluster '{name_or_path}'{closest(name_or_path, profiles)}",
                f"use one of: {', '.join(profiles) or '(none)'}, a profile YAML path, "
                "or write one with `diffscale cluster discover`",
            )
        path = profiles[name_or_path]
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise UserError(f"cluster profile '{path}' is not valid YAML ({str(exc).splitlines()[0]})",
                        "fix the YAML syntax") from exc
    return profile_from_dict(data, source=str(path))


_TOP_KEYS = ("name", "title", "scheduler", "docs", "account", "default_partition", "setup", "env",
             "sets_cuda_visible_devices", "partitions", "sge", "required", "max_array_size")
_PART_KEYS = ("submit_name", "gpus_per_node", "gpu_type", "gpu_memory_gb", "cpus_per_node", "mem_per_node_gb",
              "max_time", "default_time", "max_nodes", "interconnect", "gpu_request", "gres_type", "qos", "constraint",
              "resources", "note", "charge_per_gpu_hour")
_SGE_KEYS = ("pe_single_host", "pe_multi_host", "gpu_resource", "gpu_scope", "notify", "export_env")


class _Reader:
    """Typed field access with messages that name the profile file and the field."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str, problem: str, fix: str) -> NoReturn:
        raise UserError(f"cluster profile {self.source}: {where} {problem}", fix)

    def keys(self, where: str, data: Any, allowed: tuple[str, ...]) -> Mapping[str, Any]:
        if data is None:
            return {}
        if not isinstance(data, Mapping):
            self.fail(where, f"must be a mapping, got {data!r}", f"write {where}: followed by indented fields")
        for key in data:
            if key not in allowed:
                self.fail(f"{where}.{key}" if where else str(key), f"is not a known field{closest(str(key), allowed)}",
                          f"valid fields: {', '.join(allowed)}")
        return data

    def opt_int(self, where: str, value: Any, *, minimum: int = 0) -> int | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            self.fail(where, f"must be a whole number >= {minimum} or null (unknown), got {value!r}",
                      f"write e.g. {where.rsplit('.', 1)[-1]}: 4, or null when the site does not document it")
        return value

    def opt_float(self, where: str, value: Any) -> float | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            self.fail(where, f"must be a positive number or null (unknown), got {value!r}", "write e.g. 80 (GB)")
        return float(value)

    def opt_str(self, where: str, value: Any, *, safe: bool = False) -> str | None:
        if value is None:
            return None
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            self.fail(where, f"must be text or null, got {value!r}", f"write {where.rsplit('.', 1)[-1]}: some-text")
        text = str(value)
        if safe and not SAFE_NAME.match(text):
            self.fail(where, f"'{text}' has characters a scheduler option cannot carry",
                      "use letters, digits and _ . + : = / @ , - only")
        return text

    def str_list(self, where: str, value: Any) -> tuple[str, ...]:
        if value is None:
            return ()
        if isinstance(value, str) or not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.fail(where, f"must be a list of strings, got {value!r}", f"write {where}: followed by '- line' items")
        return tuple(value)

    def str_map(self, where: str, value: Any, *, safe_values: bool = False) -> tuple[tuple[str, str], ...]:
        if value is None:
            return ()
        if not isinstance(value, Mapping):
            self.fail(where, f"must be a mapping of NAME: value, got {value!r}",
                      f"write {where}: then NAME: value lines")
        out = []
        for key, val in value.items():
            if not isinstance(key, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                self.fail(f"{where}.{key}", "is not a valid name",
                          "use letters, digits and _ (not starting with a digit)")
            if val is None or isinstance(val, (list, dict)):
                self.fail(f"{where}.{key}", f"must be a single value, got {val!r}", "quote the value as a string")
            text = str(val).lower() if isinstance(val, bool) else str(val)
            if safe_values and not SAFE_NAME.match(text):
                self.fail(f"{where}.{key}", f"value '{text}' has characters a scheduler option cannot carry",
                          "use letters, digits and _ . + : = / @ , - only")
            out.append((key, text))
        return tuple(out)

    def enum(self, where: str, value: Any, kind: type[Enum], default: Enum | None) -> Any:
        if value is None:
            return default
        choices = [m.value for m in kind]
        if str(value) not in choices:
            self.fail(where, f"'{value}' is not one of {', '.join(choices)}{closest(str(value), choices)}",
                      f"use one of: {', '.join(choices)}")
        return kind(str(value))

    def duration(self, where: str, value: Any) -> int | None:
        try:
            return parse_duration(value, what=where)
        except UserError:
            self.fail(where, f"'{value}' is not a wall time",
                      "write it quoted, e.g. max_time: \"48:00:00\" or \"2-00:00:00\"")


def profile_from_dict(data: Any, *, source: str = "<dict>") -> ClusterProfile:
    r = _Reader(source)
    top = r.keys("", data, _TOP_KEYS)
    name = r.opt_str("name", top.get("name"))
    if not name:
        r.fail("name", "is missing", "add name: my-cluster at the top")
    scheduler = r.enum("scheduler", top.get("scheduler"), SchedulerKind, None)
    if scheduler is None:
        r.fail("scheduler", "is missing", "add scheduler: slurm (or sge)")
    raw_parts = top.get("partitions")
    if not isinstance(raw_parts, Mapping) or not raw_parts:
        r.fail("partitions", "must map at least one partition name to its facts",
               "add partitions: then NAME: with gpus_per_node, cpus_per_node, ... (null when unknown)")
    partitions = [_partition_from_dict(r, pname, praw) for pname, praw in raw_parts.items()]
    names = [p.name for p in partitions]
    default = r.opt_str("default_partition", top.get("default_partition"))
    if default is not None and default not in names:
        r.fail("default_partition", f"'{default}' is not one of the partitions{closest(default, names)}",
               f"use one of: {', '.join(names)}")
    sge = _sge_from_dict(r, top.get("sge")) if scheduler is SchedulerKind.SGE else None
    if scheduler is not SchedulerKind.SGE and top.get("sge") is not None:
        r.fail("sge", "is only for scheduler: sge", "remove the sge: section or set scheduler: sge")
    cvd = top.get("sets_cuda_visible_devices")
    if cvd is not None and not isinstance(cvd, bool):
        r.fail("sets_cuda_visible_devices", f"must be true, false or null, got {cvd!r}", "write true or false")
    env = r.str_map("env", top.get("env"))
    _check_selectable(r, scheduler, partitions)
    return ClusterProfile(
        name=name,
        title=r.opt_str("title", top.get("title")) or name,
        scheduler=scheduler,
        docs=r.str_list("docs", top.get("docs")),
        account=r.opt_str("account", top.get("account"), safe=True),
        default_partition=default,
        setup=r.str_list("setup", top.get("setup")),
        env=env,
        sets_cuda_visible_devices=cvd,
        partitions=tuple(partitions),
        sge=sge,
        required=_required_from(r, top.get("required")),
        max_array_size=r.opt_int("max_array_size", top.get("max_array_size"), minimum=1),
        source=source,
    )


def _required_from(r: _Reader, raw: Any) -> tuple[Requirement, ...]:
    """``required: [account]`` or ``required: {account: "how to find yours"}``."""
    if raw is None:
        return ()
    if isinstance(raw, Mapping):
        items = list(raw.items())
    elif isinstance(raw, list):
        items = [(name, None) for name in raw]
    else:
        r.fail("required", f"must be a list of facts or a mapping fact: how-to-find-it, got {raw!r}",
               "write e.g. required: {account: \"`slist` lists your accounts\"}")
    found = []
    for name, how in items:
        fact = r.enum(f"required.{name}", str(name), Fact, None)
        found.append(Requirement(fact, r.opt_str(f"required.{name}", how)))
    return tuple(found)


def _check_selectable(r: _Reader, scheduler: SchedulerKind, partitions: list[Partition]) -> None:
    """With several partitions, each must put something into the script that picks it: a job
    for one that does not could land on any partition's nodes (an H200 plan on an L40S)."""
    if len(partitions) < 2:
        return
    seen: dict[tuple[str, ...], str] = {}
    for part in partitions:
        chosen_by = part.selectors(scheduler)
        slurm = scheduler is SchedulerKind.SLURM
        what = "submit_name, constraint or gres_type" if slurm else "submit_name or resources"
        if not chosen_by:
            r.fail(f"partitions.{part.name}", f"sets none of {what}, so a job script could not tell it from "
                   "the other partitions", f"set {what} to what the site's documentation says selects it")
        if chosen_by in seen:
            r.fail(f"partitions.{part.name}", f"is selected exactly like partitions.{seen[chosen_by]} "
                   f"({', '.join(chosen_by)})", f"give each partition its own {what}")
        seen[chosen_by] = part.name


def _partition_from_dict(r: _Reader, pname: Any, praw: Any) -> Partition:
    where = f"partitions.{pname}"
    if not isinstance(pname, str) or not SAFE_NAME.match(pname):
        r.fail(where, "is not a usable partition name", "use letters, digits and _ . - only")
    p = r.keys(where, praw, _PART_KEYS)
    submit = p["submit_name"] if "submit_name" in p else pname
    return Partition(
        name=pname,
        submit_name=r.opt_str(f"{where}.submit_name", submit, safe=True),
        gpus_per_node=r.opt_int(f"{where}.gpus_per_node", p.get("gpus_per_node")),
        gpu_type=r.opt_str(f"{where}.gpu_type", p.get("gpu_type")),
        gpu_memory_gb=r.opt_float(f"{where}.gpu_memory_gb", p.get("gpu_memory_gb")),
        cpus_per_node=r.opt_int(f"{where}.cpus_per_node", p.get("cpus_per_node"), minimum=1),
        mem_per_node_gb=r.opt_float(f"{where}.mem_per_node_gb", p.get("mem_per_node_gb")),
        max_time_s=r.duration(f"{where}.max_time", p.get("max_time")),
        default_time=r.opt_str(f"{where}.default_time", p.get("default_time"), safe=True),
        max_nodes=r.opt_int(f"{where}.max_nodes", p.get("max_nodes"), minimum=1),
        interconnect=r.opt_str(f"{where}.interconnect", p.get("interconnect")),
        gpu_request=r.enum(f"{where}.gpu_request", p.get("gpu_request"), GpuRequest, GpuRequest.GPUS_PER_NODE),
        gres_type=r.opt_str(f"{where}.gres_type", p.get("gres_type"), safe=True),
        qos=r.opt_str(f"{where}.qos", p.get("qos"), safe=True),
        constraint=r.opt_str(f"{where}.constraint", p.get("constraint"), safe=True),
        resources=r.str_map(f"{where}.resources", p.get("resources"), safe_values=True),
        note=r.opt_str(f"{where}.note", p.get("note")),
        charge_per_gpu_hour=r.opt_float(f"{where}.charge_per_gpu_hour", p.get("charge_per_gpu_hour")),
    )


def _sge_from_dict(r: _Reader, raw: Any) -> SgeSettings:
    s = r.keys("sge", raw, _SGE_KEYS)
    sge = SgeSettings(
        pe_single_host=r.opt_str("sge.pe_single_host", s.get("pe_single_host"), safe=True),
        pe_multi_host=r.opt_str("sge.pe_multi_host", s.get("pe_multi_host"), safe=True),
        gpu_resource=r.opt_str("sge.gpu_resource", s.get("gpu_resource"), safe=True) or "gpus",
        gpu_scope=r.enum("sge.gpu_scope", s.get("gpu_scope"), GpuScope, GpuScope.JOB),
        notify_s=r.duration("sge.notify", s.get("notify")),
        export_env=bool(s.get("export_env", False)),
    )
    if sge.pe_single_host is None and sge.pe_multi_host is None:
        r.fail("sge", "names no parallel environment",
               "set sge.pe_single_host (e.g. smp or omp) and/or sge.pe_multi_host")
    return sge


# ----------------------------------------------------------------------------- writing

def profile_to_dict(profile: ClusterProfile) -> dict[str, Any]:
    """Plain data that :func:`profile_from_dict` reads back to an equal profile."""
    from diffscale.cluster.scripts.timefmt import hms

    parts: dict[str, Any] = {}
    for p in profile.partitions:
        entry: dict[str, Any] = {}
        if p.submit_name != p.name:
            entry["submit_name"] = p.submit_name
        entry.update({
            "gpus_per_node": p.gpus_per_node,
            "gpu_type": p.gpu_type,
            "gpu_memory_gb": p.gpu_memory_gb,
            "cpus_per_node": p.cpus_per_node,
            "mem_per_node_gb": p.mem_per_node_gb,
            "max_time": hms(p.max_time_s) if p.max_time_s is not None else None,
            "default_time": p.default_time,
            "max_nodes": p.max_nodes,
            "interconnect": p.interconnect,
            "gpu_request": p.gpu_request.value,
            "gres_type": p.gres_type,
            "qos": p.qos,
            "constraint": p.constraint,
            "resources": dict(p.resources),
        })
        if p.note:
            entry["note"] = p.note
        if p.charge_per_gpu_hour is not None:
            entry["charge_per_gpu_hour"] = p.charge_per_gpu_hour
        parts[p.name] = entry
    data: dict[str, Any] = {
        "name": profile.name,
        "title": profile.title,
        "scheduler": profile.scheduler.value,
        "docs": list(profile.docs),
        "account": profile.account,
        "default_partition": profile.default_partition,
        "setup": list(profile.setup),
        "env": dict(profile.env),
        "sets_cuda_visible_devices": profile.sets_cuda_visible_devices,
        "partitions": parts,
    }
    if profile.max_array_size is not None:
        data["max_array_size"] = profile.max_array_size
    if profile.required:
        data["required"] = {req.fact.value: req.how for req in profile.required}
    if profile.sge is not None:
        s = profile.sge
        data["sge"] = {
            "pe_single_host": s.pe_single_host,
            "pe_multi_host": s.pe_multi_host,
            "gpu_resource": s.gpu_resource,
            "gpu_scope": s.gpu_scope.value,
            "notify": hms(s.notify_s) if s.notify_s is not None else None,
            "export_env": s.export_env,
        }
    return data


def dump_profile(profile: ClusterProfile) -> str:
    return yaml.safe_dump(profile_to_dict(profile), sort_keys=False)
