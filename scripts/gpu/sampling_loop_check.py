"""The recorded DDIM loop (one CUDA graph, on ``diffusion/ddim.py``'s coefficients) against the same
samples step by step (the same sampling network, bf16 autocast, unrecorded) and against diffusers'
``DDIMScheduler`` loop in float64, for a small stand-in
denoiser: leading and trailing spacing, epsilon and v-prediction, with and without guidance.
Prints one JSON line per case and fails where the recorded loop is not recorded, does not replay
the same samples, or is farther from float64 than 4x the step-by-step samples are.

    PYTHONPATH=src python scripts/gpu/sampling_loop_check.py      (one CUDA GPU)
"""

import json
import sys

import torch

from diffscale.config import BetaSchedule, DiffusionConfig, Prediction, RuntimeConfig, TimestepSpacing, Toggle
from diffscale.diffusion import Conditioned, GaussianDiffusion, Sampler, SamplerKind, sample
from diffscale.diffusion.inference import sampling_network
from diffscale.diffusion.sampler import guided

CASES = [("leading", 10, 100, "epsilon", True), ("trailing", 15, 50, "v_prediction", False),
         ("leading", 50, 1000, "epsilon", False)]


class Denoiser(torch.nn.Module):
    """(x (B, 64, 2), t (B,), shift (B,)) -> (B, 64, 2): a fixed random stand-in for a trained network."""

    def __init__(self, trained: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inner, self.outer, self.trained = torch.nn.Linear(3, 64), torch.nn.Linear(64, 2), trained

    def forward(self, x: torch.Tensor, t: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
        time = (t.to(x.dtype) / self.trained).view(-1, 1, 1).expand(*x.shape[:-1], 1)
        return self.outer(torch.tanh(self.inner(torch.cat([x, time], dim=-1)))) + shift.view(-1, 1, 1)


def diffusers_ddim(net: torch.nn.Module, diffusion: GaussianDiffusion, steps: int, x: torch.Tensor,
                   condition: tuple[torch.Tensor, ...], guidance: float | None) -> torch.Tensor:
    """The loop on ``DDIMScheduler.step`` in float64 on the CPU."""
    scheduler = diffusion.ddim_scheduler()
    scheduler.alphas_cumprod = scheduler.alphas_cumprod.double()
    scheduler.final_alpha_cumprod = scheduler.final_alpha_cumprod.double()
    scheduler.set_timesteps(steps)
    net, x = net.cpu().double(), x.double()
    given, unconditional = condition[:1], (condition[1:] or None)
    with torch.no_grad():
        for t in scheduler.timesteps:
            t_batch = torch.full((x.shape[0],), int(t), dtype=torch.long)
            out = guided(net, x, t_batch, tuple(c.double() for c in given),
                         tuple(c.double() for c in unconditional) if unconditional else None,
                         1.0 if guidance is None else guidance)
            x = scheduler.step(out, t, x, eta=0.0).prev_sample
    return x.clamp(-1, 1) if diffusion.cfg.clip_sample else x


def check(spacing: str, steps: int, trained: int, prediction: str, clip: bool, guidance: float | None) -> dict:
    cuda = torch.device("cuda")
    diffusion = GaussianDiffusion(DiffusionConfig(num_train_timesteps=trained, beta_schedule=BetaSchedule.COSINE,
                                                  clip_sample=clip, prediction_type=Prediction(prediction),
                                                  timestep_spacing=TimestepSpacing(spacing)))
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(8, 64, 2, generator=generator)
    condition = (torch.randn(8, generator=generator),) + (() if guidance is None else (torch.zeros(8),))
    net = Denoiser(trained).eval().to(cuda)
    graphed = sampling_network(net, RuntimeConfig(compile=Toggle.OFF, sampling_graph=Toggle.ON))
    assert graphed.loops is not None, "no loop cache: is this a CUDA device?"
    on_device = tuple(c.to(cuda) for c in condition)
    unconditional = on_device[1:] or None
    kinds = {"recorded": Conditioned(graphed, on_device[:1], unconditional=unconditional,
                                     guidance=1.0 if guidance is None else guidance),
             # the same network unrecorded: both run it under bf16 autocast, so the two differ by the loop only
             "step_by_step": Conditioned(sampling_network(net, RuntimeConfig(compile=Toggle.OFF,
                                                                             sampling_graph=Toggle.OFF)),
                                         on_device[:1], unconditional=unconditional,
                                         guidance=1.0 if guidance is None else guidance)}
    samples = {}
    for name in ("recorded", "recorded", "step_by_step"):
        key = name if name not in samples else "replayed"
        samples[key], _ = sample(kinds[name], diffusion, tuple(x.shape), sampler=Sampler(SamplerKind.DDIM, steps),
                                 generator=torch.Generator(), device=cuda, x_init=x)
    reference = diffusers_ddim(net, diffusion, steps, x, condition, guidance)
    single = {name: float((s.double() - reference).abs().max()) for name, s in samples.items()}
    return {"case": [spacing, steps, trained, prediction, clip, guidance], "loops_recorded": len(graphed.loops),
            "max_abs_from_float64": single, "scale": float(reference.abs().max()),
            "replay_equal": bool(torch.equal(samples["recorded"], samples["replayed"]))}


def main() -> None:
    failed = False
    for case in CASES:
        for guidance in (None, 2.0):
            record = check(*case, guidance)
            errors = record["max_abs_from_float64"]
            ok = (record["loops_recorded"] == 1 and record["replay_equal"]
                  and errors["recorded"] <= max(4 * errors["step_by_step"], 1e-5 * max(1.0, record["scale"])))
            failed |= not ok
            print(json.dumps({**record, "ok": ok}))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
