"""The training loop: step -> accumulate -> optimizer -> EMA -> metrics -> checkpoint.

It knows nothing of schedulers or model internals: the task supplies data, network and
previews; the runtime supplies the device, precision and process group. One process
is the world-size-1 case of the same code.
"""

from __future__ import annotations

import copy
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from diffscale.config import RunConfig, write_yaml
from diffscale.data.feed import DataEnded, Feed, StopWaiting
from diffscale.data.locations import with_absolute_path
from diffscale.errors import UserError
from diffscale.io.atomic import write_bytes
from diffscale.io.rundir import read_config
from diffscale.runtime import checkpoint as ckpt
from diffscale.runtime.compile_cache import CompileCache, open_compile_cache
from diffscale.runtime.device import (
    DevicePolicy,
    configure_backends,
    mps_gap,
    peak_memory_bytes,
    pick_device,
    resolve_policy,
)
from diffscale.runtime.distributed import DistContext, detect_launch, init_distributed
from diffscale.runtime.parallelize import parallelize, trains_in_cuda_graphs
from diffscale.runtime.resources import cpus_for_rank, free_cpu_threads
from diffscale.runtime.runlock import RunLock
from diffscale.runtime.signals import EXIT_REQUEUE, StopFlag
from diffscale.tasks.base import Generated, count_parameters
from diffscale.training.state import RunState
from diffscale.training.step import StepRunner, learning_rate
from diffscale.training.step_graph import records_whole_steps
from diffscale.training.telemetry import Telemetry, ThroughputMeter, open_telemetry, seconds_since_process_start

MAX_ROLLBACKS = 3


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

    @property
    def finished(self) -> bool:
        return self.step >= self.target or bool(self.data_ended)

    @property
    def exit_code(self) -> int:
        return EXIT_REQUEUE if self.stopped_by else 0


def _banner(policy: DevicePolicy, ctx: DistContext, cfg: RunConfig, params: int, data: str, whole_steps: bool) -> str:
    mem = f", {policy.memory_bytes / 2**30:.0f} GiB" if policy.memory_bytes else ""
    eff = cfg.effective_batch(ctx.world_size)
    graphs = " (CUDA graphs)" if policy.compile and trains_in_cuda_graphs(cfg, policy) and not whole_steps else ""
    compiled = " | compiled" + graphs if policy.compile else ""
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


def _check_signature(state: ckpt.TrainingState, expected: dict[str, Any], run_dir: Path, resume: str) -> None:
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


Say = Callable[[str], None]


def _adjust_for_world_size(cfg: RunConfig, state: ckpt.TrainingState, world: int, say: Say) -> RunConfig:
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


def train(cfg: RunConfig, run_dir: Path, *, resume: str | None = None, max_steps: int | None = None,
          console: Console | None = None, force: bool = False) -> TrainOutcome:
    """Train until ``cfg.train.steps`` (or ``max_steps``), a stop signal, or an unrecoverable error.

    The run dir is locked while it trains (``RUN_DIR/train.lock``): another live trainer there is
    refused. ``force``: take a lock held on another host (whose trainer has ended)."""
    console = console or Console(soft_wrap=True)
    run_dir = Path(run_dir)
    cfg = with_absolute_path(cfg)  # the run's config.yaml then resumes it from any directory
    launch = detect_launch()
    device = pick_device(cfg.runtime.device, launch.local_rank)
    policy = resolve_policy(cfg.runtime, device)
    configure_backends(policy)
    if device.type == "cpu":
        set_cpu_threads(cfg.runtime.cpu_threads, launch.local_world_size, console)
    ctx = init_distributed(launch, device, join_timeout_s=cfg.runtime.join_timeout_s,
                           collective_timeout_s=cfg.runtime.collective_timeout_s)
    stop = StopFlag().install()
    lock = _Lock(RunLock(run_dir) if ctx.is_main else None, force)  # ranks share the run dir: one lock
    try:
        return _run(cfg, run_dir, ctx, policy, resume=resume, max_steps=max_steps, console=console, stop=stop,
                    lock=lock)
    except NotImplementedError as exc:
        gap = mps_gap(exc, device)
        if gap is None:
            raise
        raise gap from exc
    finally:
        lock.release()
        stop.restore()
        ctx.shutdown()


