"""Going back to a good state when training goes wrong: the divergence guard's keep and restore
(training/guard.py judges), and, with the guard off, the rollback of non-finite losses to the
newest checkpoint. Either way the learning rate is halved for the rest of the run and the run
says so: the log, a ``kind: divergence`` record in metrics.jsonl, ``train/restores`` in TensorBoard."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from diffscale.errors import UserError
from diffscale.runtime import checkpoint as ckpt
from diffscale.training.guard import judge, judges_early, kept_copy, lr_to_set
from diffscale.training.state import RunState
from diffscale.training.step import StepRunner, learning_rate
from diffscale.training.telemetry import Telemetry

Say = Callable[[str], None]


class Recovery:
    """One run's guard: ``after_window`` at every log step, ``between_windows`` at the others; True
    when it went back to a good state."""

    def __init__(self, run_state: RunState, runner: StepRunner, telemetry: Telemetry, say: Say) -> None:
        self.run_state, self.telemetry, self.say = run_state, telemetry, say
        self.on = run_state.cfg.train.divergence_guard
        # resumed: the states the first run kept, as it kept them
        self.kept = self._resumed(run_state.guard.kept_step, runner) if self.on else None
        self.pending = self._resumed(run_state.guard.pending_step, runner) if self.on else None

    def between_windows(self, runner: StepRunner) -> bool:
        """At a step that is not logged: the guard's early window where one ends here (the loss
        read from the device); True when it went back to a good state."""
        if not judges_early(self.run_state.cfg, self.run_state.step):
            return False
        runner.drain_part(self.run_state.ctx)
        return self.after_window(runner)

    def after_window(self, runner: StepRunner) -> bool:
        """After the runner's last read (a logged window, or its tail after early windows): judge the
        steps it read."""
        t, step = self.run_state.cfg.train, self.run_state.step
        nonfinite = runner.nonfinite_in_a_row() >= t.max_nonfinite_steps
        if not self.on:
            if nonfinite:
                self._roll_back_to_checkpoint(runner)
            return nonfinite
        verdict = judge(self.run_state.guard, runner.last_read_loss, rise=t.divergence_rise,
                        patience=t.divergence_patience, noise=t.divergence_noise, steps=runner.last_read_steps,
                        patience_steps=t.divergence_patience_steps)
        if nonfinite or verdict.diverged:
            why = f"the loss was non-finite for {t.max_nonfinite_steps} steps in a row" if nonfinite else verdict.why
            self._restore(runner, why)
            return True
        guard = self.run_state.guard
        if not verdict.healthy:  # a state kept just before may hold what started this
            self.pending, guard.pending_step = None, -1
            return False
        if self.pending is not None:
            self.kept, guard.kept_step = self.pending, guard.pending_step
            self.pending, guard.pending_step = None, -1
        last = max(guard.kept_step, guard.pending_step)
        if last < 0 or step - last >= t.divergence_keep_every or step % t.checkpoint_every == 0:
            self.pending = kept_copy(self.run_state.snapshot(runner.batcher), self.run_state.device)
            guard.pending_step = step
        return False

    def _resumed(self, step: int, runner: StepRunner) -> ckpt.TrainingState | None:
        """A state the first run kept at ``step``: the one just restored, or that step's checkpoint."""
        if step < 0:
            return None
        if step == self.run_state.step:
            return kept_copy(self.run_state.snapshot(runner.batcher), self.run_state.device)
        return _checkpoint_at(self.run_state, step)

    def _restore(self, runner: StepRunner, why: str) -> None:
        run_state, cfg, step = self.run_state, self.run_state.cfg, self.run_state.step
        limit = cfg.train.divergence_max_restores
        if run_state.rollbacks >= limit:
            lower = lr_to_set(cfg, run_state.lr_backoff * 0.5)
            raise UserError(
                f"the loss diverged at step {step} ({why}) after {run_state.rollbacks} restores of an earlier "
                f"state, each at half the learning rate (optim.lr {cfg.optim.lr:g}, now x{run_state.lr_backoff:g})",
                f"train with --set optim.lr={lower:.2g} or lower (a new --out, or --resume auto to go on from the "
                "newest checkpoint); raise train.divergence_max_restores to let the guard go on halving it")
        target = self.kept if self.kept is not None else ckpt.load_latest(run_state.run_dir, log=self.say)
        if target is None:
            raise UserError(f"the loss diverged at step {step} ({why}) and no earlier state was kept to go back to",
                            f"lower optim.lr (e.g. --set optim.lr={lr_to_set(cfg, 0.5):.2g}), keep optim.grad_clip on, "
                            "or use --precision bf16 / fp32 instead of fp16, and train again")
        # a copy of the kept state: the optimizer adopts the tensors it loads, and training changes them
        run_state.roll_back(kept_copy(target, run_state.device))
        run_state.guard.above = run_state.guard.above_steps = 0
        self.pending, run_state.guard.pending_step = None, -1
        runner.restart(run_state.make_batcher())
        lr = learning_rate(cfg, run_state.step, runner.effective, run_state.lr_backoff)
        self.say(f"warning: divergence at step {step}: {why}; went back to step {target.step} and halved the "
                 f"learning rate (now {lr:.2e}; restore {run_state.rollbacks} of {limit})")
        self._record(step, target.step, why, lr)

    def _roll_back_to_checkpoint(self, runner: StepRunner) -> None:
        """The guard off: back to the newest checkpoint with the learning rate halved, or one clear error."""
        run_state, cfg, step = self.run_state, self.run_state.cfg, self.run_state.step
        limit = cfg.train.divergence_max_restores
        if run_state.rollbacks >= limit:
            raise UserError(
                f"the loss stayed non-finite at step {step} after {run_state.rollbacks} rollbacks "
                f"(learning rate now {learning_rate(cfg, step, runner.effective, run_state.lr_backoff):.2e})",
                "lower optim.lr, keep optim.grad_clip on (e.g. 1.0), or use --precision fp32 / bf16 instead of fp16",
            )
        state = ckpt.load_latest(run_state.run_dir, log=self.say)
        if state is None:
            raise UserError(
                f"the loss was non-finite for {cfg.train.max_nonfinite_steps} steps in a row at step {step} "
                "and no checkpoint exists to roll back to",
                "lower optim.lr, keep optim.grad_clip on, or set train.checkpoint_every lower so a rollback is "
                "possible",
            )
        run_state.roll_back(state)
        runner.restart(run_state.make_batcher())
        self.say(f"warning: non-finite loss for {cfg.train.max_nonfinite_steps} steps in a row at step {step}: rolled "
                 f"back to step {state.step} with the learning rate halved (rollback {run_state.rollbacks} of {limit})")
        lr = learning_rate(cfg, run_state.step, runner.effective, run_state.lr_backoff)
        self._record(step, state.step, "non-finite loss", lr)

    def _record(self, step: int, back_to: int, why: str, lr: float) -> None:
        record: dict[str, Any] = {"kind": "divergence", "step": step, "restored_step": back_to, "why": why,
                                  "restore": self.run_state.rollbacks, "lr": lr,
                                  "lr_factor": self.run_state.lr_backoff, "time": time.time()}
        self.telemetry.divergence(record)


def _checkpoint_at(run_state: RunState, step: int) -> ckpt.TrainingState | None:
    """The run's checkpoint of ``step`` where it is still on disk (a resume's kept state), else None."""
    for path in ckpt.list_checkpoints(run_state.run_dir):
        if path.name == f"step_{step:08d}":
            try:
                return ckpt.load_checkpoint(path)
            except ckpt.CorruptCheckpoint:
                return None
    return None
