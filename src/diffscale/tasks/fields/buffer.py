"""The replay buffer of online training: the newest N samples (FIFO) or a uniform sample of
everything seen (reservoir), resident on the training device. Its contents, fill, counters
and the reservoir's random state are task state, so a checkpoint restores it exactly.

Data spec: ``online:fifo:N`` or ``online:reservoir:N`` (``data.source`` of a run that an
``OnlineTrainer`` or a spool follower feeds).

A run may resume with a larger N: the buffer keeps the rows it had (a FIFO's oldest first) and
new samples fill the rows after them. A reservoir keeps every new sample while it fills up
(its rows from before stay a uniform sample of what came before), then draws against every
sample ever seen, so a new sample enters as often as in a run that had the larger N throughout.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import numpy as np
import torch

from diffscale.data.device_loader import DataPosition
from diffscale.errors import UserError, closest
from diffscale.runtime.resources import check_fits


class BufferPolicy(str, enum.Enum):
    """Which samples a full buffer keeps: the newest (``fifo``) or a uniform random sample of
    every sample pushed so far (``reservoir``, Vitter's algorithm R)."""

    FIFO = "fifo"
    RESERVOIR = "reservoir"


@dataclass(frozen=True)
class BufferSpec:
    policy: BufferPolicy
    capacity: int

    @property
    def source(self) -> str:
        return f"online:{self.policy.value}:{self.capacity}"


def buffer_policy(policy: str | BufferPolicy) -> BufferPolicy:
    """``"fifo"`` -> BufferPolicy.FIFO; anything else is a ``UserError`` listing the choices."""
    try:
        return BufferPolicy(policy)
    except ValueError:
        choices = [p.value for p in BufferPolicy]
        raise UserError(f"policy={policy!r} is not a buffer policy{closest(str(policy), choices)}",
                        f"pass policy= one of {', '.join(choices)}") from None


def parse_buffer_spec(spec: str) -> BufferSpec:
    """``online:fifo:3840`` -> BufferSpec(FIFO, 3840)."""
    _, _, rest = spec.partition(":")
    policy, _, capacity = rest.partition(":")
    choices = ", ".join(p.value for p in BufferPolicy)
    if policy not in {p.value for p in BufferPolicy} or not capacity.isdigit() or int(capacity) < 1:
        raise UserError(f"data source '{spec}' is not an online buffer",
                        f"write online:POLICY:N with POLICY one of {choices} and N the samples it holds, "
                        "e.g. online:fifo:3840")
    return BufferSpec(BufferPolicy(policy), int(capacity))


class ReplayBuffer:
    """``capacity`` rows of (cond (C,), x (*x_shape), sim_time) in preallocated device tensors.

    Rows ``[0, size)`` hold data; training indexes them directly (no copy per step).
    """

    def __init__(self, spec: BufferSpec, cond_dim: int, x_shape: tuple[int, ...], device: torch.device,
                 seed: int = 0) -> None:
        self.spec = spec
        row = 4 * (cond_dim + math.prod(x_shape))
        check_fits(spec.capacity * row + 8 * spec.capacity, f"a replay buffer of {spec.capacity:,} samples "
                   f"({row:,} bytes each)", "give the buffer fewer samples (the N of --data spool:DIR:N, or "
                   "OnlineTrainer's capacity=)", str(device))
        self.cond = torch.zeros((spec.capacity, cond_dim), device=device)
        self.x = torch.zeros((spec.capacity, *x_shape), device=device)
        self.sim_time = torch.zeros(spec.capacity, dtype=torch.float64)
        self.size = 0
        self.seen = 0
        """Samples ever added (what the reservoir draws against once full)."""
        self.head = 0
        """The slot the FIFO's next sample goes to: ``size`` while it fills, then its oldest row."""
        self.pushes = 0
        """Chunks ever added (a simulation's output steps)."""
        self.cursor = 0
        """Where the feeding source continues (a spool's next file number), kept with the contents."""
        self.source_end: tuple[int, int, int] | None = None
        """Once the feeding source has ended well: (how, exit status or -1, the batch count at which
        training on it ends), kept so that a resumed run does not train on it again."""
        self.rng = torch.Generator().manual_seed(seed)  # the reservoir's choices (CPU: same on every device)

    def add(self, cond: torch.Tensor, x: torch.Tensor, sim_time: torch.Tensor) -> None:
        """Add a chunk: cond (n, C), x (n, *x_shape), sim_time (n,) float64, all checked by the caller."""
        slots = self._slots(cond.shape[0])
        keep = slots >= 0
        if bool(keep.any()):
            where, rows = slots[keep], keep.nonzero()[:, 0]
            self.cond[where.to(self.cond.device)] = cond[rows].to(self.cond.device)
            self.x[where.to(self.x.device)] = x[rows].to(self.x.device)
            self.sim_time[where] = sim_time[rows]
        self.seen += cond.shape[0]
        self.size = min(self.size + cond.shape[0], self.spec.capacity)
        if self.spec.policy == BufferPolicy.FIFO:
            self.head = (self.head + cond.shape[0]) % self.spec.capacity
        self.pushes += 1

    def _slots(self, n: int) -> torch.Tensor:
        """The slot of each of ``n`` new samples, -1 where the reservoir drops it."""
        capacity = self.spec.capacity
        if self.spec.policy == BufferPolicy.FIFO:
            slots = (self.head + torch.arange(n)) % capacity
            slots[: max(0, n - capacity)] = -1  # a chunk longer than the buffer: only its newest rows stay
            return slots
        # Algorithm R: a sample takes the next free slot while the buffer fills, then sample k
        # (0-based, counting every sample seen) replaces a uniformly drawn slot j <= k when
        # j < capacity; drawn one by one so resumes match exactly.
        slots = torch.full((n,), -1, dtype=torch.long)
        free = self.size
        for i, k in enumerate(range(self.seen, self.seen + n)):
            if free < capacity:
                j, free = free, free + 1
            else:
                j = int(torch.randint(0, k + 1, (1,), generator=self.rng))
            slots[i] = j if j < capacity else -1
        taken: set[int] = set()
        for i in reversed(range(n)):  # two samples of one chunk drawing one slot: the later one stays
            if int(slots[i]) in taken:
                slots[i] = -1
            elif slots[i] >= 0:
                taken.add(int(slots[i]))
        return slots

    def latest_time(self) -> float:
        return float(self.sim_time[: self.size].max()) if self.size else float("nan")

    def describe(self) -> str:
        return (f"{self.spec.policy.value} buffer {self.size}/{self.spec.capacity} samples "
                f"({self.pushes} pushes, {self.seen} seen)")

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Contents and position; float64 times and int64 counters keep resumes exact."""
        return {"buffer_cond": self.cond[: self.size].detach().cpu().clone(),
                "buffer_x": self.x[: self.size].detach().cpu().clone(),
                "buffer_time": self.sim_time[: self.size].clone(),
                "buffer_counters": torch.tensor([self.size, self.seen, self.pushes, self.cursor], dtype=torch.int64),
                "buffer_head": torch.tensor([self.head], dtype=torch.int64),
                "buffer_source_end": torch.tensor(self.source_end or (-1, -1, -1), dtype=torch.int64),
                "buffer_rng": self.rng.get_state()}

    def load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        """Restore ``state_tensors``. Rows that fill this capacity keep their slots; fewer (a
        buffer not full yet, or resumed with a larger capacity) go to ``[0, size)``, a FIFO's
        oldest first, and new samples fill the rows after them."""
        size, seen, pushes, cursor = (int(v) for v in tensors["buffer_counters"].tolist())
        if size > self.spec.capacity or tensors["buffer_x"].shape[1:] != self.x.shape[1:]:
            raise UserError(f"the checkpoint's buffer ({size} rows of {tuple(tensors['buffer_x'].shape[1:])}) does not "
                            f"fit {self.spec.source} of {tuple(self.x.shape[1:])}",
                            f"resume with a buffer of at least {size} samples and the same sample shape, as the "
                            "run's own config.yaml has it (diffscale train --out RUN_DIR --resume auto; from "
                            "Python, OnlineTrainer(RUN_DIR, capacity=...))")
        # Checkpoints from before buffer_head wrote the FIFO at slot seen % capacity, and their
        # rows filled slots 0..size-1 in order until the buffer was full.
        saved = tensors.get("buffer_head")
        head = int(saved.item()) if saved is not None else (size if seen == size else seen % size)
        order = torch.arange(size)
        if self.spec.policy == BufferPolicy.FIFO and size < self.spec.capacity:
            order = (order + head) % size  # oldest first: a larger buffer fills on after the newest
        self.cond[:size] = tensors["buffer_cond"][order].to(self.cond.device)
        self.x[:size] = tensors["buffer_x"][order].to(self.x.device)
        self.sim_time[:size] = tensors["buffer_time"][order]
        self.size, self.seen, self.pushes, self.cursor = size, seen, pushes, cursor
        self.head = head % self.spec.capacity if size == self.spec.capacity else size
        self.rng.set_state(tensors["buffer_rng"])
        ended = tensors.get("buffer_source_end")  # absent in checkpoints from before it was kept
        how, status, end_at = (int(v) for v in ended.tolist()) if ended is not None else (-1, -1, -1)
        self.source_end = (how, status, end_at) if how >= 0 else None


class BufferBatcher:
    """Global batches drawn uniformly (with replacement) from the rows a buffer holds now.

    The same interface as ``DeviceBatcher``: ``next_indices`` and a checkpointed ``position``
    (here: batches drawn). Each draw is seeded by (seed, position), so a resumed run draws
    exactly the batches the uninterrupted one would have.
    """

    def __init__(self, buffer: ReplayBuffer, global_batch: int, seed: int, device: torch.device,
                 position: DataPosition | None = None) -> None:
        self.buffer = buffer
        self.global_batch = global_batch
        self.seed = seed
        self.position = position or DataPosition()
        self._generator = torch.Generator(device=device)
        self.device = device

    def close(self) -> None:
        """Nothing to release: the buffer belongs to its owner."""

    def next_indices(self, out: torch.Tensor | None = None) -> torch.Tensor:
        if self.buffer.size == 0:
            raise UserError("training was asked for a batch while the buffer is empty",
                            "push data first; ask OnlineTrainer.ready() before training")
        self._generator.manual_seed(self.seed * 1_000_003 + self.position.offset)
        self.position = DataPosition(self.position.epoch, self.position.offset + 1)
        # into a recorded step's input when ``out`` is given: the same draw
        return torch.randint(0, self.buffer.size, (self.global_batch,), generator=self._generator, device=self.device,
                             out=out)


class MisfitArrays(UserError):
    """Arrays whose shapes do not fit the task; ``misfit`` says how, without ``push``'s fix
    (a spool reader words its own)."""

    def __init__(self, misfit: str, cause: str, fix: str) -> None:
        self.misfit = misfit
        super().__init__(cause, fix)


def as_chunk(cond: object, x: object, sim_time: float, cond_dim: int,
             x_shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """One output step's samples as float32 CPU copies: cond (n, C), x (n, *x_shape), times (n,).

    Rows holding NaN or inf are dropped (their count is returned): one bad cell must not stop
    the simulation or poison the buffer. Shapes that do not fit the task raise ``UserError``.
    """
    c, v, dropped = as_arrays(cond, x, cond_dim, x_shape)
    return torch.from_numpy(c), torch.from_numpy(v), chunk_times(len(c), sim_time), dropped


def chunk_times(rows: int, sim_time: float) -> torch.Tensor:
    """(rows,) float64: every sample of an output step has its simulation time."""
    return torch.full((rows,), float(sim_time), dtype=torch.float64)


def _real_numbers(values: object, name: str) -> None:
    """Arrays of real numbers only: a complex array would lose its imaginary part in the float32
    copy without a word, and objects or strings would fail inside numpy."""
    try:
        kind = (values if isinstance(values, np.ndarray) else np.asarray(values)).dtype.kind
    except ValueError:  # rows of different lengths
        kind = "O"
    if kind not in "biuf":
        what = {"c": "complex numbers", "U": "strings", "S": "bytes"}.get(kind, "Python objects or uneven rows")
        raise MisfitArrays(f"{name} holds {what}", f"pushed {name} holds {what}, not real numbers",
                           "push arrays of real numbers (float or int); for complex fields push the real and "
                           "imaginary parts as separate fields")


def as_arrays(cond: object, x: object, cond_dim: int, x_shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, int]:
    """``as_chunk``'s checks and copies as numpy arrays, in as few array operations as possible
    (``OnlineTrainer.push`` runs this on the simulation's thread: each operation may hand the
    interpreter lock to the training thread and wait to get it back): one float32 copy of each
    array and one sum each that is finite unless a row holds NaN or inf (or the sum overflows),
    and only then the check row by row."""
    if isinstance(cond, torch.Tensor):  # a tensor (on a GPU, of an autograd graph): its values
        cond = cond.detach().to("cpu", torch.float32).numpy()
    if isinstance(x, torch.Tensor):
        x = x.detach().to("cpu", torch.float32).numpy()
    _real_numbers(cond, "cond")
    _real_numbers(x, "x")
    with np.errstate(over="ignore", invalid="ignore"):  # values beyond float32 become inf: dropped below
        c = np.array(cond, dtype=np.float32)  # a copy: the simulation may reuse its arrays
        v = np.array(x, dtype=np.float32)
    if c.ndim == 1:
        c = c[None]
    if v.ndim == len(x_shape):
        v = v[None]
    if c.ndim != 2 or c.shape[1] != cond_dim or tuple(v.shape[1:]) != tuple(x_shape) or c.shape[0] != v.shape[0]:
        misfit = (f"cond {tuple(c.shape)} and x {tuple(v.shape)} do not fit the task "
                  f"(cond n x {cond_dim}, x n x {' x '.join(map(str, x_shape))})")
        raise MisfitArrays(misfit, f"pushed {misfit}",
                           "push arrays of those shapes (model.cond_dim, model.x_dim, model.fields)")
    with np.errstate(over="ignore", invalid="ignore"):
        if math.isfinite(float(c.sum())) and math.isfinite(float(v.sum())):
            return c, v, 0
    good = np.isfinite(c).all(1) & np.isfinite(v.reshape(len(v), -1)).all(1)
    return c[good], v[good], int((~good).sum())