@dataclass
class _Lock:
    """Rank 0's run-dir lock (None on the other ranks), and whether to take a foreign host's."""

    lock: RunLock | None
    force: bool

    def take(self, say: Callable[[str], None]) -> None:
        if self.lock is not None and not self.lock.held:
            self.lock.acquire(force=self.force, say=say)

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()


def set_cpu_threads(asked: int, local_world_size: int, console: Console) -> None:
    """``runtime.cpu_threads``, else (unless ``OMP_NUM_THREADS`` is set) the cores this rank may use
    that other processes leave free: threads beyond them, and several CPU ranks on one host each
    starting a thread per core, wait for each other and slow every step many times over."""
    if asked:
        torch.set_num_threads(asked)
        return
    if "OMP_NUM_THREADS" in os.environ:
        return
    threads = free_cpu_threads(local_world_size)
    if threads < cpus_for_rank(local_world_size):
        console.print(f"note: other processes keep this machine's cores busy: training with {threads} CPU thread"
                      f"{'s' if threads > 1 else ''} of {cpus_for_rank(local_world_size)} (set runtime.cpu_threads "
                      "to choose)", highlight=False)
    torch.set_num_threads(threads)


def run_compile_cache(run_dir: Path, cfg: RunConfig, world_size: int) -> Path:
    """Where compiled kernels go: the user's kernel cache, one folder per compiled graph
    (``DIFFSCALE_CACHE_DIR``/kernels/GRAPH_KEY, ``~/.cache/diffscale`` by default), so a new run
    of a network compiled before -- another seed, learning rate or data fraction -- and a job
    resumed on another node both find the kernels instead of compiling for minutes. A run that
    kept its own (``RUN_DIR/cache/inductor``, before runs shared them) keeps using it, and
    ``TORCHINDUCTOR_CACHE_DIR`` set by the user wins. Set over torch's own default, which torch
    writes into the variable as soon as anything asks for its cache (node-local /tmp: resumed
    jobs on another node compiled again)."""
    from diffscale import USER_COMPILE_CACHE
    from diffscale.io.paths import cache_dir

    if USER_COMPILE_CACHE is None:
        own = run_dir.resolve() / "cache" / "inductor"
        shared = cache_dir().resolve() / "kernels" / cfg.graph_key(world_size)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(own if own.is_dir() and any(own.iterdir()) else shared)
    return Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])


def compile_note(cache_dir: Path, traced: CompileCache | None = None) -> str:
    """What the wait before the first step is: compiling, for the first time or from cached kernels,
    and with ``runtime.compile_cache`` whether the traced network comes from the cache too.
    (A first compile takes minutes on a GPU host: docs/benchmarks.md, "Start-up and compile time".)"""
    cached = cache_dir.is_dir() and any(cache_dir.iterdir())
    if traced is not None and traced.found:
        return (f"compiling the network: the traced network and kernels cached by an earlier job in {cache_dir} "
                f"are reused")
    if cached:
        note = f"compiling the network: kernels cached by an earlier job in {cache_dir} are reused"
    else:
        note = (f"compiling the network before the first step (the first time takes minutes on a GPU; "
                f"the kernels are kept in {cache_dir}, so resumed jobs and new runs of this network start sooner)")
    if traced is not None and traced.active:
        note += "; the traced network is cached after the first step"
    return note


