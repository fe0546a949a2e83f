"""Attention kernels on a preset's own attention shapes, forward + backward, side by side.

``python -m benchmarks.attention [--preset small medium xl] [--json OUT]``

The presets' UNets have 8-channel heads (diffusers' default), which the fused SDPA kernels pad
to their 32-64-channel tiles. This times every kernel ``runtime.attention`` offers on exactly the
(batch, heads, tokens, head dim) calls one training step of the preset makes, and prints each
against PyTorch's own choice (``sdpa``) measured in the same run.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from diffscale.config import ModelConfig
from diffscale.config.presets import get_preset
from diffscale.errors import UserError
from diffscale.tasks.images.network import build_unet

SDPA_KERNELS = {"sdpa": None, "cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}


def attention_calls(preset: str) -> Counter:
    """(heads, tokens, head dim) of each self-attention call of one forward pass, counted."""
    from diffusers.models.attention_processor import Attention

    model = get_preset(preset).model
    if not isinstance(model, ModelConfig):
        raise UserError(f"preset '{preset}' has no UNet attention layers", "pick an images preset, e.g. small")
    channels = model.channels or 1  # the attention shapes do not depend on it
    unet = build_unet(model, channels).to("meta")
    calls: Counter = Counter()

    def record(module, args, kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]
        tokens = hidden.shape[2] * hidden.shape[3] if hidden.ndim == 4 else hidden.shape[1]
        calls[(module.heads, tokens, module.inner_dim // module.heads)] += 1

    for m in unet.modules():
        if isinstance(m, Attention):
            m.register_forward_pre_hook(record, with_kwargs=True)
    size = model.sample_size
    with torch.no_grad():
        unet(torch.zeros(1, channels, size, size, device="meta"), torch.zeros(1, device="meta"))
    return calls


def _time_ms(call, repeats: int) -> float:
    """Forward + backward of ``call()`` in ms, after three warm-up calls (and compilation)."""
    grad = torch.randn_like(call())
    for _ in range(3):
        call().backward(grad)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        call().backward(grad)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


def kernels() -> dict:
    """Attention alone: name -> (batch, heads, tokens, dim) -> a call on fresh bf16 q, k, v."""
    from diffscale.runtime.flex_attention import FlexAttnProcessor

    def sdpa(backend):
        def attend(q, k, v):
            if backend is None:
                return F.scaled_dot_product_attention(q, k, v)
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v)
        return attend

    attends = {name: sdpa(b) for name, b in SDPA_KERNELS.items()}
    attends["flex"] = torch.compile(FlexAttnProcessor().attend, dynamic=False)
    attends["flex-default-tiles"] = torch.compile(FlexAttnProcessor({}).attend, dynamic=False)
    # inductor benchmarks its flex configurations per shape (the choice is in the log)
    attends["flex-tuned"] = torch.compile(FlexAttnProcessor({}).attend, dynamic=False,
                                          mode="max-autotune-no-cudagraphs")

    def on_inputs(attend):
        def make(batch, heads, tokens, dim):
            q, k, v = (torch.randn(batch, heads, tokens, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))
            return lambda: attend(q, k, v)
        return make

    return {name: on_inputs(attend) for name, attend in attends.items()}


def layers() -> dict:
    """Whole attention layers as the model runs them: a diffusers ``Attention`` (GroupNorm, q/k/v
    projections, heads, output projection, residual) per processor, compiled, bf16 autocast."""
    from diffusers.models.attention_processor import Attention, AttnProcessor2_0

    from diffscale.runtime.flex_attention import FlexAttnProcessor

    def in_layer(processor):
        def make(batch, heads, tokens, dim):
            channels, side = heads * dim, int(tokens ** 0.5)
            layer = Attention(channels, heads=heads, dim_head=dim, norm_num_groups=32, residual_connection=True,
                              bias=True, upcast_softmax=True, _from_deprecated_attn_block=True).cuda()
            layer.set_processor(processor)
            compiled = torch.compile(layer, dynamic=False)
            x = torch.randn(batch, channels, side, side, device="cuda", requires_grad=True)

            def call():
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    return compiled(x)
            return call
        return make

    processors = {"sdpa": AttnProcessor2_0(), "flex": FlexAttnProcessor(), "flex-default-tiles": FlexAttnProcessor({})}
    return {f"layer {name}": in_layer(p) for name, p in processors.items()}


def measure(preset: str, batch: int, repeats: int, variants: dict, what: str) -> list[dict]:
    """Every variant on every attention call of one training step of ``preset``, against ``sdpa``
    (the first variant) measured in the same run; a variant that cannot take a shape is left out."""
    rows = []
    calls = attention_calls(preset)
    for name, make in variants.items():
        total, ok, per_call = 0.0, True, {}
        for (heads, tokens, dim), count in calls.items():
            try:
                per_call[f"{heads}x{tokens}x{dim}"] = ms = _time_ms(make(batch, heads, tokens, dim), repeats)
                total += count * ms
            except Exception as err:  # a kernel that cannot take the shape (e.g. head dim)
                print(f"{preset} {name}: {str(err).splitlines()[0][:160]}")
                ok = False
                break
        if ok:
            rows.append({"preset": preset, "kernel": name, "batch": batch, "ms_per_step": total,
                         "ms_per_call": per_call, "calls": {f"{h}x{t}x{d}": c for (h, t, d), c in calls.items()}})
    sdpa = rows[0]["ms_per_step"] if rows and rows[0]["kernel"].endswith("sdpa") else None
    for r in rows:
        r["vs_sdpa"] = sdpa / r["ms_per_step"] if sdpa else None
        print(f"{preset:7s} {r['kernel']:20s} batch {batch:5d}: {what} fwd+bwd {r['ms_per_step']:7.2f} ms/step"
              f"  ({_fmt_ratio(r['vs_sdpa'])} x sdpa)  ms per call "
              + " ".join(f"{k}: {v:.3f}" for k, v in r["ms_per_call"].items()), flush=True)
    return rows


def _fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", nargs="+", default=["small", "medium", "xl"])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--layers", action="store_true",
                        help="time whole attention layers (projections, layouts, autocast) per processor")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks.attention times CUDA kernels: no CUDA GPU is visible")
        return 2
    torch._dynamo.config.recompile_limit = 64  # one compiled function per kernel serves every shape
    rows = []
    for preset in args.preset:
        batch = get_preset(preset).train.batch_per_gpu
        variants, what = (layers(), "layer") if args.layers else (kernels(), "attention")
        rows += measure(preset, batch, args.repeats, variants, what)
    if args.json:
        args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
