"""Attention kernels on a preset's own attention shapes, forward + backward, side by side.

``python -m diffscale.bench.attention [--preset small medium xl] [--json OUT]``

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

from ..models import build_unet
from ..presets import get_preset

SDPA_KERNELS = {"sdpa": None, "cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}


def attention_calls(preset: str) -> Counter:
    """(heads, tokens, head dim) of each self-attention call of one forward pass, counted."""
    from diffusers.models.attention_processor import Attention

    cfg = get_preset(preset)
    channels = cfg.model.channels or 1  # the attention shapes do not depend on it
    unet = build_unet(cfg.model, channels).to("meta")
    calls: Counter = Counter()

    def record(module, args, kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]
        tokens = hidden.shape[2] * hidden.shape[3] if hidden.ndim == 4 else hidden.shape[1]
        calls[(module.heads, tokens, module.inner_dim // module.heads)] += 1

    for m in unet.modules():
        if isinstance(m, Attention):
            m.register_forward_pre_hook(record, with_kwargs=True)
    size = cfg.model.sample_size
    with torch.no_grad():
        unet(torch.zeros(1, channels, size, size, device="meta"), torch.zeros(1, device="meta"))
    return calls


def _time_ms(fn, q, k, v, repeats: int) -> float:
    grad = torch.randn_like(fn(q, k, v))
    for _ in range(3):
        fn(q, k, v).backward(grad)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn(q, k, v).backward(grad)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


def kernels() -> dict:
    from ..runtime.flex_attention import FlexAttnProcessor

    def sdpa(backend):
        def run(q, k, v):
            if backend is None:
                return F.scaled_dot_product_attention(q, k, v)
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v)
        return run

    found = {name: sdpa(b) for name, b in SDPA_KERNELS.items()}
    found["flex"] = torch.compile(FlexAttnProcessor().attend, dynamic=False)
    found["flex-default-tiles"] = torch.compile(FlexAttnProcessor({}).attend, dynamic=False)
    # inductor benchmarks its flex configurations per shape (the choice is in the log)
    found["flex-tuned"] = torch.compile(FlexAttnProcessor({}).attend, dynamic=False, mode="max-autotune-no-cudagraphs")
    return found


def layer_variants() -> dict:
    """Processors timed inside a diffusers attention layer (projections, layouts, autocast)."""
    from diffusers.models.attention_processor import AttnProcessor2_0

    from ..runtime.flex_attention import FlexAttnProcessor

    return {"sdpa": AttnProcessor2_0(), "flex": FlexAttnProcessor(), "flex-default-tiles": FlexAttnProcessor({})}


def measure_layers(preset: str, batch: int, repeats: int) -> list[dict]:
    """Each attention layer shape of the preset as the model runs it: a diffusers ``Attention``
    (GroupNorm, q/k/v projections, heads, output projection, residual) under bf16 autocast,
    compiled, forward + backward, per processor."""
    from diffusers.models.attention_processor import Attention

    rows = []
    calls = attention_calls(preset)
    for name, processor in layer_variants().items():
        total, per_call = 0.0, {}
        for (heads, tokens, dim), count in calls.items():
            channels, side = heads * dim, int(tokens ** 0.5)
            layer = Attention(channels, heads=heads, dim_head=dim, norm_num_groups=32, residual_connection=True,
                              bias=True, upcast_softmax=True, _from_deprecated_attn_block=True).cuda()
            layer.set_processor(processor)
            compiled = torch.compile(layer, dynamic=False)
            x = torch.randn(batch, channels, side, side, device="cuda", requires_grad=True)

            def run(x, _k, _v, compiled=compiled):
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    return compiled(x)

            try:
                per_call[f"{heads}x{tokens}x{dim}"] = ms = _time_ms(run, x, None, None, repeats)
                total += count * ms
            except Exception as err:
                print(f"{preset} layer {name}: {str(err).splitlines()[0][:160]}")
                total = float("nan")
                break
        rows.append({"preset": preset, "kernel": f"layer {name}", "batch": batch, "ms_per_step": total,
                     "ms_per_call": per_call, "calls": {f"{h}x{t}x{d}": c for (h, t, d), c in calls.items()}})
    base = rows[0]["ms_per_step"]
    for r in rows:
        r["vs_sdpa"] = base / r["ms_per_step"]
        print(f"{preset:7s} {r['kernel']:20s} batch {batch:5d}: layer fwd+bwd {r['ms_per_step']:7.2f} ms/step"
              f"  ({r['vs_sdpa']:.2f} x sdpa)  ms per call "
              + " ".join(f"{k}: {v:.3f}" for k, v in r["ms_per_call"].items()), flush=True)
    return rows


def measure(preset: str, batch: int, repeats: int) -> list[dict]:
    rows = []
    calls = attention_calls(preset)
    for name, fn in kernels().items():
        total, ok, per_call = 0.0, True, {}
        for (heads, tokens, dim), count in calls.items():
            q, k, v = (torch.randn(batch, heads, tokens, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))
            try:
                per_call[f"{heads}x{tokens}x{dim}"] = ms = _time_ms(fn, q, k, v, repeats)
                total += count * ms
            except Exception as err:  # a kernel that cannot take the shape (e.g. head dim)
                print(f"{preset} {name}: {str(err).splitlines()[0][:120]}")
                ok = False
                break
        if ok:
            rows.append({"preset": preset, "kernel": name, "batch": batch, "ms_per_step": total, "ms_per_call": per_call,
                         "calls": {f"{h}x{t}x{d}": c for (h, t, d), c in calls.items()}})
    sdpa = next((r["ms_per_step"] for r in rows if r["kernel"] == "sdpa"), None)
    for r in rows:
        r["vs_sdpa"] = sdpa / r["ms_per_step"] if sdpa else None
        print(f"{preset:7s} {r['kernel']:9s} batch {batch:5d}: attention fwd+bwd {r['ms_per_step']:7.2f} ms/step"
              f"  ({r['vs_sdpa']:.2f} x sdpa)  calls {r['calls']}  ms per call "
              + " ".join(f"{k}: {v:.3f}" for k, v in r["ms_per_call"].items()), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", nargs="+", default=["small", "medium", "xl"])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--layers", action="store_true",
                        help="time whole attention layers (projections, layouts, autocast) per processor")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench.attention times CUDA kernels: no CUDA GPU is visible")
        return 2
    torch._dynamo.config.recompile_limit = 64  # one compiled function per kernel serves every shape
    rows = []
    for preset in args.preset:
        batch = get_preset(preset).train.batch_per_gpu
        if args.layers:
            rows += measure_layers(preset, batch, args.repeats)
        else:
            rows += measure(preset, batch, args.repeats)
    if args.json:
        args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
