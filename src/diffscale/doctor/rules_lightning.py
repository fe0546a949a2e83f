"""A PyTorch Lightning job that hung at start-up: its rendezvous lines stop short of the world.

Lightning prints ``Initializing distributed: GLOBAL_RANK: k, MEMBER: m/N`` once per process
as it joins; when fewer than N distinct ranks appear and the job then ends by its time limit
or a cancel, the processes waited for peers that never came. Two causes are told apart by
the lines themselves: every process calling itself rank 0 (Lightning launched its own
processes on each node because SLURM's tasks per node did not match ``devices``), or only
some ranks appearing, or a single process (the other nodes' tasks were never started: no ``srun``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from diffscale.doctor.rules import Finding, TextRule, strip_rank_prefix

_MEMBER = re.compile(r"Initializing distributed: GLOBAL_RANK: (?P<rank>\d+), MEMBER: (?P<member>\d+)/(?P<world>\d+)")

_ALL_RANK_0 = ("every process that started called itself global rank 0 ({lines} times): they were not one SLURM "
               "job step whose tasks each got their own SLURM_PROCID, so each waited for {missing} peers that "
               "never came (tasks per node did not match the Trainer's devices, and Lightning started its own "
               "processes on each node)")
_NO_SRUN = ("the other nodes never started: no srun -- one process (global rank 0 of {world}) joined and waited for "
            "{missing} peers that were never launched: the command ran once in the batch shell instead of as an srun "
            "step with one task per device")
_SOME_RANKS = ("only global ranks {ranks} of {world} joined: the tasks of the other nodes were never started "
               "(the command was not started with srun on every node, or --ntasks-per-node is below the Trainer's "
               "devices), so the ranks that came waited until the job was ended")


def _hang(values: Mapping[str, str], lines: Sequence[str], index: int) -> Mapping[str, str] | None:
    ranks: list[int] = []
    world = int(values["world"])
    for line in lines:
        m = _MEMBER.search(strip_rank_prefix(line))
        if m and int(m.group("world")) == world:
            ranks.append(int(m.group("rank")))
    seen = sorted(set(ranks))
    if len(seen) >= world:
        return None  # everybody joined: whatever ended the job, it was not the rendezvous
    if len(ranks) == 1:
        cause = _NO_SRUN.format(world=world, missing=world - 1)
    elif seen == [0]:
        cause = _ALL_RANK_0.format(lines=len(ranks), missing=world - 1)
    else:
        cause = _SOME_RANKS.format(ranks=", ".join(map(str, seen)), world=world)
    return {"why": cause, "joined": str(len(seen))}


TEXT_RULES: tuple[TextRule, ...] = (
    TextRule(
        "lightning-rendezvous-hang", "Lightning hung at start-up (rendezvous incomplete)",
        (_MEMBER.pattern,),
        "{joined} of {world} ranks reached Lightning's rendezvous before the job was ended: {why}",
        "start one task per device with srun: #SBATCH --nodes=N --ntasks-per-node=<devices per node>, "
        "`srun python my_trainer.py`, and Trainer(devices=<devices per node>, num_nodes=N) to match; "
        "`diffscale submit --cluster NAME --nodes N --gpus-per-node G -- python my_trainer.py` writes such a script "
        "(it detects Lightning and leaves MASTER_ADDR/PORT to it)",
        requires=(r"CANCELLED AT|DUE TO TIME LIMIT|JobState=(?:TIMEOUT|CANCELLED)|\|(?:TIMEOUT|CANCELLED)",),
        derive=_hang,
    ),
)


SILENT_HANG_S = 600
"""A log that stopped growing this long after an incomplete rendezvous is taken for a hang."""
_ENDED = re.compile(r"CANCELLED AT|DUE TO TIME LIMIT|JobState=|\|(?:TIMEOUT|CANCELLED|COMPLETED|FAILED)|Traceback")


def silent_hang(origin: str, text: str, silent_s: float) -> Finding | None:
    """A job still running whose log stopped after an incomplete Lightning rendezvous: the
    same diagnosis as at its time limit, from how long the log has been silent."""
    if silent_s < SILENT_HANG_S or _ENDED.search(text):
        return None
    lines = text.splitlines()
    for index in range(len(lines) - 1, -1, -1):
        m = _MEMBER.search(strip_rank_prefix(lines[index]))
        if m is None:
            continue
        values = _hang(m.groupdict(), lines, index)
        if values is None:
            return None
        return Finding("lightning-rendezvous-hang", "Lightning hung at start-up (rendezvous incomplete)",
                       f"{values['joined']} of {m.group('world')} ranks reached Lightning's rendezvous and the log "
                       f"has been silent for {silent_s / 60:.0f} min since (the job is still running, hung): "
                       f"{values['why']}", TEXT_RULES[0].fix + "; cancel this job, it will not recover",
                       origin, lines[index].strip()[:300], index)
    return None
