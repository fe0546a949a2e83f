"""Online training: a running simulation feeds samples while a field model trains on them,
in the simulation's own process (``OnlineTrainer.push``) or through a spool directory that
another job follows (``SpoolWriter``; ``diffscale train --data spool:DIR`` or
``OnlineTrainer.follow``). The public entry point; the trainer itself is
training/online.py (an example in its docstring)."""

from diffscale.data.buffer import BufferPolicy, ReplayBuffer
from diffscale.data.spool import SpoolReader, SpoolWriter
from diffscale.training.online import OnlineTrainer

__all__ = ["BufferPolicy", "OnlineTrainer", "ReplayBuffer", "SpoolReader", "SpoolWriter"]