def _start_or_resume(cfg: RunConfig, run_dir: Path, ctx: DistContext, policy: DevicePolicy, *, resume: str | None,
                     console: Console, say: Say, lock: _Lock) -> RunState:
    """A fresh run state, or one restored from the checkpoint ``resume`` names; writes config.yaml.
    The run dir is locked before anything in it is read (a new one: before it is first written)."""
    if run_dir.is_dir():
        lock.take(say)
    existing = ckpt.list_checkpoints(run_dir)
    if existing and resume is None:
        raise UserError(
            f"run dir '{run_dir}' already holds checkpoints (newest: {existing[-1].name})",
            "continue that run with --resume auto, or pass a new --out RUN_DIR",
        )
    if existing:
        _check_same_preset(cfg, run_dir)
    state = ckpt.load_resume(run_dir, resume, log=say) if resume else None
    if state is not None:
        cfg = _adjust_for_world_size(cfg, state, ctx.world_size, say)
    elif resume:  # auto in a folder without checkpoints: said, since a wrong --out starts over silently
        say(f"--resume auto: no checkpoint in '{run_dir}', starting a new run there")
    run_state = RunState(cfg, run_dir, ctx, policy, console)
    records_whole_steps(run_state)  # a runtime.step_graph this run cannot have is refused before anything is written
    run_state.make_batcher()  # so is data smaller than one batch (the loop makes its own batcher later)
    if cfg.train.eval_every:  # so is a task without quality metrics; the feature network is ready before step 1
        say("preparing the quality evaluation (train.eval_every): the feature network and the data's features")
        run_state.task.prepare_quality()
    if state is not None:
        _check_signature(state, run_state.task.signature(), run_dir, str(resume))
        run_state.restore(state)
        say(f"resumed from step {state.step}")
    if ctx.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        lock.take(say)
        write_yaml(cfg, run_dir / "config.yaml")
    return run_state


def _check_same_preset(cfg: RunConfig, run_dir: Path) -> None:
    """A resume under another preset's name would relabel the run (its config.yaml rewritten)."""
    saved = read_config(run_dir).get("preset")
    if saved and saved != cfg.preset:
        raise UserError(
            f"run dir '{run_dir}' holds a run of preset '{saved}', but this resume asks for preset '{cfg.preset}'",
            f"drop --preset to resume it as it is (its config.yaml is read), or start the {cfg.preset} run in "
            "another --out",
        )


def _run(cfg: RunConfig, run_dir: Path, ctx: DistContext, policy: DevicePolicy, *, resume: str | None,
         max_steps: int | None, console: Console, stop: StopFlag, lock: _Lock) -> TrainOutcome:
    def say(text: str) -> None:
        if ctx.is_main:
            console.print(text, highlight=False)

    run_state = _start_or_resume(cfg, run_dir, ctx, policy, resume=resume, console=console, say=say, lock=lock)
    cfg = run_state.cfg  # a resume on another world size may change train.grad_accum
    target = cfg.train.steps
    stop_at = min(target, max_steps) if max_steps else target
    whole_steps = records_whole_steps(run_state)
    say(_banner(policy, ctx, cfg, count_parameters(run_state.net), run_state.task.describe_data(), whole_steps))
    if cfg.optim.warmup_steps > target:  # a short trial run of a long config: say why lr stays low
        say(f"note: optim.warmup_steps {cfg.optim.warmup_steps} > train.steps {target}: the learning rate rises "
            f"linearly the whole run and never reaches optim.lr {cfg.optim.lr:g} (lower optim.warmup_steps "
            "to reach it)")
    traced = CompileCache(say=say)
    if policy.compile:
        from diffscale import USER_COMPILE_CACHE

        cache_dir = run_compile_cache(run_dir, cfg, ctx.world_size)
        traced = open_compile_cache(cfg, cache_dir, world_size=ctx.world_size, own_cache=USER_COMPILE_CACHE is None,
                                    net=run_state.net, say=say, on_cuda=policy.device.type == "cuda")
        say(compile_note(cache_dir, traced))
        if traced.why_not:
            say(traced.why_not)
    with traced:  # caching precompile on for this job's compile and steps only
        model = parallelize(run_state.net, cfg=cfg, ctx=ctx, policy=policy, say=say, whole_steps=whole_steps,
                            cache=traced)
        telemetry = open_telemetry(run_dir, cfg, main=ctx.is_main, on_gpu=policy.device.type == "cuda",
                                   start_step=run_state.step, console=console)
        runner: StepRunner | None = None
        try:  # closes metrics.jsonl also when the batcher refuses the data (smaller than one batch)
            run_state.feed = _feed(run_state, telemetry, stop, say)
            runner = StepRunner(run_state, model, run_state.make_batcher())
            if policy.device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(policy.device)
            meter = ThroughputMeter()
            stopped_by, samples = _loop(run_state, runner, telemetry, stop, stop_at, say, traced, meter)
            if stopped_by is None:
                samples += _preview(run_state, ctx, run_dir, f"step{run_state.step:08d}", say, telemetry)
                if run_state.step >= target or run_state.data_ended:
                    say(f"done: {run_state.step} steps; samples in {run_dir / 'samples'}")
                else:
                    say(f"stopped at step {run_state.step} of {target} (--max-steps); continue with --resume auto")
            if meter.summary():
                say(meter.summary())
        finally:
            telemetry.close()
            if runner is not None:
                runner.batcher.close()
    return TrainOutcome(run_dir=run_dir, step=run_state.step, target=target, stopped_by=stopped_by, samples=samples,
                        data_ended=run_state.data_ended)


