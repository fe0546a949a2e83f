"""The network as sampling runs it: autocast, channels_last images, compiled on CUDA with
CUDA graphs and frozen weights; DDIM's whole loop replayed as one graph (``graphed.py``). One
sampling job (``diffscale sample``, ``eval``) under ``runtime.compile auto`` runs eager first and
compiles only once it has sampled for ``ONE_JOB_EAGER_S``: most such jobs end sooner than a compile."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator
from typing import Any

import torch

from diffscale.config import RuntimeConfig, Toggle
from diffscale.diffusion.graphed import LoopCache
from diffscale.errors import UserError
from diffscale.io.stages import stage
from diffscale.runtime.device import DevicePolicy, configure_backends, inference_policy
from diffscale.runtime.flex_attention import use_flex_attention
from diffscale.runtime.parallelize import compile_options

ONE_JOB_EAGER_S = 30.0
"""Seconds one sampling job runs eager before it compiles (``runtime.compile auto``). Compiling small's
sampling network took 35-44 s on an empty kernel cache and 21-27 s on a warm one, while its eager
evaluation of 256 samples sampled in under 3 s (one H200, docs/measurements/2026-11-30.md,
"Where an evaluation's time goes"). Renting before buying: a job compiles once it has spent about
a compile's cost eager, so it never takes more than about twice its time compiled first, and a
short one pays no compile."""


class InferenceNetwork(torch.nn.Module):
    """A trained network for sampling, called like the network (``x_t, t, *condition``).

    Compiled, the weights are frozen into the graph (inductor's ``freezing``: the bf16 copies
    autocast would make on every call are made once, constant-folded), measured faster
    (docs/decisions.md, "Sampling with frozen weights"). So weights changed
    after the first call are not seen: build a new ``InferenceNetwork`` for new weights
    (training previews sample the EMA network eagerly, so they always see its latest weights).

    ``eager_first_s``: a compiled network calls the network eagerly until that many seconds have
    passed since its first call, then compiles (None: compiled from the first call)."""

    def __init__(self, net: torch.nn.Module, policy: DevicePolicy, tune_kernels: bool = False,
                 loop_graphs: bool = False, live: bool = False, cpp_wrapper: bool = False,
                 eager_first_s: float | None = None) -> None:
        super().__init__()
        self.policy = policy
        self._loops: LoopCache | None = LoopCache() if loop_graphs and policy.device.type == "cuda" else None
        self._eager_until: float | None = eager_first_s if policy.compile else None
        """Seconds after the first call from which calls run compiled; None: compiled (or eager) throughout."""
        self._first_call: float | None = None
        net = net.eval().requires_grad_(False)
        if policy.flex_min_rows is not None:
            use_flex_attention(net, policy.flex_min_rows)
        if policy.channels_last:
            # Module.to(memory_format=...) is supported; torch's overloads of `to` leave it out
            net = net.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        # CUDA graphs ("reduce-overhead") replay a whole denoising call as one launch: a
        # sampling step of a small network is otherwise bound by kernel launches, not the GPU.
        # dynamic=False: one sampling run uses one batch shape; a new shape records once more.
        # live: weights are read at each call (not frozen), for a network updated in place
        options = sampling_compile_options(policy, tune_kernels, cpp_wrapper)
        self.graphs = bool(options.get("triton.cudagraphs"))
        self.frozen = policy.compile and not live
        self.run = torch.compile(net, options=options, dynamic=False) if policy.compile else net
        # Inside a recorded loop the network must not record graphs of its own. A module of its
        # own: dynamo keeps compiled code per function, and the network's forward has self.run's.
        step = _LoopStep(net, policy)
        plain = compile_options("default", policy.layout_opt, tune_kernels)
        compiled = policy.compile and self._loops is not None
        self._step = torch.compile(step, options=plain, dynamic=False) if compiled else step
        self._eager_step = step
        self._compiled_calls: set[str] = set()
        """The compiled calls made once (their compile said and timed): forward, loop step."""
        self.eval()  # sampling leaves a network in eval mode alone (sampler.evaluating)

    @property
    def loops(self) -> LoopCache | None:
        """Whole DDIM loops recorded as CUDA graphs (``sampler.sample`` replays them, reading this at
        each call), or None: while eager, and where the per-call network has compiled instead (a
        job that turned compiled in the middle of a loop compiles once, not twice)."""
        if self._loops is None or "the network" in self._compiled_calls or not self._compiled_now():
            return None
        return self._loops

    def _compiled_now(self) -> bool:
        """Whether this call runs compiled: where the network compiles, from its first call, or
        once it has run eager for ``eager_first_s`` (said when it turns)."""
        if self._eager_until is None:
            return self.policy.compile
        now = time.perf_counter()
        if self._first_call is None:
            self._first_call = now
        if now - self._first_call < self._eager_until:
            return False
        stage(f"sampling network: this job has sampled eagerly for {now - self._first_call:.0f} s; it compiles "
              "for the rest (a shorter job ends before a compile pays)")
        self._eager_until = None
        return True

    @contextlib.contextmanager
    def _first_compile(self, call: str) -> Iterator[None]:
        """Around a compiled call: the first says that it compiles and how long it took (a minute or
        more where the kernel cache is cold, before the first sampling step reports anything)."""
        if not self.policy.compile or call in self._compiled_calls:
            yield
            return
        self._compiled_calls.add(call)
        stage(f"sampling network: compiling for {self.policy.device.type} ({call}; kernels are cached "
              "for later runs on this machine)")
        start = time.perf_counter()
        yield
        stage(f"sampling network: compiled in {time.perf_counter() - start:.1f} s ({call})")

    def _compiling(self) -> contextlib.AbstractContextManager[Any]:
        """Inductor's freezing, where weights are frozen, for whatever compiles inside. It must be
        set in inductor's config while a call compiles: given as a ``torch.compile`` option it
        did not apply (torch 2.11/2.13: the weights stayed graph inputs and were cast to bf16 at
        every call, as extra kernels in each call)."""
        return torch._inductor.config.patch(freezing=True) if self.frozen else contextlib.nullcontext()

    def loop_step(self, x: torch.Tensor, t: torch.Tensor, *condition: torch.Tensor) -> torch.Tensor:
        """One network call inside a loop being recorded (``sampler.sample``)."""
        with self._compiling(), self._first_compile("the network inside the recorded DDIM loop"):
            return self._step(x, t, *condition)

    def forward(self, x: torch.Tensor, t: torch.Tensor, *condition: torch.Tensor) -> torch.Tensor:
        if not self._compiled_now():
            return self._eager_step(x, t, *condition)
        if self.policy.channels_last and x.dim() == 4:  # the memory format exists for image batches only
            x = x.contiguous(memory_format=torch.channels_last)
        if self.graphs:
            torch.compiler.cudagraph_mark_step_begin()  # the previous call's output is consumed
        with self.policy.autocast(), self._compiling(), self._first_compile("the network"):
            out = self.run(x, t, *condition)
        return out.clone() if self.graphs else out  # a graph's output buffer is reused by the next replay


class _LoopStep(torch.nn.Module):
    """One network call inside a loop being recorded as a CUDA graph, or an eager call (precision
    and layout as ``InferenceNetwork.forward`` sets them)."""

    def __init__(self, net: torch.nn.Module, policy: DevicePolicy) -> None:
        super().__init__()
        self.net = net
        self.policy = policy

    def forward(self, x: torch.Tensor, t: torch.Tensor, *condition: torch.Tensor) -> torch.Tensor:
        if self.policy.channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        with self.policy.autocast():
            return self.net(x, t, *condition)


def sampling_compile_options(policy: DevicePolicy, tune_kernels: bool = False,
                             cpp_wrapper: bool = False) -> dict[str, Any]:
    """Inductor options for sampling: CUDA graphs on CUDA and the layout optimisation only where
    set on (``auto`` keeps inductor's own choice, as measured). Freezing is set around the calls
    (``InferenceNetwork._compiling``). ``cpp_wrapper``: on the CPU the compiled call runs through
    inductor's C++ wrapper, for a small network whose call is otherwise bound by the Python code
    that calls each kernel (docs/measurements/2026-11-27.md, "Policy controller")."""
    graphs = policy.compile and policy.device.type == "cuda"
    options = compile_options("reduce-overhead" if graphs else "default", policy.layout_opt, tune_kernels)
    if cpp_wrapper and policy.compile and policy.device.type == "cpu":
        options["cpp_wrapper"] = True
    return options


def sampling_network(net: torch.nn.Module, runtime: RuntimeConfig, live: bool = False,
                     many_calls: bool = False, one_job: bool = False) -> InferenceNetwork:
    """``net`` as `diffscale sample` runs it on its device: bf16 + channels_last + compiled
    with CUDA graphs and frozen weights on CUDA, fp32 eager elsewhere (``inference_policy``);
    ``runtime.kernel_tuning`` tunes its kernels as it does training's; ``runtime.sampling_graph``
    replays whole DDIM loops. ``live``: weights are not frozen, so in-place updates are seen.
    ``many_calls``: the network serves many calls in this process (a policy controller's
    re-plans), so under ``runtime.compile auto`` it compiles on the CPU too, through inductor's C++
    wrapper, the compile paid once. ``one_job``: the network serves one sampling job (``diffscale
    sample``, ``eval``), so under ``runtime.compile auto`` it runs eager for the job's first
    ``ONE_JOB_EAGER_S`` and compiles only if the job goes on (``on``: compiled from the first call)."""
    policy = inference_policy(runtime, next(net.parameters()).device)
    if many_calls and runtime.compile == Toggle.AUTO and policy.device.type == "cpu":
        policy = dataclasses.replace(policy, compile=True)
    configure_backends(policy)
    if runtime.sampling_graph == Toggle.ON and policy.device.type != "cuda":
        raise UserError(f"runtime.sampling_graph on needs a CUDA GPU (this run samples on {policy.device.type})",
                        "set runtime.sampling_graph to auto or off")
    loops = runtime.sampling_graph == Toggle.ON or (runtime.sampling_graph == Toggle.AUTO and policy.compile)
    eager_first_s = ONE_JOB_EAGER_S if one_job and runtime.compile == Toggle.AUTO else None
    return InferenceNetwork(net, policy, tune_kernels=runtime.kernel_tuning == Toggle.ON, loop_graphs=loops,
                            live=live, cpp_wrapper=many_calls, eager_first_s=eager_first_s)
