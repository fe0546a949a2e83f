"""Environments for closed-loop evaluation of policies: the built-in reach2d (pure numpy,
nothing downloaded) and PushT (``pusht.py``: gym-pusht, the optional extra ``pusht``, imported
only when asked for)."""

from diffscale.tasks.policy.envs.reach2d import Reach2D, demonstrations

__all__ = ["Reach2D", "demonstrations"]
