"""The ``runtime:`` section of a run's config: device, precision, compilation, parallelism and
the process group, none of which changes what a run computes, only where and how fast."""

from __future__ import annotations

from dataclasses import dataclass

from diffscale.config.choices import Attention, CompileMode, Device, Precision, Recipe, Toggle
from diffscale.config.errors import fail as _fail

RUNTIME_OUTSIDE_GRAPH = frozenset({"cudnn_benchmark", "cudnn_benchmark_eager", "compile_cache", "generated_bytecode",
                                   "compile_while_training", "eager_pauses_for_tuning"})
"""Runtime settings that leave the compiled graph as it is (runs that differ only there share kernels)."""


@dataclass(kw_only=True)
class RuntimeConfig:
    """Hardware and distributed settings; the same config runs on every device."""

    device: Device = Device.AUTO
    """Device; ``auto`` picks CUDA, then MPS, then CPU."""
    precision: Precision = Precision.AUTO
    """Forward/backward precision."""
    recipe: Recipe = Recipe.FAST
    """``fast`` (default) or ``plain`` (the common recipe, for benchmarks)."""
    compile: Toggle = Toggle.AUTO
    """torch.compile the network (``auto``: on CUDA only; ``diffscale sample`` and ``eval`` then run
    a job eager for its first 30 s and compile only if it goes on, as most end sooner than a compile;
    ``on``: compiled from the first call)."""
    compile_while_training: Toggle = Toggle.AUTO
    """``diffscale train``: a compiled run's first steps run eager (bf16 autocast, fused AdamW, the
    data on the device: everything of the fast recipe that needs no compiler) while a background
    process builds the same step compiled into the kernel cache; once it has, every rank compiles
    from that cache at the same step (it looks every 10 steps) and trains on compiled (the log says ``eager while
    compiling``, then ``compiled from step N``; metrics.jsonl a ``compiled`` and a ``compiled_speed``
    record; the process's output ``RUN_DIR/background-compile.log``). A cold first step waited
    minutes for inductor before. ``auto``: on for compiled training on CUDA whose data does not
    arrive over time (a spool), unless the kernel cache holds a whole build of the step already (a
    warm start compiles before its first step, in seconds, and reaches its compiled speed sooner);
    ``on``: wherever the run compiles (the CPU too), warm or cold; ``off``: compile before the first
    step, as bench and the online trainer do. No effect where
    ``runtime.compile`` is off. Not part of the compiled graph (docs/decisions.md, "Training while
    the step compiles")."""
    compile_mode: CompileMode = CompileMode.AUTO
    """torch.compile mode when compiling: ``auto`` (CUDA graphs where a step can replay as one,
    see docs/benchmarks.md, "Defaults and why"), ``default``, ``reduce-overhead`` or ``max-autotune-no-cudagraphs``."""
    channels_last: Toggle = Toggle.AUTO
    """channels_last memory format (``auto``: on CUDA when not compiled; see docs/benchmarks.md, "Defaults and why")."""
    layout_opt: Toggle = Toggle.AUTO
    """Inductor's layout optimisation when compiled: convolutions run channels_last inside the
    graph, with no layout copies between them (``auto``: on for training on CUDA, where it was
    measured; inductor's own heuristic leaves it off for UNets)."""
    kernel_tuning: Toggle = Toggle.OFF
    """Inductor's coordinate-descent tuning of each Triton kernel's launch settings when compiled
    (training and sampling): a little faster, for a much longer first compile (cached after); off
    by default for that (docs/decisions.md, "Coordinate-descent kernel tuning")."""
    cudnn_benchmark: Toggle = Toggle.AUTO
    """cuDNN times every algorithm for each convolution shape at its first call and keeps the
    fastest (``torch.backends.cudnn.benchmark``): steadier steps for a longer first step of every
    job, resumed ones too (``auto``: on CUDA; no effect elsewhere). Not part of the compiled graph."""
    cudnn_benchmark_eager: Toggle = Toggle.OFF
    """cuDNN's algorithm search in the eager steps of a run that trains while compiling
    (``runtime.compile_while_training``), where ``runtime.cudnn_benchmark`` searches at all:
    ``on`` from the first eager step; ``off`` (default): cuDNN's heuristics until the compiled
    step, whose convolutions then search. On a machine whose CUDA JIT cache (``~/.nv/ComputeCache``)
    is empty the search compiles kernels first: small's cold first step on an H200 came at 25.8 s
    with it and 10.8 s without, for eager steps 20 % slower until the switch, which came at the same
    time (docs/decisions.md, "cuDNN's algorithm search in the eager steps"). Not part of the compiled graph."""
    eager_pauses_for_tuning: Toggle = Toggle.ON
    """In a run that trains while compiling (``runtime.compile_while_training``), the eager steps
    pause while the background process times kernel configurations on the GPU (Triton's
    autotuning, in bursts of seconds), their queued kernels run first: with the GPU busy beside it
    that timing took 21.6 s instead of 9.7 s and the compile 118 s instead of 95 s (small, cold, an
    H200; docs/decisions.md, "Training while the step compiles"). ``off``: the eager steps run
    throughout (``auto``: on). Not part of the compiled graph."""
    compile_cache: Toggle = Toggle.AUTO
    """Keep dynamo's traced network with the compiled kernels (the kernel folder's dynamo/, torch's
    caching precompile), so a resumed job or a new run of the same network installs it instead of
    tracing the network again. Written once, after the first step; one process only (a
    distributed run traces as before); an entry for another config or torch is discarded.
    ``auto``: on for compiled training on CUDA, where it held in every round on one H100 (torch 2.11,
    2026-11-28): small's resumed jobs started in 16.4-22.0 s instead of 30-37 s, medium's in 23.5 s
    instead of 53.5 s, at the same steady speed (docs/measurements/2026-11-28.md, "The traced network
    cached too"); ``on`` also where it was not measured (the CPU). An entry that cannot be installed is
    discarded and its traceback kept in the kernel folder's ``traced-network-discarded.txt``; a job
    that traces although an entry was installed names the failed guard in a warning and in
    ``traced-network-retraced.txt``. Not part of the compiled graph."""
    generated_bytecode: Toggle = Toggle.AUTO
    """Load the Python that torch's compiler generates (the code running each compiled graph, its
    kernels' modules) through Python's bytecode cache: the first job writes the bytecode beside
    the kernels, later jobs read it instead of compiling that source again, which torch does in
    every process (``runtime/generated_code.py``): 0.42-0.44 s -> 0.23-0.34 s of a resumed small or
    medium job's start on a 2 x H200 host (docs/measurements/2026-11-28.md, "The generated code's
    bytecode kept").
    ``auto``: on wherever the run compiles; ``off``: torch's own loader. Not part of the compiled graph."""
    step_graph: Toggle = Toggle.AUTO
    """CUDA: each optimizer step (forward, backward, clipping, fused AdamW, EMA) recorded once as
    one CUDA graph and replayed, so a small network's step is not bound by kernel launches.
    Needs one process or NCCL between processes (DDP's all-reduces are recorded too), ``train.grad_accum``
    1, the fast recipe and no fp16 loss scaling. ``auto``: on where that holds and the task was measured
    faster with it: fields on one GPU, policies under DDP (docs/benchmarks.md, "Field diffusion",
    "Diffusion policy")."""
    sampling_graph: Toggle = Toggle.AUTO
    """DDIM sampling on CUDA: the whole denoising loop (every network call and scheduler update)
    recorded once per batch shape as one CUDA graph and replayed per call, so a small network's
    sampling is not bound by kernel launches. ``auto``: on where sampling compiles on CUDA;
    ``off``: one graph per network call, the loop in Python (docs/measurements/2026-11-26.md,
    "Sampling latency")."""
    attention: Attention = Attention.AUTO
    """Attention kernel on CUDA. ``auto``: FlexAttention for compiled training where a call has many
    (batch x heads) rows of narrow heads, where it measured faster (docs/benchmarks.md, "Attention kernels"), else
    ``sdpa`` (PyTorch picks a kernel per call); ``flex``: FlexAttention always (compiled CUDA only);
    ``flash``, ``efficient``, ``cudnn``, ``math``: that SDPA kernel only."""
    cpu_threads: int = 0
    """Threads of a CPU rank's operations (``torch.set_num_threads``). ``0`` (auto): the CPUs this
    rank may use less those other processes keep busy now (their busy share over 0.2 s; other
    cores do not count), at least 1, unless ``OMP_NUM_THREADS`` is set; a thread per core on a
    machine whose cores are taken makes the threads wait for each other
    (docs/measurements/2026-11-27.md, "CPU training beside busy processes")."""
    join_timeout_s: float = 300.0
    """Seconds to wait for all ranks to join before failing with a diagnosis."""
    collective_timeout_s: float = 1800.0
    """Timeout of each collective (NCCL/gloo) after start-up."""
    ddp_bucket_mb: int = 100
    """DDP gradient bucket size in MiB (the fast recipe; the plain one uses DDP's default 25)."""
    ddp_graph_split: Toggle = Toggle.AUTO
    """Compiled DDP: split the graph at gradient buckets so each bucket's all-reduce overlaps the
    rest of the backward pass (dynamo's DDPOptimizer). ``auto``: on where each step is recorded
    as one CUDA graph (``runtime.step_graph``), else off: with eager steps every split boundary's
    layout copies and lost fusion cost more than NVLink all-reduces take."""
    ddp_bf16_compress: Toggle = Toggle.AUTO
    """Compress gradients to bf16 for the all-reduce (NCCL only). ``auto``: off, which scaled
    better on NVLink for every preset (docs/decisions.md, "bf16 gradient compression"); ``on`` halves the bytes moved,
    for slow links between nodes."""

    def __post_init__(self) -> None:
        if isinstance(self.cpu_threads, bool) or not isinstance(self.cpu_threads, int) \
                or not 0 <= self.cpu_threads <= 4096:
            _fail("runtime.cpu_threads", f"{self.cpu_threads!r} is not a whole number from 0 to 4096",
                  "use 0 (auto: the free cores) or the number of threads, e.g. 2")
        if self.join_timeout_s <= 0:
            _fail("runtime.join_timeout_s", "must be positive", "use e.g. 300")
        if self.collective_timeout_s <= 0:
            _fail("runtime.collective_timeout_s", "must be positive", "use e.g. 1800")
        if self.ddp_bucket_mb < 1:
            _fail("runtime.ddp_bucket_mb", "must be at least 1", "use e.g. 25 or 100")
