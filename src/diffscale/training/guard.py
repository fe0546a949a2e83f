"""The divergence guard: a loss that jumps far above its own recent level and stays there (or turns
non-finite) sends the run back to its last good state with a lower learning rate, and says so.

A collapse of this kind is finite and silent: the loss falls, jumps to several times its level
within a few dozen steps and stays there, and the run ends "normally" far above where it was
(docs/decisions.md, "The divergence guard"). The guard judges each logged window's loss -- a
mean over every rank, so every rank takes the same decision -- against the loss's recent level
(the median of the last ``LEVEL_WINDOWS`` healthy windows: robust to noise, where the lowest
window so far is not): ``train.divergence_rise`` times above it, and ``train.divergence_noise``
noise widths above it, for ``train.divergence_patience`` windows and ``train.divergence_patience_steps``
steps in a row is a divergence (in steps too, so a short ``log_every`` does not make it hastier);
over the first ``train.divergence_early_steps`` it judges every ``EARLY_WINDOW_STEPS`` steps where
the logged windows are longer (an early collapse is over before they give it a level). The
noise width is the window-to-window spread of the last ``NOISE_WINDOWS`` healthy windows (their
successive differences' median size, as a standard deviation: a falling trend adds little): a
loss noisy by nature -- a heavy-tailed target in small batches -- swings past any fixed factor.

It keeps a copy of the last good state (network, EMA, optimizer, data position, RNG, task state)
at healthy log steps every ``train.divergence_keep_every`` steps and at checkpoint steps, good once
the next window is healthy too, on the device when it fits there twice over, else in host memory.
Its statistics are part of each checkpoint, so a resumed run takes the same decisions at the same
steps.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from diffscale.config import RunConfig
from diffscale.runtime import checkpoint as ckpt

LEVEL_WINDOWS = 5
"""Healthy windows whose median is the loss's recent level."""
NOISE_WINDOWS = 20
"""Healthy windows kept, whose window-to-window spread is the loss's noise width."""
FIRST_JUDGED_WINDOW = 4
"""Windows seen before the guard judges one: the first ones fall fast from the untrained loss."""
EARLY_WINDOW_STEPS = 10
"""Steps of the windows judged between logged ones over a run's first ``train.divergence_early_steps``."""


def early_window_ends(step: int, log_every: int, early_steps: int) -> bool:
    """Whether one of the guard's early windows ends at ``step`` in a run logged every ``log_every``
    steps (a logged step may be one too); shared with the suite's replay of the guard."""
    return log_every > EARLY_WINDOW_STEPS and 0 < step <= early_steps and step % EARLY_WINDOW_STEPS == 0


def judges_early(cfg: RunConfig, step: int) -> bool:
    """Whether the guard judges a window ending at ``step`` between two logged ones (a function of
    the step alone: every rank, and a resumed run, judges at the same steps)."""
    t = cfg.train
    return (t.divergence_guard and step % t.log_every != 0
            and early_window_ends(step, t.log_every, t.divergence_early_steps))


@dataclass
class GuardState:
    """The guard's statistics, kept in each checkpoint (``CheckpointMeta.guard``)."""

    recent: list[float] = field(default_factory=list)
    """The last ``NOISE_WINDOWS`` healthy window losses (checkpoints written before the noise width
    was judged kept ``LEVEL_WINDOWS``)."""
    seen: int = 0
    """Windows judged or counted so far."""
    above: int = 0
    """Windows in a row above ``rise x level``."""
    above_steps: int = 0
    """The steps those windows cover."""
    kept_step: int = -1
    """Step of the good state kept (-1: none yet): one that a healthy window followed."""
    pending_step: int = -1
    """Step of the state kept last (-1: none), good once a healthy window follows it: a state
    taken just before a jump may already hold what made it (an optimizer's moments)."""

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> GuardState:
        known = {"recent", "seen", "above", "above_steps", "kept_step", "pending_step"}
        return cls(**{k: v for k, v in (data or {}).items() if k in known})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def level(self) -> float | None:
        """The median of the recent healthy windows (None before there are enough to judge by)."""
        if len(self.recent) < FIRST_JUDGED_WINDOW - 1:
            return None
        return statistics.median(self.recent[-LEVEL_WINDOWS:])

    @property
    def noise_width(self) -> float:
        """The healthy windows' noise width: the median size of their successive differences as a
        normal distribution's standard deviation (x 1.4826 / sqrt 2); 0 before there are four."""
        if len(self.recent) < 4:
            return 0.0
        steps = [abs(b - a) for a, b in zip(self.recent, self.recent[1:], strict=False)]
        return 1.4826 * statistics.median(steps) / math.sqrt(2)


