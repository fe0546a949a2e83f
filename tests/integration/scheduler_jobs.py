"""What the real-scheduler tests share: the CLI in a subprocess, a profile discovered from the
live scheduler, and the wait for a run's jobs to end."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest


def ds(*argv: str, timeout: float = 300) -> tuple[int, str]:
    """Run the diffscale CLI in a subprocess (its own stdout); return (exit code, output)."""
    proc = subprocess.run([sys.executable, "-m", "diffscale", *argv], capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr


def resolve_node_names(nodes: list[str]) -> None:
    """The test SLURM's nodes n1/n2 are slurmd instances on this host; a job script's MASTER_ADDR
    is the first node name, so the names must resolve (to 127.0.0.1)."""
    hosts = Path("/etc/hosts").read_text()
    missing = [n for n in nodes if not re.search(rf"^\s*127\.0\.0\.1\s.*\b{n}\b", hosts, re.M)]
    if missing:
        with open("/etc/hosts", "a") as f:
            f.write(f"127.0.0.1 {' '.join(missing)}  # diffscale test SLURM nodes\n")


def discovered_profile(scheduler: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``diffscale cluster discover`` of the live scheduler, as a profile file."""
    out = tmp_path_factory.mktemp("profiles") / f"{scheduler}-test.yaml"
    rc, text = ds("cluster", "discover", "--scheduler", scheduler, "--name", f"{scheduler}-test", "--out", str(out))
    assert rc == 0, text
    return out


def wait_done(run_dir: Path, timeout: float = 120) -> list[dict]:
    """The states of the latest submission's jobs once none is active."""
    from diffscale.cluster.jobs import records as jobs
    from diffscale.cluster.jobs.scheduler import for_kind
    from diffscale.cluster.profiles.types import SchedulerKind

    sub = jobs.latest(run_dir)
    sched = for_kind(SchedulerKind(sub.scheduler))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = sched.states([j.job_id for j in sub.jobs])
        if not any(s.active for s in states):
            return [s.__dict__ for s in states]
        time.sleep(0.5)
    raise TimeoutError(f"jobs of {run_dir} still active: {states}")
