"""FlexAttention for the UNet's attention layers (``runtime.attention``). Its kernel is CUDA-only
(inductor generates it; FlexAttention has no backward on the CPU), so the CPU checks what can
be checked for real: the processor computes diffusers' attention, falls back where it should,
FLOPs are counted on the model's own math, and a CPU run asking for flex gets a clear message.
GPU speed: docs/benchmarks.md, "Attention kernels"."""

import copy
import warnings
from collections import Counter

import pytest
import torch
from diffusers.models.attention_processor import Attention, AttnProcessor2_0
from torch.utils.flop_counter import FlopCounterMode

from diffscale.cli import main
from diffscale.config import ModelConfig
from diffscale.runtime.flex_attention import FlexAttnProcessor, sdpa_attention, use_flex_attention
from diffscale.tasks.images.network import Denoiser, build_unet

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def unet_with_attention() -> Denoiser:
    torch.manual_seed(0)
    cfg = ModelConfig(sample_size=16, block_out_channels=(32, 64), attention=(False, True))
    return Denoiser(build_unet(cfg, 1)).eval()


def inputs(batch: int = 3):
    torch.manual_seed(1)
    return torch.randn(batch, 1, 16, 16), torch.randint(0, 1000, (batch,))


def processors(net) -> Counter:
    return Counter(type(m.processor).__name__ for m in net.modules() if isinstance(m, Attention))


def test_flex_processor_computes_what_diffusers_computes():
    net = unet_with_attention()
    flex = copy.deepcopy(net)
    layers = use_flex_attention(flex)
    assert layers == 6 and processors(flex) == Counter({"FlexAttnProcessor": 6})  # 2 down, 3 up, 1 mid
    x, t = inputs()
    with torch.no_grad():
        expected, got = net(x, t), flex(x, t)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("min_rows,grid_limit,flex_runs", [(25, 65_535, False), (0, 20, False), (0, 65_535, True)])
def test_calls_below_the_row_threshold_or_over_the_grid_limit_use_sdpa(monkeypatch, min_rows, grid_limit, flex_runs):
    import diffscale.runtime.flex_attention as flex_module

    monkeypatch.setattr(flex_module, "MAX_GRID_BATCH", grid_limit)  # CUDA's is 65,535 batch rows
    net = unet_with_attention()
    x, t = inputs(batch=3)  # 3 images x 8 heads = 24 rows per call
    with torch.no_grad():
        expected = net(x, t)
    use_flex_attention(net, min_rows=min_rows)
    processor = next(m.processor for m in net.modules() if isinstance(m, Attention))
    calls = []
    processor._flex = lambda *a, _real=processor._flex, **k: calls.append(a[0].shape) or _real(*a, **k)
    with torch.no_grad():
        torch.testing.assert_close(net(x, t), expected, rtol=1e-5, atol=1e-5)
    if not flex_runs:
        assert calls == []  # diffusers' SDPA processor ran every call
    else:  # heads in the batch dimension, padded to 16 channels
        assert len(calls) == 6 and all(shape == (3 * 8, 1, 64, 16) for shape in calls)


def test_flops_are_counted_on_the_models_own_attention():
    """Eager FLOP counting cannot trace FlexAttention (it failed on the GPU); within
    ``sdpa_attention`` the same layers run diffusers' processor, and get it back after."""
    net, x_t = unet_with_attention(), inputs()
    flex = copy.deepcopy(net)
    use_flex_attention(flex)

    def flops(model) -> int:
        counter = FlopCounterMode(display=False)
        with counter, torch.no_grad():
            model(*x_t)
        return counter.get_total_flops()

    with sdpa_attention(flex):
        assert processors(flex) == Counter({"AttnProcessor2_0": 6})
        assert flops(flex) == flops(net) > 0
    assert processors(flex) == Counter({"FlexAttnProcessor": 6})
    with pytest.raises(RuntimeError), sdpa_attention(flex):
        raise RuntimeError("a failure inside the block")
    assert processors(flex) == Counter({"FlexAttnProcessor": 6})  # restored on the way out too


def test_layers_the_processor_cannot_take_go_to_diffusers():
    layer = Attention(16, cross_attention_dim=8, heads=2, dim_head=8)
    hidden, context = torch.randn(2, 5, 16), torch.randn(2, 7, 8)
    with torch.no_grad():
        expected = layer(hidden, encoder_hidden_states=context)
        layer.set_processor(FlexAttnProcessor())
        got = layer(hidden, encoder_hidden_states=context)
    torch.testing.assert_close(got, expected)
    assert isinstance(layer.processor._fallback, AttnProcessor2_0)


def test_training_with_flex_on_the_cpu_says_why_and_what_to_do(tmp_path, capsys, micro):
    with warnings.catch_warnings():
        code = main(["train", "--out", str(tmp_path / "run"), *micro("runtime.attention=flex", steps=2)])
    err = capsys.readouterr().err
    assert code != 0 and "Traceback" not in err
    assert "runtime.attention flex needs a compiled run on a CUDA GPU (this run is on cpu)" in err
    assert "--set runtime.attention=auto" in err
    assert not (tmp_path / "run" / "checkpoints").exists()
