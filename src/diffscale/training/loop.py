"""The training loop: step -> accumulate -> optimizer -> EMA -> metrics -> checkpoint.

It knows nothing of schedulers or model internals: the task supplies data, network and
previews; the runtime supplies the device, precision and process group. One process
is the world-size-1 case of the same code.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from diffscale.config import RunConfig, Toggle
from diffscale.data.feed import DataEnded, Feed, StopWaiting
from diffscale.data.locations import with_absolute_path
from diffscale.errors import UserError
from diffscale.io.kernels import step_built
from diffscale.runtime.device import (
    DevicePolicy,
    mps_gap,
    peak_memory_bytes,
)
from diffscale.runtime.distributed import DistContext
from diffscale.runtime.parallelize import trains_in_cuda_graphs
from diffscale.runtime.runlock import RunLock
from diffscale.runtime.signals import EXIT_REQUEUE, StopFlag
from diffscale.tasks.base import count_parameters
from diffscale.training.background_compile import BackgroundCompile, compiles_while_training
from diffscale.training.build import Run, build_run, join, run_compile_cache
from diffscale.training.console_log import logged_console, stderr_into
from diffscale.training.previews import evaluate, preview
from diffscale.training.recovery import Recovery
from diffscale.training.resume import RunDirLock, start_or_resume
from diffscale.training.state import RunState
from diffscale.training.step import StepRunner
from diffscale.training.switch import CompileSwitch, start_note
from diffscale.training.telemetry import Telemetry, ThroughputMeter, open_telemetry, seconds_since_process_start


@dataclass
class TrainOutcome:
    run_dir: Path
    step: int
    target: int
    stopped_by: str | None = None
    """Signal name when a stop request ended this invocation early."""
    samples: list[Path] = field(default_factory=list)
    data_ended: str = ""
    """Why the run ended before its step target: its data's source ended (empty: it did not)."""
    main: bool = True
    """Whether this process is rank 0 (the one that reports the run)."""

    @property
    def finished(self) -> bool:
        return self.step >= self.target or bool(self.data_ended)

    @property
    def exit_code(self) -> int:
        return EXIT_REQUEUE if self.stopped_by else 0

    def summary(self) -> str:
        """How the invocation ended, one line (RUN_DIR/trainer.json, ``status``)."""
        if self.stopped_by:
            return f"stopped by {self.stopped_by} at step {self.step} of {self.target}"
        if self.data_ended:
            return f"ended at step {self.step}: {self.data_ended}"
        if self.step >= self.target:
            return f"finished at step {self.step}"
        return f"stopped at step {self.step} of {self.target} (--max-steps)"


def _banner(policy: DevicePolicy, ctx: DistContext, cfg: RunConfig, params: int, data: str, whole_steps: bool,
            eager_first: bool = False) -> str:
    mem = f", {policy.memory_bytes / 2**30:.0f} GiB" if policy.memory_bytes else ""
    eff = cfg.effective_batch(ctx.world_size)
    graphs = " (CUDA graphs)" if policy.compile and trains_in_cuda_graphs(cfg, policy) and not whole_steps else ""
    compiled = (" | eager while compiling, then compiled" if eager_first else " | compiled") + graphs \
        if policy.compile else ""
    if whole_steps:
        compiled += " | each step one CUDA graph"
    if policy.flex_min_rows is not None:
        compiled += " | FlexAttention" + (f" (calls of >= {policy.flex_min_rows} rows)" if policy.flex_min_rows else "")
    if policy.device.type == "mps" and os.environ.get("PYTORCH_ENABLE_MPS_FALLBACK") == "1":
        compiled += " | ops MPS lacks run on the CPU"
    return (
        f"diffscale | {policy.device.type}: {policy.name}{mem} | {policy.precision.value}"
        f"{' + GradScaler' if policy.use_grad_scaler else ''}{compiled} | "
        f"world size {ctx.world_size} ({ctx.info.launcher}) | effective batch {eff} = "
        f"{cfg.train.batch_per_gpu} x {ctx.world_size} proc x {cfg.train.grad_accum} accum | "
        f"{cfg.preset} ({cfg.task}) {params / 1e6:.2f} M params | data {data}"
    )


Say = Callable[[str], None]