@dataclass(frozen=True)
class Verdict:
    """What a window's loss means: nothing (``diverged`` False), or a divergence and why."""

    diverged: bool
    why: str = ""
    healthy: bool = True
    """Whether the window counts as healthy (a state kept now is a good one)."""


def judge(state: GuardState, loss: float, *, rise: float, patience: int, noise: float, steps: int = 1,
          patience_steps: int = 0) -> Verdict:
    """Update ``state`` with the mean loss of one window of ``steps`` steps and say whether the run
    diverged: ``rise`` times its recent level and ``noise`` noise widths above it, ``patience``
    windows and ``patience_steps`` steps in a row (a non-finite loss: the windows alone)."""
    state.seen += 1
    if not math.isfinite(loss):
        state.above += 1
        state.above_steps += steps
        return Verdict(state.above >= patience, f"the loss is {loss}", healthy=False)
    level, width = state.level, state.noise_width
    if state.seen >= FIRST_JUDGED_WINDOW and level is not None and loss > max(rise * level, level + noise * width):
        state.above += 1
        state.above_steps += steps
        why = f"the loss {loss:.4g} is {loss / level:.1f}x its recent level {level:.4g}"
        if noise and width:
            why += f", {(loss - level) / width:.0f} noise widths above it"
        return Verdict(state.above >= patience and state.above_steps >= patience_steps, why, healthy=False)
    state.above = state.above_steps = 0
    state.recent = [*state.recent, loss][-NOISE_WINDOWS:]
    return Verdict(False)


def _cloned(tree: Any, device: torch.device) -> Any:
    """``tree`` with every tensor copied to ``device`` (lists, tuples and dicts rebuilt)."""
    if isinstance(tree, torch.Tensor):
        return tree.detach().to(device, copy=True)
    if isinstance(tree, dict):
        return {k: _cloned(v, device) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_cloned(v, device) for v in tree)
    return tree


def _bytes(tree: Any) -> int:
    if isinstance(tree, torch.Tensor):
        return tree.numel() * tree.element_size()
    if isinstance(tree, dict):
        return sum(_bytes(v) for v in tree.values())
    if isinstance(tree, (list, tuple)):
        return sum(_bytes(v) for v in tree)
    return 0


def kept_copy(state: ckpt.TrainingState, device: torch.device) -> ckpt.TrainingState:
    """A copy of ``state`` that training does not change: on ``device`` where twice its size is
    free there (a device-to-device copy takes milliseconds), else in host memory."""
    where = torch.device("cpu")
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        if free > 2 * _bytes([state.model, state.ema, state.optimizer]):
            where = device
    return ckpt.TrainingState(step=state.step, model=_cloned(state.model, where), ema=_cloned(state.ema, where),
                              optimizer=_cloned(state.optimizer, where), meta=state.meta,
                              rng=_cloned(state.rng, torch.device("cpu")), task=_cloned(state.task, where))


def lr_to_set(cfg: RunConfig, backoff: float) -> float:
    """The ``optim.lr`` that trains at the learning rate a run reached after its restores."""
    return cfg.optim.lr * backoff
