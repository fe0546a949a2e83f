"""How a user's command starts its ranks: plainly (one process per rank, torch ``env://``
variables from the script), or as a PyTorch Lightning trainer.

Lightning brings its own cluster environments: under SLURM its SLURMEnvironment reads
SLURM_NTASKS / SLURM_PROCID / SLURM_LOCALID / SLURM_NODEID and derives MASTER_ADDR/PORT
from the allocation itself, and checks ``--ntasks-per-node`` against ``Trainer(devices=)``;
under torchrun (our Grid Engine scripts) its TorchElasticEnvironment reads torchrun's
RANK / LOCAL_RANK / WORLD_SIZE / GROUP_RANK. ``--launcher auto`` (the default) detects a
Lightning command by reading the Python script it runs for ``import lightning`` /
``import pytorch_lightning`` (``from ... import`` too).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from pathlib import Path

from diffscale.errors import UserError


class Launcher(str, enum.Enum):
    PLAIN = "plain"
    LIGHTNING = "lightning"


_IMPORT = re.compile(r"^\s*(?:import|from)\s+(?:lightning|pytorch_lightning)\b", re.M)
MAX_SCRIPT_BYTES = 4 << 20


def script_of(argv: Sequence[str]) -> Path | None:
    """The Python file a command runs: ``python train.py``, ``./train.py``, ``python -u train.py``."""
    for word in argv[:4]:
        if word.endswith(".py"):
            return Path(word).expanduser()
    return None


def is_lightning_script(path: Path) -> bool:
    try:
        if path.stat().st_size > MAX_SCRIPT_BYTES:
            return False
        return bool(_IMPORT.search(path.read_text(errors="replace")))
    except OSError:
        return False


def resolve(choice: str | None, argv: Sequence[str]) -> Launcher:
    """``--launcher auto|lightning|plain`` for a user command."""
    value = (choice or "auto").lower()
    if value == "auto":
        script = script_of(argv)
        return Launcher.LIGHTNING if script is not None and is_lightning_script(script) else Launcher.PLAIN
    try:
        return Launcher(value)
    except ValueError:
        raise UserError(f"--launcher '{choice}' is not one of auto, lightning, plain",
                        "use --launcher lightning for a Lightning Trainer, plain for any other command") from None
