"""Race claims: the Python claim and the shell snippet the job scripts run agree, and
exactly one of many simultaneous claimants wins."""

from __future__ import annotations

import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from diffscale.cluster.jobs.race import CLAIM_FILE, claim, claim_snippet, owner


def test_first_claim_wins_and_the_owner_may_come_back(tmp_path):
    assert claim(tmp_path, "1x4").won
    again = claim(tmp_path, "1x4")
    assert again.won and not again.first  # the winner's requeued job
    lost = claim(tmp_path, "4x1")
    assert not lost.won and lost.owner == "1x4"
    assert owner(tmp_path) == "1x4"


def test_exactly_one_of_many_simultaneous_claims_wins(tmp_path):
    keys = [f"{n}x{8 // n}" for n in (1, 2, 4, 8)] * 8
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda k: claim(tmp_path, k), keys))
    firsts = [r for r in results if r.first]
    assert len(firsts) == 1
    assert all(r.owner == firsts[0].owner for r in results)


def _shell(run_dir: Path, key: str, rivals: tuple[str, ...], stub_dir: Path) -> subprocess.CompletedProcess:
    script = (f"RUN_DIR={__import__('shlex').quote(str(run_dir))}\n"
              f"{claim_snippet(key, rivals, 'scancel --name=')}\necho TRAINING\n")
    env = {**os.environ, "PATH": f"{stub_dir}:{os.environ['PATH']}"}
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env)


def test_shell_snippet_wins_cancels_rivals_and_losers_step_aside(hostile_dir, tmp_path):
    stubs = tmp_path / "bin"
    stubs.mkdir()
    (stubs / "scancel").write_text(f"#!/bin/bash\necho \"$*\" >>{tmp_path}/cancelled\n")
    (stubs / "scancel").chmod(0o755)
    win = _shell(hostile_dir, "1x4", ("ds-run-abc-4x1", "ds-run-abc-2x2"), stubs)
    assert "TRAINING" in win.stdout and "owns this run" in win.stdout
    assert (tmp_path / "cancelled").read_text().splitlines() == ["--name=ds-run-abc-4x1", "--name=ds-run-abc-2x2"]
    assert os.readlink(hostile_dir / CLAIM_FILE) == "1x4"
    lose = _shell(hostile_dir, "4x1", ("ds-run-abc-1x4",), stubs)
    assert lose.returncode == 0 and "TRAINING" not in lose.stdout
    assert "shape 1x4 owns this run already; shape 4x1 exits without training" in lose.stdout
    back = _shell(hostile_dir, "1x4", ("ds-run-abc-4x1",), stubs)  # the winner requeued
    assert "TRAINING" in back.stdout
    assert len((tmp_path / "cancelled").read_text().splitlines()) == 2  # no second round of cancels
    # and the Python twin reads the shell's claim
    assert claim(hostile_dir, "4x1").owner == "1x4"
