"""A compiled run that trains eager while its compiled step is built in the background
(``runtime.compile_while_training``; the background process: ``training/background_compile.py``)
switches to the compiled step here, at a step boundary.

Every ``CHECK_EVERY`` steps (and at each logged step) every rank says whether its node's background
compile has ended (ranks that started none: yes), and the process group takes the answer together
(``DistContext.any_true``), so every rank compiles at the same step and none waits in a collective
for another. Checking between logged steps, not only at them, saves half a logged window on
average (small's is 7.8 s of eager steps on an H200); the check is one small all-reduce on
several ranks, nothing on one, and ends with the switch. The compile then loads what the
background process built (seconds: the kernels and, for one process, the traced network come
from the cache); a background compile that failed leaves the compile to the training process, as
a run that does not train while compiling does it. A step's math is the same before and after
(the same loss, clipping, fused AdamW and EMA on the same weights: only the kernels differ), so
checkpoints written before the switch resume compiled and the other way round.

Before each eager step the rank that started the background process gives it the GPU while it
times kernels (``training/tuning_pause.py``). The log says ``compiled from step N``; metrics.jsonl
gets a ``compiled`` record (the step, the switch's seconds and dynamo's account of them, the eager
speed of the last logged window, the seconds the eager steps paused) and, once a whole logged
window has run compiled after the switch's, a ``compiled_speed`` record.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from diffscale.io.kernels import holds_files
from diffscale.runtime.device import synchronize
from diffscale.training.background_compile import BackgroundCompile
from diffscale.training.build import Run
from diffscale.training.telemetry import Telemetry, seconds_since_process_start

Say = Callable[[str], None]

CHECK_EVERY = 10
"""Steps between two looks at the background compile, on every rank at the same steps."""


def start_note(kernels: Path, log: Path | None) -> str:
    """What a run that trains while compiling says before its first step."""
    where = f", its log in {log}" if log is not None else ""
    if holds_files(kernels):
        ahead = f"from the kernels cached by an earlier job in {kernels}"
    else:
        ahead = (f"for the first time (minutes on a GPU; the kernels are kept in {kernels}, so later jobs of "
                 "this network switch sooner)")
    return (f"eager while compiling: training starts now on eager steps; a background process compiles the step "
            f"{ahead}{where}; every rank switches to the compiled step once it is built")


def dynamo_account() -> dict[str, float]:
    """Dynamo's own account of this process's compiles so far, in seconds per timed phase (those of
    0.05 s or more): at the switch, what the switch's seconds went to (the eager steps compile nothing)."""
    names, values = torch._dynamo.utils.compile_times(repr="csv", aggregate=True)
    seconds = {name: round(float(str(value)), 2) for name, value in zip(names, values, strict=True)}
    return {name: value for name, value in seconds.items() if value >= 0.05}


