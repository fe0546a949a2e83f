"""Sampling shows its progress: a bar on a terminal, a line per stage in a log; --steps strides DDPM."""

from __future__ import annotations

import io
import re

import pytest
import torch
from rich.console import Console

from diffscale.config.schema import DiffusionConfig
from diffscale.diffusion import GaussianDiffusion
from diffscale.diffusion.sampler import Sampler, SamplerKind, reporting, sample
from diffscale.inference.sample import LogProgress, TerminalProgress, progress_for


class _Counting:
    """A stand-in network: predicts zero noise and counts its calls."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.calls = 0
        self.fail_at = fail_at

    def __call__(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.fail_at is not None and self.calls == self.fail_at:
            raise RuntimeError("network failed")
        return torch.zeros_like(x)


def _sample(kind: SamplerKind, steps: int, net: _Counting) -> None:
    sample(net, GaussianDiffusion(DiffusionConfig()), (3, 1, 4, 4), sampler=Sampler(kind, steps),
           generator=torch.Generator().manual_seed(0), device=torch.device("cpu"))


def _without_seconds(lines: list[str]) -> list[str]:
    return [re.sub(r", \d+\.\d s$", ", T s", line) for line in lines]


def test_a_log_gets_a_line_when_sampling_starts_and_one_per_quarter():
    lines: list[str] = []
    net = _Counting()
    with reporting(LogProgress(lines.append)):
        _sample(SamplerKind.DDPM, 8, net)
    assert _without_seconds(lines) == [
        "sampling: 3 samples, ddpm, 8 steps",
        "sampling: step 2/8 (25%), T s", "sampling: step 4/8 (50%), T s",
        "sampling: step 6/8 (75%), T s", "sampling: step 8/8 (100%), T s",
    ]


def test_ddpm_takes_the_steps_asked_for_not_every_trained_timestep():
    # the day-one report: `sample --sampler ddpm --steps 5` ran all 1,000 timesteps
    net = _Counting()
    _sample(SamplerKind.DDPM, 5, net)
    assert net.calls == 5


def test_few_steps_still_give_one_line_per_step_reached():
    lines: list[str] = []
    with reporting(LogProgress(lines.append)):
        _sample(SamplerKind.DDIM, 3, _Counting())
    assert [line.split(",")[0] for line in lines] == ["sampling: 3 samples", "sampling: step 1/3 (33%)",
                                                       "sampling: step 2/3 (67%)", "sampling: step 3/3 (100%)"]


def test_a_failure_midway_says_where_sampling_stopped():
    lines: list[str] = []
    with reporting(LogProgress(lines.append)), pytest.raises(RuntimeError, match="network failed"):
        _sample(SamplerKind.DDPM, 8, _Counting(fail_at=4))
    assert lines[-1] == "sampling: stopped at step 3/8"


def test_a_terminal_gets_a_bar_that_ends_full():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100)
    progress = progress_for(console)
    assert isinstance(progress, TerminalProgress)
    with reporting(progress):
        _sample(SamplerKind.DDIM, 8, _Counting())
    text = out.getvalue()
    assert "sampling 3 (ddim)" in text and "8/8" in text


def test_a_pipe_gets_lines_and_nothing_is_reported_outside_reporting():
    out = io.StringIO()
    progress = progress_for(Console(file=out, force_terminal=False))
    assert isinstance(progress, LogProgress)
    _sample(SamplerKind.DDIM, 4, _Counting())  # no progress installed: silent
    assert out.getvalue() == ""
    with reporting(progress):
        _sample(SamplerKind.DDIM, 4, _Counting())
    assert out.getvalue().splitlines()[0] == "sampling: 3 samples, ddim, 4 steps"


def test_sampling_sets_eval_mode_for_the_call_and_leaves_an_eval_network_unwalked():
    from diffscale.diffusion import evaluating

    net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout())
    with evaluating(net):
        assert not net.training and not net[1].training
    assert net.training and net[1].training  # a training network trains on afterwards
    net.eval()
    net[1].train()  # marks whether the modules were walked
    with evaluating(net):
        assert net[1].training  # not walked: setting the mode of every module cost ms per call
    assert not net.training and net[1].training
