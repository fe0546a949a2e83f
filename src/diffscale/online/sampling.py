"""``OnlineTrainer.sample`` with as little host work per call as the GPU allows.

A call of the users' size (80 cells x 16 members x 50 DDIM steps) is a few milliseconds on a
GPU, so what the host does around it counts: before, a call built tensors from numpy, moved
the condition and the start noise to the device in two pageable copies, standardised and
repeated the condition in separate launches, copied the result back pageable, undid the
normalisation on the CPU and concatenated it. Here the whole call -- repeat, standardise,
the DDIM loop, back to data units -- is one recorded CUDA graph (``GraphedLoop``) per shape,
reading a device buffer that one host-to-device copy from pinned memory fills (condition and
start noise side by side) and writing a buffer that one copy brings back to pinned memory.
Per call the host converts the condition into that staging buffer, draws the start noise into
it, launches three things and copies the result out into the array it returns.

The samples are the ones ``FieldTask.sample_for`` gives: the start noise comes from the same
seeded CPU generator (so a seed gives the same start on every device) and every operation is
the same, in the same order, on the same device (the tests compare them on the CPU, where the
recorded graph is replaced by running its body).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

from ..diffusion.graphed import GraphedLoop, LoopBody
from ..diffusion.inference import InferenceNetwork
from ..diffusion.sampler import ddim_loop, evaluating
from ..tasks.fields import SAMPLE_CHUNK, FieldTask, Standardiser

KEPT_SHAPES = 4
"""Recorded calls (cells x members x steps) kept; the least recently used goes first."""


@dataclass
class _Call:
    """The buffers (and, on a GPU, the recorded graph) of one call shape."""

    stats: Standardiser
    """The statistics the graph reads (a new ``Standardiser`` records anew)."""
    host_in: torch.Tensor
    host_cond: np.ndarray
    host_noise: torch.Tensor
    device_in: torch.Tensor
    device_x: torch.Tensor
    device_cond: torch.Tensor
    host_out: torch.Tensor
    loop: GraphedLoop | None


class EnsembleSampler:
    """Ensembles from ``network`` (the EMA as sampling runs it) for ``task``'s conditions.

    ``last_split``: milliseconds of the last call's parts on the host -- ``prepare`` (condition
    and start noise into the staging buffer), ``launch`` (copy in, replay, copy out queued),
    ``wait`` (for the GPU) and ``finish`` (into the returned array)."""

    def __init__(self, task: FieldTask, network: InferenceNetwork) -> None:
        self.task = task
        self.network = network
        self.device = task.device
        self.records = network.loops is not None
        """One replayed CUDA graph per call (a GPU that records sampling loops); else the same
        body runs eagerly on the staging buffers."""
        self._calls: OrderedDict[tuple[int, int, int], _Call] = OrderedDict()
        self._generator = torch.Generator()
        self._done = torch.cuda.Event() if self.device.type == "cuda" else None
        self.last_split: dict[str, float] = {}

    @torch.no_grad()
    def __call__(self, cond: np.ndarray, members: int, steps: int, seed: int) -> np.ndarray:
        """cond (N, C) (any real dtype) -> (N, members, *x_shape) float32 in data units."""
        task = self.task
        n = cond.shape[0]
        if n * members > SAMPLE_CHUNK or n == 0:  # in chunks (bounded memory), as sample_for does
            c = torch.as_tensor(np.asarray(cond, dtype=np.float32))
            return task.sample_for(self.network, c, members=members, steps=steps, seed=seed).numpy()
        start = time.perf_counter()
        call = self._call(n, members, steps)
        np.copyto(call.host_cond, cond, casting="unsafe")  # float64 -> float32 as torch's .float() rounds
        self._generator.manual_seed(seed)
        torch.randn(tuple(call.host_noise.shape), generator=self._generator, out=call.host_noise)
        prepared = time.perf_counter()
        if call.device_in is not call.host_in:
            call.device_in.copy_(call.host_in, non_blocking=True)
        if call.loop is not None:
            out = call.loop.replay()
        else:
            out = self._body(call.stats, members, steps)(call.device_x, (call.device_cond,))
        host_out = out if out.device.type == "cpu" else call.host_out.copy_(out, non_blocking=True)
        if self._done is not None:
            self._done.record()
        launched = time.perf_counter()
        if self._done is not None:
            self._done.synchronize()
        waited = time.perf_counter()
        result = host_out.numpy().reshape(n, members, *task.x_shape)
        if host_out is call.host_out:
            result = result.copy()  # the staging buffer is the next call's
        finished = time.perf_counter()
        self.last_split = {"prepare_ms": (prepared - start) * 1e3, "launch_ms": (launched - prepared) * 1e3,
                           "wait_ms": (waited - launched) * 1e3, "finish_ms": (finished - waited) * 1e3}
        return result

    def _body(self, stats: Standardiser, members: int, steps: int) -> LoopBody:
        """What ``FieldTask.sample_for`` computes for one chunk, from the raw condition (N, C)
        and the start noise (N * members, *x_shape) to fields in data units."""
        loop = ddim_loop(self.network, self.task.diffusion, steps)

        def body(x: torch.Tensor, condition: tuple[torch.Tensor, ...]) -> torch.Tensor:
            cond = condition[0]  # (N, C) -> (N * members, C), as repeat_interleave (which may read its size back)
            rows = cond.unsqueeze(1).expand(cond.shape[0], members, cond.shape[1]).reshape(-1, cond.shape[1])
            with evaluating(self.network):
                return stats.x_back(loop(x, (stats.cond(rows),)))
        return body

    def _call(self, n: int, members: int, steps: int) -> _Call:
        key = (n, members, steps)
        call = self._calls.get(key)
        if call is None or call.stats is not self.task.stats:
            call = self._new_call(n, members, steps)
            self._calls[key] = call
            while len(self._calls) > KEPT_SHAPES:
                self._calls.popitem(last=False)
        self._calls.move_to_end(key)
        return call

    def _new_call(self, n: int, members: int, steps: int) -> _Call:
        task, device = self.task, self.device
        rows, width, shape = n * members, n * task.cond_dim, task.x_shape
        pinned = device.type == "cuda"
        host_in = torch.empty(width + rows * int(np.prod(shape)), pin_memory=pinned)
        device_in = host_in if device.type == "cpu" else torch.empty_like(host_in, device=device)
        device_x, device_cond = device_in[width:].view(rows, *shape), device_in[:width].view(n, task.cond_dim)
        call = _Call(stats=task.stats, host_in=host_in, host_cond=host_in[:width].view(n, task.cond_dim).numpy(),
                     host_noise=host_in[width:].view(rows, *shape), device_in=device_in, device_x=device_x,
                     device_cond=device_cond, loop=None,
                     host_out=torch.empty((rows, *shape), pin_memory=pinned) if pinned else host_in[:0])
        if self.records:
            device_in.zero_()  # recording warms up on these: finite values
            call.loop = GraphedLoop(self._body(call.stats, members, steps), device_x, (device_cond,), static=True)
        return call
