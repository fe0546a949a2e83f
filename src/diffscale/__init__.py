"""diffscale: train diffusion models on any device, node or cluster with one config."""

__version__ = "0.1.0"
