"""Atomic, verifiable, device-agnostic checkpoints. Loading never unpickles anything.

Layout of one checkpoint, ``RUN_DIR/checkpoints/step_00001200/``:

* ``model.safetensors`` / ``ema.safetensors`` -- network weights (fp32, CPU)
* ``optimizer.safetensors`` -- optimizer state tensors, keyed ``state.<param index>.<name>``
* ``rng.safetensors`` -- RNG states of every generator (torch CPU, CUDA) as uint8 tensors
* ``task.safetensors`` -- the task's state beyond the weights (normalisation statistics, a
  replay buffer); format 2 on, empty for tasks without one
* ``state.json`` -- ``CheckpointMeta`` (step, data position, scaler, config, model signature,
  counters) and the optimizer's hyper-parameters
* ``manifest.json`` -- SHA-256 and size of every file above; written last

A checkpoint is written into a temporary folder and renamed into place, so a process
killed at any instant leaves either the complete new checkpoint or none; the manifest
is verified on load and a damaged checkpoint is skipped for the previous one.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from diffscale.errors import UserError
from diffscale.io.paths import give_default_modes
from diffscale.runtime.runlock import process_alive

CHECKPOINT_DIR = "checkpoints"
_NAME = re.compile(r"^step_(\d{8})$")
FORMAT_VERSION = 2
"""2: adds task.safetensors. Format 1 checkpoints (no task state) still load."""
READABLE_VERSIONS = (1, 2)


class CorruptCheckpoint(Exception):
    """A checkpoint failed verification (missing file, checksum mismatch, unreadable)."""


@dataclass(kw_only=True)
class CheckpointMeta:
    """The JSON part of a checkpoint (``state.json``), besides the step and optimizer groups."""

    version: int = FORMAT_VERSION
    """Checkpoint format that wrote it (``FORMAT_VERSION``)."""
    config: dict[str, Any] = field(default_factory=dict)
    """The run's resolved config (``RunConfig.to_dict()``)."""
    signature: dict[str, Any] = field(default_factory=dict)
    """The task's ``signature()``: what must match for the weights to load."""
    data_position: dict[str, Any] = field(default_factory=dict)
    """Where the data stream stands (``DataPosition.to_dict()``)."""
    scaler: dict[str, Any] | None = None
    """GradScaler state where fp16 training uses one."""
    world_size: int = 1
    """Processes that trained up to this checkpoint."""
    effective_batch: int = 0
    """Examples per optimizer step (kept on resume through gradient accumulation)."""
    lr_backoff: float = 1.0
    """Learning-rate factor after the restores (and rollbacks from non-finite losses) so far."""
    rollbacks: int = 0
    """Restores of an earlier state so far (the divergence guard's, and rollbacks from non-finite losses)."""
    nonfinite_total: int = 0
    """Optimizer steps skipped for non-finite gradients so far."""
    guard: dict[str, Any] = field(default_factory=dict)
    """The divergence guard's statistics (training/guard.py ``GuardState``); empty before it existed."""
    saved_at: float = 0.0
    """Unix time of writing."""

    @classmethod
    def from_json(cls, data: dict[str, Any], where: str) -> CheckpointMeta:
        """Read ``state.json`` of any readable format (format 1 named its version ``format``)."""
        version = int(data.get("version", data.get("format", 1)))
        if version not in READABLE_VERSIONS:
            raise CorruptCheckpoint(f"{where}: format {version} is newer than this diffscale reads "
                                    f"({', '.join(map(str, READABLE_VERSIONS))}); upgrade diffscale")
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known and k != "version"}, version=version)


@dataclass
class TrainingState:
    """Everything needed to continue a run exactly."""

    step: int
    model: dict[str, torch.Tensor]
    ema: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    meta: CheckpointMeta
    rng: dict[str, torch.Tensor]
    task: dict[str, torch.Tensor] = field(default_factory=dict)
    """The task's state tensors (``Task.state_tensors()``)."""