def train(cfg: RunConfig, run_dir: Path, *, resume: str | None = None, max_steps: int | None = None,
          console: Console | None = None, force: bool = False) -> TrainOutcome:
    """Train until ``cfg.train.steps`` (or ``max_steps``), a stop signal, or an unrecoverable error.

    The run dir is locked while it trains (``RUN_DIR/train.lock``): another live trainer there is
    refused. ``force``: take a lock held on another host (whose trainer has ended)."""
    console = logged_console(console)  # RUN_DIR/train.log once the run dir is ours
    run_log = console.run_log
    run_dir = Path(run_dir)
    cfg = with_absolute_path(cfg)  # the run's config.yaml then resumes it from any directory
    with stderr_into(run_log):
        ctx, policy = join(cfg, console)
        stop = StopFlag().install()
        lock = RunDirLock(RunLock(run_dir) if ctx.is_main else None, force,  # ranks share the run dir: one lock
                          on_writing=lambda: run_log.attach(run_dir))
        try:
            outcome = _run(cfg, run_dir, ctx, policy, resume=resume, max_steps=max_steps, console=console,
                           stop=stop, lock=lock)
            run_log.end(outcome.summary())
            return outcome
        except NotImplementedError as exc:
            gap = mps_gap(exc, policy.device)
            run_log.failed(gap or exc)
            if gap is None:
                raise
            raise gap from exc
        except BaseException as exc:
            run_log.failed(exc)
            raise
        finally:
            run_log.close()
            lock.release()
            stop.restore()
            ctx.shutdown()


def _run(cfg: RunConfig, run_dir: Path, ctx: DistContext, policy: DevicePolicy, *, resume: str | None,
         max_steps: int | None, console: Console, stop: StopFlag, lock: RunDirLock) -> TrainOutcome:
    def say(text: str) -> None:
        if ctx.is_main:
            console.print(text, highlight=False)

    start = start_or_resume(cfg, run_dir, ctx, resume=resume, say=say, lock=lock)
    cfg = start.cfg  # a resume on another world size may change train.grad_accum
    target = cfg.train.steps
    stop_at = min(target, max_steps) if max_steps else target
    kernels = _trains_beside(cfg, run_dir, ctx, policy)
    eager_first = kernels is not None
    opened = _Opened()

    def announce(run_state: RunState, whole_steps: bool) -> None:
        # first what can still refuse the run (a tracker that is on but not installed), then what starts it
        opened.telemetry = open_telemetry(run_dir, cfg, main=ctx.is_main, on_gpu=policy.device.type == "cuda",
                                          start_step=run_state.step, console=console)
        if opened.background is not None:
            opened.background.keep_log(run_dir, ctx.info.node_rank)
        say(_banner(policy, ctx, cfg, count_parameters(run_state.net), run_state.task.describe_data(), whole_steps,
                    eager_first))
        if kernels is not None:
            say(start_note(kernels, opened.background.log if opened.background is not None else None))
        if cfg.optim.warmup_steps > target:  # a short trial run of a long config: say why lr stays low
            say(f"note: optim.warmup_steps {cfg.optim.warmup_steps} > train.steps {target}: the learning rate "
                f"rises linearly the whole run and never reaches optim.lr {cfg.optim.lr:g} (lower "
                "optim.warmup_steps to reach it)")

    try:  # closes metrics.jsonl also when the run is refused before its first step
        if kernels is not None and ctx.local_rank == 0:  # it imports and builds while this process builds too
            opened.background = BackgroundCompile.start(cfg, ctx, kernels)
        with build_run(cfg, run_dir, ctx, policy, console=console, say=say, checkpoint=start.checkpoint,
                       prepare=start.prepare, compile_cache=True, announce=announce, eager_first=eager_first,
                       feed=lambda run_state: _feed(run_state, opened.opened(), stop, say)) as run:
            run_state, telemetry = run.state, opened.opened()
            if policy.device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(policy.device)
            meter = ThroughputMeter()
            opened.switch = CompileSwitch(run, opened.background, telemetry, say)
            stopped_by, samples = _loop(run, telemetry, stop, stop_at, say, meter, opened.switch)
            opened.switch.finish()  # before the last preview, whose sampling network may compile
            if stopped_by is None:
                samples += preview(run_state, ctx, run_dir, f"step{run_state.step:08d}", say, telemetry)
                if run_state.step >= target or run_state.data_ended:
                    say(f"done: {run_state.step} steps; samples in {run_dir / 'samples'}")
                else:
                    say(f"stopped at step {run_state.step} of {target} (--max-steps); continue with --resume auto")
            if meter.summary():
                say(meter.summary())
    finally:
        opened.close()
    return TrainOutcome(run_dir=run_dir, step=run_state.step, target=target, stopped_by=stopped_by, samples=samples,
                        data_ended=run_state.data_ended, main=ctx.is_main)


