"""The diffusion process, its training loss and its samplers (wrapping diffusers' schedulers)."""

from .process import GaussianDiffusion
from .sampler import Sampler, SamplerKind, sample

__all__ = ["GaussianDiffusion", "Sampler", "SamplerKind", "sample"]
