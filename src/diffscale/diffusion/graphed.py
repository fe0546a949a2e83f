"""A whole denoising loop recorded once as one CUDA graph and replayed per call.

Sampling a small network is bound by kernel launches and Python, not by the GPU: a policy's
10-step action chunk at batch 1, or a field ensemble's 50 steps, launch hundreds of small
kernels per call. Replaying them as one graph leaves the host one launch per call. A recorded
loop is tied to its batch shape, step count and network; its inputs (start noise, condition)
are copied into the graph's own tensors before each replay. Weights are read at replay, so a
network updated in place (an EMA during online training) is sampled with its current values.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable

import torch

from diffscale.runtime.device import on_side_stream

LoopBody = Callable[[torch.Tensor, tuple[torch.Tensor, ...]], torch.Tensor]
WARMUP_CALLS = 2  # the first compiles; the second runs as every later call does before recording


class GraphedLoop:
    """``body(x, condition)`` recorded for tensors shaped like ``x`` and ``condition``.

    ``static``: ``x`` and ``condition`` themselves are the graph's inputs (not copies of them):
    the caller writes each call's values into them (one host-to-device copy into a buffer they
    are views of) and calls ``replay``."""

    def __init__(self, body: LoopBody, x: torch.Tensor, condition: tuple[torch.Tensor, ...],
                 static: bool = False) -> None:
        self.x = x if static else x.clone()
        self.condition = condition if static else tuple(c.clone() for c in condition)
        with on_side_stream(torch.cuda.Stream(device=x.device)):  # warm-up off the default stream
            for _ in range(WARMUP_CALLS):
                body(self.x, self.condition)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = body(self.x, self.condition)

    def __call__(self, x: torch.Tensor, condition: tuple[torch.Tensor, ...]) -> torch.Tensor:
        self.x.copy_(x)
        for mine, given in zip(self.condition, condition, strict=True):
            mine.copy_(given)
        return self.replay().clone()  # the next replay overwrites the graph's output

    def replay(self) -> torch.Tensor:
        """Run the loop on what ``x`` and ``condition`` hold now; returns the graph's own output
        tensor, which the next replay overwrites."""
        self.graph.replay()
        return self.out


class LoopCache:
    """The recorded loops of one network, the most recently used ``size`` of them kept."""

    def __init__(self, size: int = 4) -> None:
        self.size = size
        self._loops: OrderedDict[Hashable, GraphedLoop] = OrderedDict()

    def run(self, key: Hashable, body: LoopBody, x: torch.Tensor, condition: tuple[torch.Tensor, ...]) -> torch.Tensor:
        loop = self._loops.get(key)
        if loop is None:
            loop = GraphedLoop(body, x, condition)
            self._loops[key] = loop
            while len(self._loops) > self.size:
                self._loops.popitem(last=False)
        self._loops.move_to_end(key)
        return loop(x, condition)

    def __len__(self) -> int:
        return len(self._loops)
