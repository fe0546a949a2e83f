"""The diffusion process, its training loss and its samplers (wrapping diffusers' schedulers)."""

from .process import GaussianDiffusion
from .sampler import Conditioned, Sampler, SamplerKind, evaluating, sample

__all__ = ["Conditioned", "GaussianDiffusion", "Sampler", "SamplerKind", "evaluating", "sample"]