def _feed(run_state: RunState, telemetry: Telemetry, stop: StopFlag, say: Say) -> Feed:
    """How a task's batcher that waits for data (a spool) reaches the other ranks, the log,
    metrics.jsonl and the stop flag."""
    ctx = run_state.ctx

    def report(message: str, record: dict[str, Any]) -> None:
        say(message)
        telemetry.event({**record, "step": run_state.step})

    return Feed(rank=ctx.rank, world_size=ctx.world_size, share=ctx.broadcast, report=report,
                stopping=lambda: ctx.any_true(stop.requested))


def _loop(run_state: RunState, runner: StepRunner, telemetry: Telemetry, stop: StopFlag, stop_at: int,
          say: Say, traced: CompileCache, meter: ThroughputMeter) -> tuple[str | None, list[Path]]:
    """Steps until ``stop_at`` or a stop request; returns the signal that stopped it (if any)
    and the preview files written on the way. After the first step the traced network is cached
    (``runtime.compile_cache``): forward and backward have compiled by then."""
    t, ctx = run_state.cfg.train, run_state.ctx
    clock = _Clock(run_state.step, stop_at)
    samples: list[Path] = []
    first_step = True
    while run_state.step < stop_at:
        try:
            lr = runner.step()
        except StopWaiting as waiting:  # a stop while the task's batcher waited for data
            return _stop(run_state, runner, stop, f"{waiting}", say), samples
        except DataEnded as ended:  # the data's source (a coupled simulation) ended: no more will come
            _data_ended(run_state, runner, ended, say)
            return None, samples
        if first_step and run_state.policy.compile:
            _first_step_note(run_state, telemetry, say)
        first_step = False
        traced.save_once()
        meter.add(runner.effective)
        if run_state.step % t.log_every == 0 or run_state.step == stop_at:
            telemetry.log(_metrics(run_state, runner, meter, lr, clock))
            if runner.nonfinite_in_a_row() >= t.max_nonfinite_steps:
                _roll_back(run_state, runner, say)
                continue
            if ctx.any_true(stop.requested):
                return _stop(run_state, runner, stop, f"at step {run_state.step}", say), samples
        if run_state.step % t.checkpoint_every == 0 or run_state.step == stop_at:
            run_state.save(runner.batcher)
        if t.sample_every and run_state.step % t.sample_every == 0 and run_state.step != stop_at:
            samples += _preview(run_state, ctx, run_state.run_dir, f"step{run_state.step:08d}", say, telemetry)
        if t.eval_every and run_state.step % t.eval_every == 0:
            _evaluate(run_state, ctx, say, telemetry)
    return None, samples


def _first_step_note(run_state: RunState, telemetry: Telemetry, say: Say) -> None:
    """After a compiled job's first step: how long the job waited for it, from its process's start
    (imports, data, the compile), on the console and in metrics.jsonl (``kind`` first_step)."""
    waited = seconds_since_process_start()
    say(f"first step of this job (step {run_state.step}) {waited:.1f} s after it started: compiled")
    telemetry.event({"kind": "first_step", "step": run_state.step, "since_start_s": round(waited, 2),
                     "time": time.time()})


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
        "epoch": runner.batcher.position.epoch,
        "eta_s": clock.eta_s(run_state.step),
        "time": time.time(),
    }


