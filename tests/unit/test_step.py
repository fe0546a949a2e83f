"""The optimizer step's gradient clipping and EMA update: the values they compute, and that off
the CPU the EMA never reads a device tensor back to the host (which would make every training
step wait for the GPU)."""

from types import SimpleNamespace

import pytest
import torch

from diffscale.training.step import clip_gradients, ema_update


def _trainer(device: str) -> SimpleNamespace:
    params = [torch.full((3, 4), 2.0, device=device), torch.full((5,), -1.0, device=device)]
    ema = [torch.zeros(3, 4, device=device), torch.zeros(5, device=device)]
    return SimpleNamespace(params=params, ema_params=ema)


@pytest.mark.parametrize("rate", [0.25, torch.tensor(0.25)], ids=["number", "tensor"])
def test_ema_moves_towards_the_parameters_by_the_rate(rate):
    trainer = _trainer("cpu")
    ema_update(trainer, rate)
    assert torch.equal(trainer.ema_params[0], torch.full((3, 4), 0.5))
    assert torch.equal(trainer.ema_params[1], torch.full((5,), -0.25))


def test_a_recorded_steps_ema_rate_stays_a_device_tensor():
    # a meta tensor has no value: turning the rate into a number (a host sync on a GPU) raises
    trainer = _trainer("meta")
    ema_update(trainer, torch.tensor(0.25, device="meta"))
    assert trainer.ema_params[0].device.type == "meta"


@pytest.mark.parametrize("max_norm", [0.5, 100.0, float("inf")])
def test_clipping_matches_torchs_clip_grad_norm(max_norm):
    torch.manual_seed(0)
    ours = [torch.nn.Parameter(torch.randn(*shape)) for shape in ((7, 3), (11,), (2,))]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    for a, b in zip(ours, theirs, strict=True):
        a.grad = torch.randn_like(a)
        b.grad = a.grad.clone()
    ours[2].grad = None  # a parameter without a gradient is left out, as torch does
    theirs[2].grad = None
    norm = clip_gradients(ours, max_norm)
    expected = torch.nn.utils.clip_grad_norm_(theirs, max_norm)
    assert torch.equal(norm, expected)
    for a, b in zip(ours[:2], theirs[:2], strict=True):
        assert torch.equal(a.grad, b.grad)


def test_non_finite_gradients_give_a_non_finite_norm():
    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.tensor([1.0, float("nan"), 2.0])
    assert not torch.isfinite(clip_gradients([p], 1.0))


def _recording_trainer(world_size: int, backend: str, step_graph: str) -> SimpleNamespace:
    from diffscale import config as C

    cfg = C.resolve_config(C.ConfigSources(preset="policy", overrides=[f"runtime.step_graph={step_graph}"]))
    return SimpleNamespace(
        cfg=cfg, device=torch.device("cuda"), fused=True, scaler=SimpleNamespace(is_enabled=lambda: False),
        ctx=SimpleNamespace(world_size=world_size, backend=backend, distributed=world_size > 1),
        task=SimpleNamespace(records_whole_steps=False, records_whole_ddp_steps=True))


def test_whole_steps_are_recorded_under_ddp_with_nccl_where_the_task_measured_it():
    from diffscale.errors import UserError
    from diffscale.training.step_graph import records_whole_steps

    # a policy: recorded under DDP (4-GPU scaling), not on one GPU (no faster there)
    assert records_whole_steps(_recording_trainer(4, "nccl", "auto")) is True
    assert records_whole_steps(_recording_trainer(1, "", "auto")) is False
    assert records_whole_steps(_recording_trainer(4, "gloo", "auto")) is False
    with pytest.raises(UserError) as err:
        records_whole_steps(_recording_trainer(2, "gloo", "on"))
    assert "runtime.step_graph on needs one process or NCCL between processes (this run: 2 with gloo)" in str(err.value)
    assert err.value.fix == "set runtime.step_graph to auto or off"