@dataclass
class _Opened:
    """What a run opens, closed at its end: metrics.jsonl, TensorBoard and the background compile's log
    once it passed its checks (a refused run writes nothing); the background compile itself as soon as
    its config is settled."""

    telemetry: Telemetry | None = None
    background: BackgroundCompile | None = None
    switch: CompileSwitch | None = None

    def opened(self) -> Telemetry:
        assert self.telemetry is not None, "opened by build_run's announce, before the run's data is drawn"
        return self.telemetry

    def close(self) -> None:
        if self.switch is not None:
            self.switch.finish()
        elif self.background is not None:  # refused before its first step
            self.background.stop()
        if self.telemetry is not None:
            self.telemetry.close()


def _feed(run_state: RunState, telemetry: Telemetry, stop: StopFlag, say: Say) -> Feed:
    """How a task's batcher that waits for data (a spool) reaches the other ranks, the log,
    metrics.jsonl and the stop flag."""
    ctx = run_state.ctx

    def report(message: str, record: dict[str, Any]) -> None:
        say(message)
        telemetry.event({**record, "step": run_state.step})

    return Feed(rank=ctx.rank, world_size=ctx.world_size, share=ctx.broadcast, report=report,
                stopping=lambda: ctx.any_true(stop.requested))


def _loop(run: Run, telemetry: Telemetry, stop: StopFlag, stop_at: int, say: Say, meter: ThroughputMeter,
          switch: CompileSwitch) -> tuple[str | None, list[Path]]:
    """Steps until ``stop_at`` or a stop request; returns the signal that stopped it (if any)
    and the preview files written on the way. After the first compiled step the traced network
    is cached (``runtime.compile_cache``): forward and backward have compiled by then. A run that
    trains while compiling switches to the compiled step at a step boundary (``switch``)."""
    run_state, runner = run.state, run.runner
    t, ctx = run_state.cfg.train, run_state.ctx
    clock = _Clock(run_state.step, stop_at)
    recovery = Recovery(run_state, runner, telemetry, say)
    samples: list[Path] = []
    first_step = True
    while run_state.step < stop_at:
        switch.before_step()
        try:
            lr = runner.step()
        except StopWaiting as waiting:  # a stop while the task's batcher waited for data
            return _stop(run_state, runner, stop, f"{waiting}", say), samples
        except DataEnded as ended:  # the data's source (a coupled simulation) ended: no more will come
            _data_ended(run_state, runner, ended, say)
            return None, samples
        if first_step and run_state.policy.compile:
            _first_step_note(run_state, telemetry, say, eager=run.eager)
            run.mark_step_built()  # compiled from its first step; an eager one's switch marks it
        first_step = False
        switch.after_step()
        run.compile_cache.save_once()
        meter.add(runner.effective)
        if run_state.step % t.log_every == 0 or run_state.step == stop_at:
            record = _metrics(run_state, runner, meter, lr, clock)
            telemetry.log(record)
            if recovery.after_window(runner):  # went back to a good state
                continue
            if ctx.any_true(stop.requested):
                return _stop(run_state, runner, stop, f"at step {run_state.step}", say), samples
            switch.at_step(record)
        else:
            if recovery.between_windows(runner):  # the guard's early window went back to a good state
                continue
            switch.at_step(None)
        if run_state.step % t.checkpoint_every == 0 or run_state.step == stop_at:
            run_state.save(runner.batcher)
        if t.sample_every and run_state.step % t.sample_every == 0 and run_state.step != stop_at:
            samples += preview(run_state, ctx, run_state.run_dir, f"step{run_state.step:08d}", say, telemetry)
        if t.eval_every and run_state.step % t.eval_every == 0:
            evaluate(run_state, ctx, say, telemetry)
    return None, samples


