"""A trained run loaded back for sampling, export and evaluation: its resolved config, the
task built without data (sizes from the checkpoint's signature, state from its task tensors)
and the EMA network on the chosen device."""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from diffscale import config as C
from diffscale.errors import UserError
from diffscale.runtime import checkpoint as ckpt
from diffscale.runtime.device import pick_device
from diffscale.tasks.base import Task
from diffscale.tasks.registry import build_task


@dataclass
class TrainedRun:
    run_dir: Path
    cfg: C.RunConfig
    task: Task
    network: torch.nn.Module
    """The EMA weights, in eval mode, on ``device``."""
    step: int
    device: torch.device


def load_trained(run_dir: Path, device_name: str | None = None, *, step: int | None = None,
                 eval_features: str | None = None) -> TrainedRun:
    """The newest good checkpoint of ``run_dir`` (damaged ones are skipped with a warning), or the
    one of ``step``; ``eval_features`` replaces the run's ``train.eval_features``."""
    run_dir = Path(run_dir)
    cfg_path = run_dir / "config.yaml"
    if not cfg_path.is_file():
        raise UserError(f"'{run_dir}' is not a diffscale run (no config.yaml)",
                        "pass the RUN_DIR that `diffscale train --out` wrote")
    cfg = C.from_dict(C.load_yaml(cfg_path))
    if eval_features is not None:
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, eval_features=eval_features))
    state = ckpt.load_latest(run_dir, log=lambda m: print(m, file=sys.stderr)) if step is None else _at(run_dir, step)
    if state is None:
        raise UserError(f"'{run_dir}' has no usable checkpoint", "train first (diffscale train --out RUN_DIR)")
    device = pick_device(C.Device(device_name) if device_name else cfg.runtime.device)
    task = build_task(cfg, device, load_data=False, signature=state.meta.signature)
    task.load_state_tensors(state.task)
    network = task.build_network()
    network.load_state_dict(state.ema)
    return TrainedRun(run_dir, cfg, task, network.to(device).eval(), state.step, device)


def _at(run_dir: Path, step: int) -> ckpt.TrainingState:
    """The checkpoint of ``step``, or one line naming the steps there are."""
    found = {ckpt.step_of(p): p for p in ckpt.list_checkpoints(run_dir)}
    if step not in found:
        have = ", ".join(str(s) for s in sorted(found)) or "none"
        raise UserError(f"'{run_dir}' has no checkpoint of step {step} (checkpoints: {have})",
                        "pass one of those steps to --checkpoint, or leave it out for the newest")
    return ckpt.load_checkpoint(found[step])
