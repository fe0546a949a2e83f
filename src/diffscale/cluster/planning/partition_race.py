"""``--partition auto --race N``: the N candidates that finish first, submitted as one race.

Each candidate is its own partition and shape, so it races under the key ``<partition>-<NxG>``
(``h200-1x8``, ``l40s-4x4``): the claim (``RUN_DIR/race.claim -> KEY``), its job name and its
script file. Shapes alone may repeat across partitions (``a100-1x4`` and ``l40s-1x4``); the
key keeps the rivals apart. The claim and cancel-by-name are :mod:`.race`'s, unchanged.
"""

from __future__ import annotations

import hashlib
import re

from diffscale.cluster.planning.partition_choice import Candidate
from diffscale.cluster.planning.plan import Plan, with_race
from diffscale.cluster.scripts.jobspec import RaceSpec, job_name
from diffscale.errors import UserError


def race_label(partition: str, shape: str) -> str:
    """``<partition>-<NxG>`` in letters, digits and dashes: a job-name suffix both schedulers
    take and a plain file name for the claim."""
    safe = re.sub(r"[^A-Za-z0-9]+", "-", partition).strip("-")
    if safe != partition:  # two names may clean to one ("a.b", "a_b"): the original's hash keeps them apart
        safe = f"{safe or 'p'}-{hashlib.sha1(partition.encode()).hexdigest()[:4]}"
    return f"{safe}-{shape}"


def label_of(c: Candidate) -> str:
    return race_label(c.plan.partition.name, c.plan.shape.label)


def raced(fit: list[Candidate], count: int) -> list[Candidate]:
    """The first ``count`` of the ranked candidates that can be picked (best first)."""
    if len(fit) >= count:
        return fit[:count]
    if len(fit) == 1:
        raise UserError(f"--race {count}: only one candidate can be raced ({label_of(fit[0])}); a race needs two",
                        "submit the pick alone with its --partition and shape, or allow more shapes (--nodes)")
    raise UserError(f"--race {count} is more than the {len(fit)} candidates that can be raced (those with no problem "
                    "in the note column above)", f"pass --race {len(fit)} or less")


def raced_plans(chosen: list[Candidate]) -> list[Plan]:
    """Each candidate's plan as one rival of the race: it claims the run with its key and
    cancels the others by their job names."""
    keys = [label_of(c) for c in chosen]
    plans = []
    for c, key in zip(chosen, keys, strict=True):
        rivals = tuple(job_name(c.plan.workload.run_dir, k) for k in keys if k != key)
        plans.append(with_race(c.plan, RaceSpec(key, rivals)))
    return plans