def checkpoint_root(run_dir: Path) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete-looking checkpoints (renamed into place), oldest first."""
    root = checkpoint_root(run_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and _NAME.match(p.name)]
    return sorted(found, key=step_of)


def step_of(path: Path) -> int:
    match = _NAME.match(Path(path).name)
    if not match:
        raise UserError(f"'{path}' is not a checkpoint folder (expected .../checkpoints/step_NNNNNNNN)",
                        "pass --resume auto or a checkpoint folder")
    return int(match.group(1))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _flatten_optimizer(state_dict: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for index, entry in state_dict["state"].items():
        for name, value in entry.items():
            if torch.is_tensor(value):
                tensors[f"state.{index}.{name}"] = value.detach().to("cpu").contiguous()
            else:
                scalars.setdefault(str(index), {})[name] = value
    return tensors, {"param_groups": state_dict["param_groups"], "scalars": scalars}


def _unflatten_optimizer(tensors: dict[str, torch.Tensor], info: dict[str, Any]) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        _, index, name = key.split(".", 2)
        state.setdefault(int(index), {})[name] = value
    for index, entry in info.get("scalars", {}).items():
        state.setdefault(int(index), {}).update(entry)
    return {"state": state, "param_groups": info["param_groups"]}


def _cpu(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}


def _write_files(tmp: Path, state: TrainingState) -> None:
    """Every file of one checkpoint, fsynced, the manifest last."""
    opt_tensors, opt_info = _flatten_optimizer(state.optimizer)
    files = {
        "model.safetensors": _cpu(state.model),
        "ema.safetensors": _cpu(state.ema),
        "optimizer.safetensors": opt_tensors,
        "rng.safetensors": _cpu(state.rng),
        "task.safetensors": _cpu(state.task),
    }
    for name, tensors in files.items():
        save_file(tensors, str(tmp / name))
    meta = dict(asdict(state.meta), version=FORMAT_VERSION, step=state.step, optimizer=opt_info)
    (tmp / "state.json").write_text(json.dumps(meta, indent=1, sort_keys=True))
    manifest = {
        "format": FORMAT_VERSION,
        "step": state.step,
        "files": {p.name: {"sha256": _sha256(p), "bytes": p.stat().st_size} for p in sorted(tmp.iterdir())},
    }
    for path in tmp.iterdir():
        with open(path, "rb+") as fh:
            os.fsync(fh.fileno())
    give_default_modes(tmp)  # lab-mates sharing a run folder can read the weights
    manifest_path = tmp / "manifest.json"
    manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    with open(manifest_path, "rb+") as fh:
        os.fsync(fh.fileno())
    _fsync_dir(tmp)


def _write_failed(exc: Exception, root: Path, name: str) -> UserError:
    """A checkpoint the disk refused (full, quota, permissions): what is left, and how to go on."""
    newest = list_checkpoints(root.parent)
    kept = (f"the newest complete checkpoint, {newest[-1].name}, is intact" if newest
            else "no checkpoint was written yet")
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return UserError(f"could not write checkpoint {name} in '{root}' ({reason}); {kept}",
                     "free space there (df -h) or fix its permissions, then continue with --resume auto")


def save_checkpoint(run_dir: Path, state: TrainingState, *, keep: int) -> Path:
    """Write atomically (temporary folder, fsync, rename), then prune to the newest ``keep``.
    A write the disk refuses removes the partial folder and leaves every earlier checkpoint."""
    root = checkpoint_root(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{state.step:08d}"
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        tmp.mkdir()
        _write_files(tmp, state)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)  # a partial checkpoint only takes the space a retry needs
        if isinstance(exc, (OSError, SafetensorError)):
            raise _write_failed(exc, root, final.name) from exc
        raise
    if final.exists():  # the same step saved again (e.g. after a rollback): replace it
        old = root / f".old-{final.name}-{os.getpid()}"
        final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(final)
    _fsync_dir(root)
    prune(run_dir, keep)
    return final


def prune(run_dir: Path, keep: int) -> None:
    """Keep the newest ``keep`` checkpoints; remove temporaries left by killed writers."""
    checkpoints = list_checkpoints(run_dir)
    for old in checkpoints[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    root = checkpoint_root(run_dir)
    for leftover in root.glob(".tmp-*"):
        pid = leftover.name.rsplit("-", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and not process_alive(int(pid)):
            shutil.rmtree(leftover, ignore_errors=True)


def verify(path: Path) -> dict[str, Any]:
    """Check the manifest against the files; returns the manifest or raises CorruptCheckpoint
    (also for a file the user may not read: it cannot be resumed from either)."""
    try:
        return _verify(path)
    except OSError as exc:
        where = Path(exc.filename).name if exc.filename else "a file"
        raise CorruptCheckpoint(f"{path.name}: {where} is not readable ({exc.strerror})") from exc


def _verify(path: Path) -> dict[str, Any]:
    manifest_path = path / "manifest.json"
    if not manifest_path.is_file():
        raise CorruptCheckpoint(f"{path.name}: manifest.json is missing")
    try:
        manifest = json.loads(manifest_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CorruptCheckpoint(f"{path.name}: manifest.json is unreadable ({exc})") from exc
    for name, entry in manifest.get("files", {}).items():
        file = path / name
        if not file.is_file():
            raise CorruptCheckpoint(f"{path.name}: {name} is missing")
        if file.stat().st_size != entry["bytes"]:
            raise CorruptCheckpoint(f"{path.name}: {name} has {file.stat().st_size} bytes, "
                                    f"expected {entry['bytes']} (truncated?)")
        if _sha256(file) != entry["sha256"]:
            raise CorruptCheckpoint(f"{path.name}: {name} fails its checksum")
    for required in ("model.safetensors", "ema.safetensors", "optimizer.safetensors", "state.json"):
        if required not in manifest.get("files", {}):
            raise CorruptCheckpoint(f"{path.name}: manifest does not list {required}")
    return manifest


def load_checkpoint(path: Path) -> TrainingState:
    """Verify and load one checkpoint onto the CPU (the caller moves tensors to its device)."""
    verify(path)
    try:
        meta = json.loads((path / "state.json").read_text())
        model = load_file(str(path / "model.safetensors"))
        ema = load_file(str(path / "ema.safetensors"))
        opt_tensors = load_file(str(path / "optimizer.safetensors"))
        rng_path = path / "rng.safetensors"
        rng = load_file(str(rng_path)) if rng_path.is_file() else {}
        task_path = path / "task.safetensors"
        task = load_file(str(task_path)) if task_path.is_file() else {}
    except (SafetensorError, OSError, json.JSONDecodeError, ValueError) as exc:
        raise CorruptCheckpoint(f"{path.name}: {exc}") from exc
    _check_meta(meta, f"{path.name}: state.json")
    try:
        optimizer = _unflatten_optimizer(opt_tensors, meta.pop("optimizer"))
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise CorruptCheckpoint(f"{path.name}: the optimizer state does not match its tensors ({exc!r})") from exc
    return TrainingState(step=meta["step"], model=model, ema=ema, optimizer=optimizer,
                         meta=CheckpointMeta.from_json(meta, path.name), rng=rng, task=task)


_META_TYPES: dict[str, tuple[type, ...]] = {
    "config": (dict,), "signature": (dict,), "data_position": (dict,), "scaler": (dict, type(None)),
    "world_size": (int,), "effective_batch": (int,), "lr_backoff": (int, float), "rollbacks": (int,),
    "nonfinite_total": (int,), "saved_at": (int, float), "version": (int,), "format": (int,),
}
"""The type of each ``state.json`` field a checkpoint may hold (``step`` and ``optimizer`` must)."""


def _check_meta(meta: object, where: str) -> None:
    """A ``state.json`` that passes its checksum yet holds wrong content (an edit, a writer's bug)
    is as damaged as a truncated one: CorruptCheckpoint naming the field."""
    if not isinstance(meta, dict):
        raise CorruptCheckpoint(f"{where} holds {type(meta).__name__}, not an object")
    for key in ("step", "optimizer"):
        if key not in meta:
            raise CorruptCheckpoint(f"{where} has no '{key}'")
    step = meta["step"]
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise CorruptCheckpoint(f"{where}: step {step!r} is not a whole number of at least 0")
    if not isinstance(meta["optimizer"], dict):
        raise CorruptCheckpoint(f"{where}: optimizer is {type(meta['optimizer']).__name__}, not an object")
    for key, types in _META_TYPES.items():
        value = meta.get(key)
        if key in meta and (isinstance(value, bool) or not isinstance(value, types)):
            raise CorruptCheckpoint(f"{where}: {key} {value!r} is not of type "
                                    f"{' or '.join(t.__name__ for t in types)}")


def load_latest(run_dir: Path, *, log: Callable[[str], None] = print) -> TrainingState | None:
    """Newest checkpoint that verifies; damaged or unreadable ones are skipped with a warning.
    None when the run has no checkpoint; a UserError naming each one when none is usable."""
    damaged = []
    for path in reversed(list_checkpoints(run_dir)):
        try:
            return load_checkpoint(path)
        except CorruptCheckpoint as exc:
            damaged.append(str(exc))
            log(f"warning: checkpoint {exc}; falling back to the previous one")
    if damaged:
        raise UserError(f"every checkpoint in '{checkpoint_root(run_dir)}' is damaged or unreadable: "
                        f"{'; '.join(damaged)}",
                        "restore one from a backup (or make it readable), or start a new run with another --out")
    return None


def load_resume(run_dir: Path, resume: str, *, log: Callable[[str], None] = print) -> TrainingState | None:
    """``auto``: newest good checkpoint (None when the run dir has none); else a checkpoint path."""
    if resume == "auto":
        return load_latest(run_dir, log=log)
    path = Path(resume)
    if not path.is_dir():
        raise UserError(f"checkpoint '{resume}' does not exist",
                        "pass --resume auto or an existing checkpoints/step_NNNNNNNN folder")
    step_of(path)
    try:
        return load_checkpoint(path)
    except CorruptCheckpoint as exc:
        raise UserError(f"checkpoint {exc}",
                        "resume from an older checkpoint, or use --resume auto to pick the newest good one") from exc

