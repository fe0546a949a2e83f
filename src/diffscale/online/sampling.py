"""``OnlineTrainer.sample`` with as little host work per call as the GPU allows.

A call of the users' size (80 cells x 16 members x 50 DDIM steps) is a few milliseconds on a
GPU, so what the host does around it counts: before, a call built tensors from numpy, moved
the condition and the start noise to the device in two pageable copies, standardised and
repeated the condition in separate launches, copied the result back pageable, undid the
normalisation on the CPU and concatenated it. Here the whole call -- repeat, standardise,
the DDIM loop, back to data units -- is one recorded CUDA graph (``GraphedLoop``) per shape,
reading a device buffer that one host-to-device copy from pinned memory fills (condition and
start noise side by side) and writing a buffer that one copy brings back to pinned memory.
Per call the host converts the condition into that staging buffer, launches three things and
copies the result out into the array it returns.

The start noise is the one part of the host's work that grows with the call (80 x 16 x 256
normal numbers from a seeded CPU generator: a fair share of a call; docs/decisions.md, "The start
noise from the seeded CPU generator"), so it is drawn ahead where the next seed is foreseeable:
each shape has two staging buffers, and while the GPU runs a call with seed ``s``, a helper
thread draws seed ``s + 1`` (a simulation numbering its output steps) into the other one. A call with the seed
its buffer already holds (the default seed, every time) draws nothing. Any other seed is drawn
in the call, as before. The numbers are the same in all three cases.

The samples are the ones ``FieldTask.sample_for`` gives: the start noise comes from the same
seeded CPU generator (so a seed gives the same start on every device) and every operation is
the same, in the same order, on the same device (the tests compare them on the CPU, where the
recorded graph is replaced by running its body).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch

from diffscale.diffusion.graphed import GraphedLoop, LoopBody
from diffscale.diffusion.inference import InferenceNetwork
from diffscale.diffusion.sampler import ddim_loop, evaluating
from diffscale.tasks.fields.standardise import Standardiser
from diffscale.tasks.fields.task import SAMPLE_CHUNK, FieldTask

KEPT_SHAPES = 4
"""Recorded calls (cells x members x steps) kept; the least recently used goes first."""


@dataclass
class _Staging:
    """One host buffer a call's inputs go through: the condition and the start noise side by
    side (pinned on a GPU host, so one copy moves both), and which seed's noise it holds."""

    host_in: torch.Tensor
    host_cond: np.ndarray
    host_noise: torch.Tensor
    noise_seed: int | None = None


@dataclass
class _Call:
    """The buffers (and, on a GPU, the recorded graph) of one call shape."""

    stats: Standardiser
    """The statistics the graph reads (a new ``Standardiser`` records anew)."""
    staging: list[_Staging]
    """Two: a call reads one while the next seed's noise is drawn into the other."""
    device_in: torch.Tensor
    device_x: torch.Tensor
    device_cond: torch.Tensor
    host_out: torch.Tensor
    loop: GraphedLoop | None
    ahead: Future[None] | None = field(default=None)
    """The noise being drawn into a staging buffer for the next seed."""


