"""Starting or resuming a run in its directory: the run dir's lock, the checkpoint ``--resume``
names, the checks that it fits this config (network, preset, world size) and ``config.yaml``."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diffscale.config import RunConfig, write_yaml
from diffscale.errors import UserError
from diffscale.io.rundir import read_config
from diffscale.runtime import checkpoint as ckpt
from diffscale.runtime.distributed import DistContext
from diffscale.runtime.runlock import RunLock
from diffscale.training.state import RunState

Say = Callable[[str], None]


@dataclass
class RunDirLock:
    """Rank 0's run-dir lock (None on the other ranks), whether to take a foreign host's, and what
    to do once the run passed its checks and starts writing there (open its console log: an
    invocation refused before changes nothing in the run dir, its log included)."""

    lock: RunLock | None
    force: bool
    on_writing: Callable[[], None] | None = None

    def take(self, say: Callable[[str], None]) -> None:
        if self.lock is not None and not self.lock.held:
            self.lock.acquire(force=self.force, say=say)

    def writing(self) -> None:
        if self.lock is not None and self.on_writing is not None:
            self.on_writing()

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()


@dataclass
class Start:
    """What a run starts from: its config (a resume on another world size may change
    ``train.grad_accum``), the checkpoint to restore (None: a new run), and the checks its state
    passes before the restore (``build_run``'s ``prepare``)."""

    cfg: RunConfig
    checkpoint: ckpt.TrainingState | None
    prepare: Callable[[RunState], None]


def start_or_resume(cfg: RunConfig, run_dir: Path, ctx: DistContext, *, resume: str | None, say: Say,
                    lock: RunDirLock) -> Start:
    """A new run, or the one the checkpoint ``resume`` names (``auto``: the run dir's newest). The
    run dir is locked before anything in it is read (a new one: before it is first written)."""
    if run_dir.is_dir():
        lock.take(say)
    existing = ckpt.list_checkpoints(run_dir)
    if existing and resume is None:
        raise UserError(
            f"run dir '{run_dir}' already holds checkpoints (newest: {existing[-1].name})",
            "continue that run with --resume auto, or pass a new --out RUN_DIR",
        )
    if existing:
        check_same_preset(cfg, run_dir)
    state = ckpt.load_resume(run_dir, resume, log=say) if resume else None
    if state is not None:
        cfg = adjust_for_world_size(cfg, state, ctx.world_size, say)
    elif resume:  # auto in a folder without checkpoints: said, since a wrong --out starts over silently
        say(f"--resume auto: no checkpoint in '{run_dir}', starting a new run there")
    resolved = cfg

    def prepare(run_state: RunState) -> None:
        run_state.make_batcher()  # data smaller than one batch is refused before anything is written
        if resolved.train.eval_every:  # so is a task without quality metrics; the feature network is ready
            say("preparing the quality evaluation (train.eval_every): the feature network and the data's features")
            run_state.task.prepare_quality()
        if state is not None:
            check_signature(state, run_state.task.signature(), run_dir, str(resume))
            say(f"resumed from step {state.step}")
        if ctx.is_main:
            run_dir.mkdir(parents=True, exist_ok=True)
            lock.take(say)
            lock.writing()
            write_yaml(resolved, run_dir / "config.yaml")

    return Start(cfg, state, prepare)


def check_same_preset(cfg: RunConfig, run_dir: Path) -> None:
    """A resume under another preset's name would relabel the run (its config.yaml rewritten)."""
    saved = read_config(run_dir).get("preset")
    if saved and saved != cfg.preset:
        raise UserError(
            f"run dir '{run_dir}' holds a run of preset '{saved}', but this resume asks for preset '{cfg.preset}'",
            f"drop --preset to resume it as it is (its config.yaml is read), or start the {cfg.preset} run in "
            "another --out",
        )


def check_signature(state: ckpt.TrainingState, expected: dict[str, Any], run_dir: Path, resume: str) -> None:
    """The checkpoint ``resume`` names (``auto``: the run dir's newest) fits the network this config
    builds; otherwise one error naming its folder and the command that resumes it as written."""
    found = state.meta.signature
    if found != expected:
        diffs = [f"{k}: checkpoint {found.get(k) if found else None} vs config {v}" for k, v in expected.items()
                 if not found or found.get(k) != v]
        if resume == "auto":
            where = ckpt.checkpoint_root(run_dir) / f"step_{state.step:08d}"
            how = f"diffscale train --out {run_dir} --resume auto (it reads {run_dir / 'config.yaml'})"
        else:  # another run's checkpoint: that run's config built the network it holds
            where = Path(resume)
            how = f"diffscale train {where.parent.parent / 'config.yaml'} --out {run_dir} --resume {where}"
        raise UserError(
            f"checkpoint '{where}' was written for a different model ({'; '.join(diffs)})",
            f"resume with the config it was written with, without --data or --set that change the model: {how}; "
            "or start a new run with another --out",
        )


def adjust_for_world_size(cfg: RunConfig, state: ckpt.TrainingState, world: int, say: Say) -> RunConfig:
    """Keep the checkpoint's effective batch on a different world size via accumulation."""
    saved_eff = state.meta.effective_batch or cfg.effective_batch(world)
    saved_world = state.meta.world_size
    if saved_eff == cfg.effective_batch(world):
        if saved_world != world:
            say(f"resuming on {world} processes (was {saved_world}); effective batch {saved_eff} unchanged")
        return cfg
    per_step = cfg.train.batch_per_gpu * world
    if saved_eff % per_step == 0:
        accum = saved_eff // per_step
        say(f"resuming on {world} processes (was {saved_world}): train.grad_accum {cfg.train.grad_accum} -> {accum} "
            f"keeps the effective batch at {saved_eff}")
        new = copy.deepcopy(cfg)
        new.train.grad_accum = accum
        return new
    say(f"warning: the effective batch changes from {saved_eff} to {cfg.effective_batch(world)} "
        f"({world} processes x {cfg.train.batch_per_gpu} x {cfg.train.grad_accum}); {saved_eff} is not a multiple of "
        f"{per_step} -- set train.batch_per_gpu to keep it")
    return cfg
