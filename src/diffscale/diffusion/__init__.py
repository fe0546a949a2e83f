"""The diffusion process, its training loss and its samplers (wrapping diffusers' schedulers)."""

from diffscale.diffusion.process import GaussianDiffusion
from diffscale.diffusion.sampler import Conditioned, Sampler, SamplerKind, evaluating, sample

__all__ = ["Conditioned", "GaussianDiffusion", "Sampler", "SamplerKind", "evaluating", "sample"]