def _trains_beside(cfg: RunConfig, run_dir: Path, ctx: DistContext, policy: DevicePolicy) -> Path | None:
    """The kernel folder a run trains eager beside while its background process compiles into it
    (``compiles_while_training``), or None where it compiles before its first step: also under
    ``auto`` where every rank's folder holds a whole build of the step made for this run's data
    (``step_built``, ``RunConfig.kernels_built_for``). Compiled first from such a folder, small on
    an H200 trained at its compiled speed 10.6-13.4 s after the command; eager first, after
    26.2-34.1 s (its first step at 4.3-6.5 s; 2026-11-30)."""
    if not compiles_while_training(cfg, policy):
        return None
    kernels = run_compile_cache(run_dir, cfg, ctx.world_size, policy.name)
    if cfg.runtime.compile_while_training == Toggle.AUTO and not ctx.any_true(
            not step_built(kernels, cfg.kernels_built_for())):
        return None
    return kernels


def _first_step_note(run_state: RunState, telemetry: Telemetry, say: Say, *, eager: bool) -> None:
    """After a compiled job's first step: how long the job waited for it, from its process's start
    (imports, data, the compile unless it trains ``eager`` while compiling), on the console and in
    metrics.jsonl (``kind`` first_step)."""
    waited = seconds_since_process_start()
    how = "eager while compiling" if eager else "compiled"
    say(f"first step of this job (step {run_state.step}) {waited:.1f} s after it started: {how}")
    telemetry.event({"kind": "first_step", "step": run_state.step, "since_start_s": round(waited, 2),
                     "eager": eager, "time": time.time()})


def _data_ended(run_state: RunState, runner: StepRunner, ended: DataEnded, say: Say) -> None:
    """Checkpoint the run whose data source ended; a failed source ends it with an error."""
    run_state.save(runner.batcher)
    run_state.data_ended = str(ended)
    if not ended.ok:
        raise UserError(f"{ended}; checkpointed at step {run_state.step}",
                        "see the simulation's log (diffscale logs RUN_DIR), fix it and submit again")
    say(f"{ended}: checkpointed at step {run_state.step}")


def _stop(run_state: RunState, runner: StepRunner, stop: StopFlag, where: str, say: Say) -> str:
    """Checkpoint on a stop request; returns what asked for it."""
    stopped_by = stop.signal_name or "a signal on another rank"
    say(f"stop requested ({stopped_by}) {where}: writing a checkpoint")
    run_state.save(runner.batcher)
    return stopped_by


@dataclass
class _Clock:
    """Wall time since this invocation started, for the ETA to the step it stops at."""

    first_step: int
    stop_at: int
    started: float = field(default_factory=time.perf_counter)

    def eta_s(self, step: int) -> float:
        elapsed = time.perf_counter() - self.started
        return elapsed / max(step - self.first_step, 1) * (self.stop_at - step)


def _metrics(run_state: RunState, runner: StepRunner, meter: ThroughputMeter, lr: float,
             clock: _Clock) -> dict[str, Any]:
    window = runner.drain_metrics(run_state.ctx)
    # Fold the window's skipped steps into the run's total here, at a log step, so
    # checkpoints (written at log steps) carry every skipped step and a rollback cannot count one twice.
    run_state.nonfinite_total += window.nonfinite
    rate = meter.rate()
    return {
        "step": run_state.step,
        "total_steps": run_state.cfg.train.steps,
        "loss": window.loss,
        "lr": lr,
        "grad_norm": window.grad_norm,
        "samples_per_s": rate,
        "samples_per_s_per_gpu": rate / run_state.ctx.world_size,
        "data_wait_share": meter.wait_share(window.data_wait_s),
        "peak_mem_mb": peak_memory_bytes(run_state.device) / 2**20,
        "nonfinite_skipped": run_state.nonfinite_total,
        "restores": run_state.rollbacks,
        "epoch": runner.batcher.position.epoch,
        "eta_s": clock.eta_s(run_state.step),
        "time": time.time(),
    }



