"""Building a run, once for every caller: config -> device and process group (``join``), then
task, network, EMA, optimizer, data, restore and compilation (``build_run``). The training loop,
the online trainer and the benchmarks all call these (torchtitan's Trainer builds its parts in
one place for the same reason: a step measured by a benchmark is the step users train with).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from rich.console import Console

from diffscale.config import RunConfig, Toggle
from diffscale.data.feed import Feed
from diffscale.io.kernels import build_name, holds_files, kernels_root, mark_step_built
from diffscale.runtime import checkpoint as ckpt
from diffscale.runtime import user_env
from diffscale.runtime.compile_cache import CompileCache, open_compile_cache
from diffscale.runtime.device import DevicePolicy, configure_backends, cudnn_search, pick_device, resolve_policy
from diffscale.runtime.distributed import DistContext, LaunchInfo, detect_launch, init_distributed
from diffscale.runtime.flex_attention import sdpa_attention
from diffscale.runtime.parallelize import compile_network, parallelize
from diffscale.runtime.resources import cpus_for_rank, free_threads_unless_set
from diffscale.training.state import RunState
from diffscale.training.step import StepRunner
from diffscale.training.step_graph import records_whole_steps

Say = Callable[[str], None]


def _quiet(text: str) -> None:
    """A ``say`` that drops what it is told (benchmarks)."""


def join(cfg: RunConfig, console: Console, *, one_process: bool = False) -> tuple[DistContext, DevicePolicy]:
    """This process's device, precision policy and place in the run: the ranks of torchrun, srun or
    a Grid Engine PE, or one process (``one_process``: whatever launched it, as the online trainer
    runs inside a simulation's own ranks)."""
    launch = LaunchInfo(launcher="single") if one_process else detect_launch()
    device = pick_device(cfg.runtime.device, launch.local_rank)
    policy = resolve_policy(cfg.runtime, device)
    configure_backends(policy)
    if device.type == "cpu":
        set_cpu_threads(cfg.runtime.cpu_threads, launch.local_world_size, console)
    if one_process:
        return DistContext(launch, device), policy
    ctx = init_distributed(launch, device, join_timeout_s=cfg.runtime.join_timeout_s,
                           collective_timeout_s=cfg.runtime.collective_timeout_s)
    return ctx, policy


def set_cpu_threads(asked: int, local_world_size: int, console: Console) -> None:
    """``runtime.cpu_threads``, else (unless ``OMP_NUM_THREADS`` is set) the cores this rank may use
    that other processes leave free: threads beyond them, and several CPU ranks on one host each
    starting a thread per core, wait for each other and slow every step many times over."""
    if asked:
        torch.set_num_threads(asked)
        return
    threads = free_threads_unless_set(local_world_size)
    if threads is None:
        return
    if threads < cpus_for_rank(local_world_size):
        console.print(f"note: other processes keep this machine's cores busy: training with {threads} CPU thread"
                      f"{'s' if threads > 1 else ''} of {cpus_for_rank(local_world_size)} (set runtime.cpu_threads "
                      "to choose)", highlight=False)
    torch.set_num_threads(threads)


@dataclass
class Run:
    """A built run: its state, the step that trains it, and the compiled-network cache it steps
    under. ``close`` (or leaving ``with``) ends the cache's use and the data stream."""

    state: RunState
    runner: StepRunner
    whole_steps: bool
    """Whether each optimizer step replays as one recorded CUDA graph."""
    compile_cache: CompileCache
    compile_dir: Path | None = None
    """The kernel cache of a compiled run (None: not compiled or not asked)."""
    say: Say = _quiet
    eager_until_compiled: contextlib.ExitStack | None = field(default=None, repr=False)
    """A compiled run that steps eager until ``compile``: the stand-ins its eager steps use (SDPA
    for FlexAttention, a kernel only the compiler generates; cuDNN without its algorithm search
    under ``runtime.cudnn_benchmark_eager off``); None once compiled, or never eager."""

    @property
    def eager(self) -> bool:
        """Steps run eager until ``compile`` (``build_run``'s ``eager_first``)."""
        return self.eager_until_compiled is not None

    def compile(self) -> None:
        """Compile the network of an ``eager_first`` run now, through the kernel cache as a compiled
        run does from its first step: the next step runs compiled. Kernels a background process
        built into that cache are loaded, not compiled again."""
        assert self.eager_until_compiled is not None, "compiled already"
        self.eager_until_compiled.close()
        self.eager_until_compiled = None
        state = self.state
        self.compile_cache, self.compile_dir = _open_kernels(state, state.run_dir, self.say, None)
        self.compile_cache.__enter__()
        model = compile_network(self.runner.model, cfg=state.cfg, policy=state.policy, say=self.say,
                                whole_steps=self.whole_steps, cache=self.compile_cache)
        self.runner.use_compiled(model)

    def mark_step_built(self) -> None:
        """After a step that ran compiled: its kernel folder holds a whole build of the step, which
        the next run of this network compiles from before its first step (``io/kernels.py``)."""
        if self.compile_dir is not None and not self.eager:
            mark_step_built(self.compile_dir, self.state.cfg.kernels_built_for())

    def close(self) -> None:
        try:
            self.runner.batcher.close()
        finally:
            if self.eager_until_compiled is not None:
                self.eager_until_compiled.close()
            self.compile_cache.__exit__(None, None, None)

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def new_run_state(cfg: RunConfig, run_dir: Path, ctx: DistContext, policy: DevicePolicy, *, console: Console,
                  checkpoint: ckpt.TrainingState | None = None,
                  prepare: Callable[[RunState], None] | None = None) -> RunState:
    """Task, network, EMA and optimizer of ``cfg`` (identical initial weights on every rank), a
    step graph it cannot have refused, ``prepare``'s checks (before anything is restored), then
    ``checkpoint`` restored. ``build_run`` starts here; bench's plain recipe takes only this."""
    state = RunState(cfg, run_dir, ctx, policy, console)
    records_whole_steps(state)  # a runtime.step_graph this run cannot have is refused before anything else
    if prepare is not None:
        prepare(state)
    if checkpoint is not None:
        state.restore(checkpoint)
    return state


def build_run(cfg: RunConfig, run_dir: Path, ctx: DistContext, policy: DevicePolicy, *, console: Console,
              say: Say = _quiet, checkpoint: ckpt.TrainingState | None = None,
              prepare: Callable[[RunState], None] | None = None, compile_cache: bool = False,
              feed: Callable[[RunState], Feed] | None = None,
              announce: Callable[[RunState, bool], None] | None = None, eager_first: bool = False,
              kernels: Path | None = None) -> Run:
    """The run of ``cfg`` in ``run_dir`` on ``ctx``/``policy``, ready to step: ``new_run_state``,
    then the network parallelized from outside (DDP, torch.compile, CUDA graphs) and the step
    runner on the data from the state's position. ``compile_cache``: compiled kernels (and, where
    ``runtime.compile_cache`` allows, the traced network) kept in the user's cache folder for the
    next run of this network, and what the wait for the first step will be said; ``feed``: how a
    batcher that waits for data reports; ``announce(state, whole_steps)``: called once the state
    is restored, before anything compiles or waits for data (the loop's banner). ``eager_first``:
    a compiled run steps eager until ``Run.compile`` (``runtime.compile_while_training``);
    ``kernels``: the kernel folder to compile into instead of the run's own (a background compile:
    its training process's folder)."""
    state = new_run_state(cfg, run_dir, ctx, policy, console=console, checkpoint=checkpoint, prepare=prepare)
    whole_steps = records_whole_steps(state)
    if announce is not None:
        announce(state, whole_steps)
    eager = eager_first and policy.compile
    cache, compile_dir = CompileCache(say=say), None
    if compile_cache and policy.compile and not eager:
        cache, compile_dir = _open_kernels(state, run_dir, say, kernels)
    cache.__enter__()  # caching precompile on for this run's compile and steps only (Run.close ends it)
    stand_ins = contextlib.ExitStack()
    try:
        if eager:
            stand_ins.enter_context(sdpa_attention(state.net))
            if policy.cudnn_benchmark and cfg.runtime.cudnn_benchmark_eager == Toggle.OFF:
                stand_ins.enter_context(cudnn_search(False))  # the compiled step's convolutions search
            model = parallelize(state.net, cfg=cfg, ctx=ctx, policy=_uncompiled(policy), say=say,
                                whole_steps=whole_steps)
        else:
            model = parallelize(state.net, cfg=cfg, ctx=ctx, policy=policy, say=say, whole_steps=whole_steps,
                                cache=cache)
        if feed is not None:
            state.feed = feed(state)
        runner = StepRunner(state, model, state.make_batcher(), eager=eager)
    except BaseException:
        stand_ins.close()
        cache.__exit__(None, None, None)
        raise
    return Run(state, runner, whole_steps, cache, compile_dir, say=say,
               eager_until_compiled=stand_ins if eager else None)


def _uncompiled(policy: DevicePolicy) -> DevicePolicy:
    """``policy`` with compilation off: what an ``eager_first`` run's steps run until it compiles."""
    return dataclasses.replace(policy, compile=False)


def _open_kernels(state: RunState, run_dir: Path, say: Say, kernels: Path | None) -> tuple[CompileCache, Path]:
    """The kernel folder this run compiles into (``kernels``, else ``run_compile_cache``'s) and the
    traced-network cache in it (``runtime.compile_cache``), with the note on what the compile will take."""
    cfg, ctx, policy = state.cfg, state.ctx, state.policy
    own_cache = user_env.USER_COMPILE_CACHE is None
    if kernels is not None:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(kernels)
        compile_dir = kernels
    else:
        compile_dir = run_compile_cache(run_dir, cfg, ctx.world_size, policy.name)
    cache = open_compile_cache(cfg, compile_dir, world_size=ctx.world_size, own_cache=own_cache, net=state.net,
                               say=say, on_cuda=policy.device.type == "cuda")
    say(compile_note(compile_dir, cache))
    if cache.why_not:
        say(cache.why_not)
    return cache, compile_dir


def run_compile_cache(run_dir: Path, cfg: RunConfig, world_size: int, device_name: str) -> Path:
    """Where compiled kernels go: the user's kernel cache, one folder per device kind, torch release
    and compiled graph (``DIFFSCALE_CACHE_DIR``/kernels/BUILD/GRAPH_KEY, ``~/.cache/diffscale`` by
    default; ``io/kernels.py``), so a new run of a network compiled before -- another seed,
    learning rate or data fraction -- and a job resumed on another node both find the kernels
    instead of compiling for minutes, and GPU kinds sharing a home keep theirs apart. A run that
    kept its own (``RUN_DIR/cache/inductor``, before runs shared them) keeps using it, and
    ``TORCHINDUCTOR_CACHE_DIR`` set by the user wins. Set over torch's own default, which torch
    writes into the variable as soon as anything asks for its cache (node-local /tmp: resumed
    jobs on another node compiled again)."""
    if user_env.USER_COMPILE_CACHE is None:
        own = run_dir.resolve() / "cache" / "inductor"
        shared = kernels_root().resolve() / build_name(device_name, torch.__version__) / cfg.graph_key(world_size)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(own if own.is_dir() and any(own.iterdir()) else shared)
    return Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])


def compile_note(cache_dir: Path, traced: CompileCache | None = None) -> str:
    """What the wait before the first step is: compiling, for the first time or from cached kernels,
    and with ``runtime.compile_cache`` whether the traced network comes from the cache too.
    (A first compile takes minutes on a GPU host: docs/benchmarks.md, "Start-up and compile time".)"""
    cached = holds_files(cache_dir)
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