def _roll_back(run_state: RunState, runner: StepRunner, say: Say) -> None:
    """Back to the newest checkpoint with the learning rate halved, or one clear error."""
    cfg, step = run_state.cfg, run_state.step
    if run_state.rollbacks >= MAX_ROLLBACKS:
        raise UserError(
            f"the loss stayed non-finite at step {step} after {run_state.rollbacks} rollbacks "
            f"(learning rate now {learning_rate(cfg, step, runner.effective, run_state.lr_backoff):.2e})",
            "lower optim.lr, keep optim.grad_clip on (e.g. 1.0), or use --precision fp32 / bf16 instead of fp16",
        )
    state = ckpt.load_latest(run_state.run_dir, log=say)
    if state is None:
        raise UserError(
            f"the loss was non-finite for {cfg.train.max_nonfinite_steps} steps in a row at step {step} "
            "and no checkpoint exists to roll back to",
            "lower optim.lr, keep optim.grad_clip on, or set train.checkpoint_every lower so a rollback is possible",
        )
    run_state.roll_back(state)
    runner.restart(run_state.make_batcher())
    say(f"warning: non-finite loss for {cfg.train.max_nonfinite_steps} steps in a row at step {step}: rolled back "
        f"to step {state.step} with the learning rate halved (rollback {run_state.rollbacks} of {MAX_ROLLBACKS})")


def _preview(run_state: RunState, ctx: DistContext, run_dir: Path, name: str, say: Say,
             telemetry: Telemetry) -> list[Path]:
    """Samples from the EMA weights. Every rank generates a share (no rank idles at a
    collective while rank 0 samples); rank 0 gathers and writes."""
    t = run_state.cfg.train
    say(f"writing a preview: {t.sample_count} samples x {t.sample_steps} steps from the EMA weights "
        f"(on {ctx.world_size} process{'es' if ctx.world_size > 1 else ''})")
    share = math.ceil(t.sample_count / ctx.world_size)
    mine = run_state.task.generate(run_state.ema, count=t.sample_count, steps=t.sample_steps, seed=t.seed,
                                   sampler=t.sample_sampler.value, autocast=run_state.policy.autocast,
                                   rows=slice(ctx.rank * share, (ctx.rank + 1) * share))
    samples = ctx.gather_rows(mine.samples, share)
    if not ctx.is_main:
        return []
    path = run_dir / "samples" / f"{name}.png"
    written = run_state.task.write_samples(Generated(samples), path)
    write_bytes(run_dir / "samples" / "latest.png", path.read_bytes())
    telemetry.images(written, run_state.step)
    return written


def _evaluate(run_state: RunState, ctx: DistContext, say: Say, telemetry: Telemetry) -> None:
    """Quality metrics of ``train.eval_count`` samples from the EMA weights (the same seeded draw at
    every evaluation). Every rank generates its share and takes part in the gather; rank 0 scores."""
    t = run_state.cfg.train
    say(f"evaluating: {t.eval_count} samples x {t.sample_steps} {t.sample_sampler.value} steps from the EMA weights")
    share = math.ceil(t.eval_count / ctx.world_size)
    mine = run_state.task.quality_features(run_state.ema, count=t.eval_count, steps=t.sample_steps, seed=t.seed + 1,
                                           sampler=t.sample_sampler.value, autocast=run_state.policy.autocast,
                                           rows=slice(ctx.rank * share, (ctx.rank + 1) * share))
    features = ctx.gather_rows(mine, share)
    if ctx.is_main:
        about = {"task": run_state.cfg.task, "steps": t.sample_steps, "sampler": t.sample_sampler.value,
                 "seed": t.seed + 1, "count": t.eval_count}
        telemetry.evaluation(run_state.task.quality_scores(features), run_state.step, about)
