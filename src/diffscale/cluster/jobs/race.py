"""Racing shapes: submit a run as several shapes; the first job to start owns the run.

The claim is a symbolic link ``RUN_DIR/race.claim -> SHAPE`` made with ``ln -s`` at the
top of the job script, before training. Creating a symlink is atomic (also on NFS): of
several jobs starting at once exactly one succeeds, and the link's target names the
winner without a second write that a rival could observe half-done. The winner cancels
the other shapes by job name (scancel --name / qdel NAME: no job ids needed, so the claim
works even if a job starts before `submit` has written jobs.json). A rival that starts
anyway sees a claim that is not its own and exits 0 without training. The winner's own
requeued or continuation jobs carry the same shape label and go on. No daemon polls.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path

CLAIM_FILE = "race.claim"


@dataclass(frozen=True)
class ClaimResult:
    won: bool
    owner: str
    """Shape label that owns the run."""
    first: bool
    """True when this call created the claim (False: the owner's requeued/next job)."""


def claim(run_dir: str | Path, key: str) -> ClaimResult:
    """Python twin of the shell snippet (same file, same semantics)."""
    path = Path(run_dir) / CLAIM_FILE
    try:
        os.symlink(key, path)
        return ClaimResult(won=True, owner=key, first=True)
    except FileExistsError:
        owner = os.readlink(path)
        return ClaimResult(won=owner == key, owner=owner, first=False)


def owner(run_dir: str | Path) -> str | None:
    path = Path(run_dir) / CLAIM_FILE
    try:
        return os.readlink(path)
    except (FileNotFoundError, OSError):
        return None


def claim_snippet(key: str, rivals: tuple[str, ...], cancel: str) -> str:
    """Shell lines for the job script. ``cancel`` is the command prefix that cancels jobs
    by name (``scancel --name=`` is joined to the name; ``qdel `` takes it as argument)."""
    q = shlex.quote
    if cancel.endswith("="):
        cancels = [f"    {cancel}{q(name)} || true" for name in rivals]
    else:
        cancels = [f"    {cancel} {q(name)} || true" for name in rivals]
    return "\n".join([
        "# Race: the first shape to start owns the run (ln -s is atomic); it cancels the other",
        "# shapes by job name. A rival starting later finds a claim that is not its own and",
        "# exits 0 without training; this shape's own requeued/next jobs find their own claim.",
        f"if ln -s {q(key)} \"$RUN_DIR/{CLAIM_FILE}\" 2>/dev/null; then",
        f"    echo \"diffscale: shape {key} started first and owns this run; cancelling the other shapes\"",
        *cancels,
        f"elif [ \"$(readlink \"$RUN_DIR/{CLAIM_FILE}\")\" != {q(key)} ]; then",
        f"    echo \"diffscale: shape $(readlink \"$RUN_DIR/{CLAIM_FILE}\") owns this run already; "
        f"shape {key} exits without training\"",
        "    exit 0",
        "fi",
    ])