class CompileSwitch:
    """One run's switch from eager to compiled steps; inert for a run that does not train while compiling."""

    def __init__(self, run: Run, background: BackgroundCompile | None, telemetry: Telemetry, say: Say) -> None:
        self.run, self.background, self.telemetry, self.say = run, background, telemetry, say
        self.switched_at: int | None = None
        """The step after which the steps ran compiled (None: not yet)."""
        self._started: float | None = None
        self._eager_rate = 0.0
        self._speed_at: int | None = None

    def before_step(self) -> None:
        """Before an eager step: wait while the background process times kernels on the GPU
        (``runtime.eager_pauses_for_tuning``; only the rank that started it: the others wait for
        that rank in their next collective)."""
        if self.run.eager and self.background is not None:
            device = self.run.state.device
            self.background.wait_while_tuning(drain=lambda: synchronize(device))

    def at_step(self, record: dict[str, Any] | None) -> None:
        """After a step, on every rank (``record``: the logged window's metrics at a logged step,
        else None): every ``CHECK_EVERY`` steps and at logged steps, compile once every node's
        background compile has ended; one logged window after the switch's, say how fast the
        compiled steps run."""
        step = self.run.state.step
        if self.run.eager:
            if record is not None:
                self._eager_rate = float(record["samples_per_s"])
            if record is None and step % CHECK_EVERY:
                return
            ended = self.background is None or self.background.ended()
            if not self.run.state.ctx.any_true(not ended):
                self._switch()
        elif record is not None and self._speed_at is not None and step >= self._speed_at:
            self._compiled_speed(record)

    def _switch(self) -> None:
        state = self.run.state
        failed = state.ctx.any_true(self.background is not None and self.background.failed)
        took = self.background.took_s if self.background is not None else None
        logs = f"{state.run_dir}/background-compile*.log"
        if failed:
            self.say(f"[yellow]warning: the background compile failed (its log: {logs}): the training process "
                     f"compiles the step itself now, at step {state.step}[/]")
        else:
            built = f" in {took:.1f} s" if took is not None else ""
            self.say(f"the background compile has built the step{built}: compiling from its kernels at step "
                     f"{state.step}")
        self._started = time.perf_counter()
        if state.device.type == "cuda":  # the eager steps' cached blocks go back before the compiled ones come
            torch.cuda.empty_cache()
        self.run.compile()
        self.switched_at = state.step

    def after_step(self) -> None:
        """After every step: the note and ``compiled`` record of the first compiled one."""
        if self._started is None:
            return
        state = self.run.state
        synchronize(state.device)
        took = time.perf_counter() - self._started
        self._started = None
        assert self.switched_at is not None
        self.run.mark_step_built()
        paused = self.background.paused_s if self.background is not None else 0.0
        eager = f"eager until then: {self._eager_rate:,.0f} samples/s" if self._eager_rate else ""
        if paused:
            eager += f"{'; ' if eager else ''}paused {paused:.1f} s while the compile timed kernels"
        self.say(f"compiled from step {self.switched_at}: the switch took {took:.1f} s{f' ({eager})' if eager else ''}")
        background = self.background.took_s if self.background is not None else None
        self.telemetry.event({"kind": "compiled", "step": self.switched_at, "switch_s": round(took, 2),
                              "eager_samples_per_s": self._eager_rate, "paused_for_tuning_s": round(paused, 2),
                              "background_compile_s": None if background is None else round(background, 2),
                              "switch_account": dynamo_account(),
                              "since_start_s": round(seconds_since_process_start(), 2), "time": time.time()})
        # the logged window holding the switch's first step holds its compile; a window ending a whole
        # window later holds none of it: the compiled speed
        self._speed_at = self.switched_at + 2 * state.cfg.train.log_every

    def _compiled_speed(self, record: dict[str, Any]) -> None:
        state = self.run.state
        assert self.switched_at is not None
        rate = float(record["samples_per_s"])
        same = self._same_step_everywhere(self.switched_at)
        eager = self._eager_rate
        ratio = f", {rate / eager:.2f} x the eager steps' {eager:,.0f}" if eager else ""
        self.say(f"compiled speed: {rate:,.0f} samples/s{ratio} (compiled from step {self.switched_at}"
                 f"{' on every rank' if same else ', [red]not on every rank[/]'})")
        self.telemetry.event({"kind": "compiled_speed", "step": state.step, "samples_per_s": rate,
                              "eager_samples_per_s": self._eager_rate, "compiled_from_step": self.switched_at,
                              "same_step_every_rank": same, "time": time.time()})
        self._speed_at = None

    def _same_step_everywhere(self, step: int) -> bool:
        """Whether every rank switched at ``step``: each compares its own switch step with their mean."""
        ctx = self.run.state.ctx
        mean = float(ctx.all_mean(torch.tensor(float(step), device=ctx.device)))
        return not ctx.any_true(abs(mean - step) > 0.25)

    def finish(self) -> None:
        """At the run's end: a background compile still running is ended (a later job compiles again)."""
        background, self.background = self.background, None
        if background is not None and background.stop():
            self.say(f"the background compile was stopped before it finished, at step {self.run.state.step}: the "
                     "next job of this network compiles again")
