"""Online training: a running simulation feeds samples while a field model trains on them,
in the simulation's own process (``OnlineTrainer.push``) or through a spool directory that
another job follows (``SpoolWriter``; ``diffscale train --data spool:DIR`` or
``OnlineTrainer.follow``). The public entry point, the one package outside tasks/ that names the fields
task; the trainer is online/trainer.py (an example in its docstring), its sampler online/sampling.py."""

from diffscale.online.trainer import OnlineTrainer
from diffscale.tasks.fields.buffer import BufferPolicy, ReplayBuffer
from diffscale.tasks.fields.spool import SpoolReader, SpoolWriter

__all__ = ["BufferPolicy", "OnlineTrainer", "ReplayBuffer", "SpoolReader", "SpoolWriter"]