def _noise_offset(cond_numbers: int) -> int:
    """Where the start noise begins in an input buffer: after the condition, on a 64-byte
    boundary, so the loop reads noise aligned as a tensor of its own is (CPU kernels vectorise
    by alignment; an unaligned start changed results in the last bit)."""
    return -(-cond_numbers // 16) * 16


class EnsembleSampler:
    """Ensembles from ``network`` (the EMA as sampling runs it) for ``task``'s conditions.

    ``last_split``: milliseconds of the last call's parts on the host -- ``prepare`` (condition
    and start noise into the staging buffer), ``launch`` (copy in, replay, copy out queued),
    ``wait`` (for the GPU) and ``finish`` (into the returned array); ``last_noise``: how that
    call's start noise came -- ``drawn`` in the call, ``ahead`` (by the helper thread) or
    ``kept`` (the seed of the buffer's last call)."""

    def __init__(self, task: FieldTask, network: InferenceNetwork) -> None:
        self.task = task
        self.network = network
        self.device = task.device
        self.records = network.loops is not None
        """One replayed CUDA graph per call (a GPU that records sampling loops); else the same
        body runs eagerly on the staging buffers."""
        self._calls: OrderedDict[tuple[int, int, int], _Call] = OrderedDict()
        self._generator = torch.Generator()
        self._ahead_generator = torch.Generator()
        self._helper: ThreadPoolExecutor | None = None
        self._done = torch.cuda.Event() if self.device.type == "cuda" else None
        self.last_split: dict[str, float] = {}
        self.last_noise = ""

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
        if call.ahead is not None:  # usually done long ago; its buffer must not change under us
            call.ahead.result()
            call.ahead = None
        staging = next((s for s in call.staging if s.noise_seed == seed), None)
        if staging is not None:
            self.last_noise = "kept" if staging is call.staging[0] else "ahead"
        else:
            staging, self.last_noise = call.staging[0], "drawn"
            self._generator.manual_seed(seed)
            torch.randn(tuple(staging.host_noise.shape), generator=self._generator, out=staging.host_noise)
            staging.noise_seed = seed
        if staging is not call.staging[0]:
            call.staging.reverse()  # staging[0]: the buffer of the newest call
        np.copyto(staging.host_cond, cond, casting="unsafe")  # float64 -> float32 as torch's .float() rounds
        prepared = time.perf_counter()
        if call.device_in.device.type != "cpu":
            call.device_in.copy_(staging.host_in, non_blocking=True)
            device_x, device_cond = call.device_x, call.device_cond
        else:  # the body reads the staging buffer itself
            device_x, device_cond = self._views(staging.host_in, n, members)
        if call.loop is not None:
            out = call.loop.replay()
        else:
            out = self._body(call.stats, members, steps)(device_x, (device_cond,))
        host_out = out if out.device.type == "cpu" else call.host_out.copy_(out, non_blocking=True)
        if self._done is not None:
            self._done.record()
        self._draw_ahead(call, seed + 1)
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

    def _draw_ahead(self, call: _Call, seed: int) -> None:
        """Have the helper thread draw ``seed``'s start noise into the buffer the running call
        does not read (torch's draw leaves the interpreter lock to the caller meanwhile)."""
        spare = call.staging[1]
        if spare.noise_seed == seed:
            return
        spare.noise_seed = None  # until the draw is done

        def draw() -> None:
            self._ahead_generator.manual_seed(seed)
            torch.randn(tuple(spare.host_noise.shape), generator=self._ahead_generator, out=spare.host_noise)
            spare.noise_seed = seed

        if self._helper is None:
            self._helper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="diffscale-noise")
        call.ahead = self._helper.submit(draw)

    def _views(self, buffer: torch.Tensor, n: int, members: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The start noise (N * members, *x_shape) and the condition (N, C) in an input buffer."""
        width, start = n * self.task.cond_dim, _noise_offset(n * self.task.cond_dim)
        return buffer[start:].view(n * members, *self.task.x_shape), buffer[:width].view(n, self.task.cond_dim)

    def _new_call(self, n: int, members: int, steps: int) -> _Call:
        task, device = self.task, self.device
        rows, shape = n * members, task.x_shape
        pinned = device.type == "cuda"
        staging = []
        for _ in range(2):
            host_in = torch.empty(_noise_offset(n * task.cond_dim) + rows * int(np.prod(shape)), pin_memory=pinned)
            noise, cond = self._views(host_in, n, members)
            staging.append(_Staging(host_in=host_in, host_cond=cond.numpy(), host_noise=noise))
        device_in = staging[0].host_in if device.type == "cpu" else torch.empty_like(staging[0].host_in, device=device)
        device_x, device_cond = self._views(device_in, n, members)
        call = _Call(stats=task.stats, staging=staging, device_in=device_in, device_x=device_x,
                     device_cond=device_cond, loop=None,
                     host_out=torch.empty((rows, *shape), pin_memory=pinned) if pinned else device_in[:0])
        if self.records:
            device_in.zero_()  # recording warms up on these: finite values
            call.loop = GraphedLoop(self._body(call.stats, members, steps), device_x, (device_cond,), static=True)
        return call
