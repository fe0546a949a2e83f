"""Online training: a running simulation feeds samples while a field model trains on them,
in the simulation's own process (``OnlineTrainer.push``) or through a spool directory that
another job follows (``SpoolWriter``; ``diffscale train --data spool:DIR`` or
``OnlineTrainer.follow``). See trainer.py for an example."""

from ..data.buffer import BufferPolicy, ReplayBuffer
from ..data.spool import SpoolReader, SpoolWriter
from .trainer import OnlineTrainer

__all__ = ["BufferPolicy", "OnlineTrainer", "ReplayBuffer", "SpoolReader", "SpoolWriter"]
