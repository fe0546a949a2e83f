"""Parallelism and compilation applied from the outside of a single-device network
(as torchtitan's ``parallelize_*`` functions do): DDP, its gradient communication and
``torch.compile`` (with CUDA graphs where a training step can replay as one)."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from typing import Any, cast

import torch

from diffscale.config import CompileMode, Recipe, RunConfig, Toggle
from diffscale.errors import UserError
from diffscale.runtime.compile_cache import CompileCache
from diffscale.runtime.device import DevicePolicy, on_side_stream, recording_stream
from diffscale.runtime.distributed import DistContext

DIFFUSERS_VERSION_CHECKS = (r"(?s)Dynamo detected a call to a `functools.lru_cache`-wrapped function"
                            r".*[/\\]diffusers[/\\]")
"""Dynamo's warning on each of diffusers' cached ``is_torch_version`` calls that a compiled network
traces (its up- and downsampling blocks under bf16, about a dozen lines a job that end "Silent
incorrectness is only a *potential* risk"): a version check is constant in a process, so the
cache dynamo skips changes nothing, and the warning is filtered for every compile diffscale does."""
warnings.filterwarnings("ignore", message=DIFFUSERS_VERSION_CHECKS, category=UserWarning)


def parallelize(net: torch.nn.Module, *, cfg: RunConfig, ctx: DistContext, policy: DevicePolicy,
                say: Callable[[str], None], whole_steps: bool = False,
                cache: CompileCache | None = None) -> torch.nn.Module:
    """``net`` as training runs it: wrapped in DDP when distributed, then compiled where the policy
    says. ``whole_steps``: the step around it is recorded as one CUDA graph (``step_graph.py``),
    so the network compiles without CUDA graphs of its own. ``cache``: the traced network saved by
    an earlier job is installed instead of traced (``runtime.compile_cache``)."""
    model: torch.nn.Module = net
    if ctx.distributed:
        model = wrap_ddp(net, ctx, cfg, policy, recorded=whole_steps)
    if not policy.compile:
        return model
    return compile_network(model, cfg=cfg, policy=policy, say=say, whole_steps=whole_steps, cache=cache)


def compile_network(model: torch.nn.Module, *, cfg: RunConfig, policy: DevicePolicy, say: Callable[[str], None],
                    whole_steps: bool = False, cache: CompileCache | None = None) -> torch.nn.Module:
    """``model`` (the network, or its DDP wrapper) compiled as training runs it: ``parallelize``'s
    second half, also called on its own by a run that trained eager until its kernels were built
    (``runtime.compile_while_training``)."""
    # ddp_graph_split off: the all-reduces follow one whole backward
    torch._dynamo.config.optimize_ddp = ddp_graph_split(cfg.runtime.ddp_graph_split, whole_steps)
    mode = CompileMode.DEFAULT if whole_steps and cfg.runtime.compile_mode == CompileMode.AUTO else \
        training_compile_mode(cfg, policy)
    if cfg.runtime.compile_mode == CompileMode.REDUCE_OVERHEAD and mode != CompileMode.REDUCE_OVERHEAD:
        say(f"[yellow]runtime.compile_mode reduce-overhead needs train.grad_accum 1 on CUDA "
            f"(this run: {cfg.train.grad_accum} on {policy.device.type}): compiling without CUDA graphs[/]")
    tune = cfg.runtime.kernel_tuning == Toggle.ON
    options = compile_options(mode.value, policy.layout_opt, tune)
    if cache is not None and cache.active:
        return cache.compile(model, options, calls_under=policy.autocast)
    # torch.compile of a Module returns an OptimizedModule (typed as a plain callable)
    return cast(torch.nn.Module, torch.compile(model, options=options))


def training_compile_mode(cfg: RunConfig, policy: DevicePolicy) -> CompileMode:
    """The mode training compiles with. CUDA graphs (``reduce-overhead``, also what ``auto``
    picks) replay the compiled forward/backward on CUDA with one micro-step a step: a second
    micro-step's replay would overwrite the gradients of the first."""
    mode = cfg.runtime.compile_mode
    if mode not in (CompileMode.AUTO, CompileMode.REDUCE_OVERHEAD):
        return mode
    replayable = policy.compile and policy.device.type == "cuda" and cfg.train.grad_accum == 1
    return CompileMode.REDUCE_OVERHEAD if replayable else CompileMode.DEFAULT


def trains_in_cuda_graphs(cfg: RunConfig, policy: DevicePolicy) -> bool:
    return training_compile_mode(cfg, policy) == CompileMode.REDUCE_OVERHEAD


def compile_options(mode: str, layout_opt: bool, tune_kernels: bool = False) -> dict[str, Any]:
    """Inductor options of ``torch.compile(mode=mode)``, plus the forced layout optimisation and
    coordinate-descent kernel tuning (``torch.compile`` takes a mode or options, not both)."""
    from torch._inductor import list_mode_options

    options = dict(list_mode_options(mode))
    if layout_opt:
        options["force_layout_optimization"] = True
    if tune_kernels:
        options["coordinate_descent_tuning"] = True
    return options


def wrap_ddp(net: torch.nn.Module, ctx: DistContext, cfg: RunConfig, policy: DevicePolicy,
             recorded: bool = False) -> torch.nn.Module:
    """DDP around ``net``. ``recorded``: its steps will be recorded as CUDA graphs, which needs
    DDP built on a side stream (PyTorch's notes on CUDA graphs with DistributedDataParallel)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    kwargs: dict[str, Any] = {}
    if policy.device.type == "cuda":
        kwargs["device_ids"] = [policy.device.index]
    if cfg.runtime.recipe == Recipe.FAST:
        # Larger buckets mean fewer all-reduce launches; bucket views avoid a gradient copy.
        kwargs.update(bucket_cap_mb=cfg.runtime.ddp_bucket_mb, gradient_as_bucket_view=True)
    with on_side_stream(recording_stream(policy.device)) if recorded else contextlib.nullcontext():
        model = DDP(net, **kwargs)
    if bf16_gradient_compression(cfg.runtime.ddp_bf16_compress, ctx.backend):
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        model.register_comm_hook(None, default_hooks.bf16_compress_hook)
    return model


def ddp_graph_split(setting: Toggle, whole_steps: bool) -> bool:
    """Whether compiled DDP splits the network's graph at gradient buckets. ``auto``: where each
    step is recorded as one CUDA graph. The split lets each bucket's all-reduce overlap the rest
    of the backward pass; with the host out of the way that gain is what is left (policies scaled
    better with it: docs/decisions.md, "Policy DDP steps recorded as one CUDA graph"), while with
    eager steps the split's layout copies and lost fusion cost more than NVLink all-reduces take
    (docs/decisions.md, "DDP: the graph split per bucket")."""
    return setting == Toggle.ON or (setting == Toggle.AUTO and whole_steps)


def bf16_gradient_compression(setting: Toggle, backend: str) -> bool:
    """Whether DDP all-reduces bf16 copies of the gradients. ``auto`` is off: over NVLink every
    preset scaled better without it, the casts costing more than the halved transfer saves
    (docs/decisions.md, "bf16 gradient compression"); ``on`` is for links where bytes cost more."""
    if setting == Toggle.ON and backend != "nccl":
        raise UserError(f"runtime.ddp_bf16_compress on needs CUDA GPUs with NCCL (this run all-reduces with {backend})",
                        "set runtime.ddp_bf16_compress to auto or off")
    return setting == Toggle.ON
