"""Environments for closed-loop evaluation of policies (pure numpy, nothing downloaded)."""

from .reach2d import Reach2D, demonstrations

__all__ = ["Reach2D", "demonstrations"]
