"""status and cancel against the real SLURM and Grid Engine: states that are not final stay active,
Grid Engine codes read as words, what diffscale cancelled reads as cancelled, and a job id that
now names another job is neither reported nor cancelled.

Every wait polls the scheduler for a state with a deadline: nothing depends on how long an idle
machine takes.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from scheduler_jobs import discovered_profile, ds

pytestmark = pytest.mark.integration


def wait_for(what: str, check: Callable[[], object], timeout: float = 180) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    raise TimeoutError(f"{what}: not after {timeout} s")


def job_record(run_dir: Path) -> dict[str, str]:
    return json.loads((run_dir / "jobs.json").read_text())["submissions"][-1]["jobs"][0]


def job_id(run_dir: Path) -> str:
    return job_record(run_dir)["job_id"]


def slurm_log(cluster, job: str) -> str:
    """slurmctld's lines about ``job`` (what it did with a signal), for a failure's message."""
    log = cluster.state_dir / "log" / "slurmctld.log"
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    return "\n".join(line for line in lines if f"JobId={job}" in line or f"job {job}" in line.lower()) or "(none)"


def status(run_dir: Path) -> str:
    rc, out = ds("status", str(run_dir))
    assert rc == 0, out
    return out


def status_once(run_dir: Path, words: str, timeout: float = 180) -> str:
    """`diffscale status` once it shows ``words``."""
    def shown() -> str | None:
        text = status(run_dir)
        return text if words in text else None
    return str(wait_for(f"status shows {words!r}", shown, timeout))


@pytest.fixture(scope="module")
def slurm_profile(slurm_cluster, tmp_path_factory) -> Path:
    return discovered_profile("slurm", tmp_path_factory)


@pytest.fixture(scope="module")
def sge_profile(sge_cluster, tmp_path_factory) -> Path:
    return discovered_profile("sge", tmp_path_factory)


def sleeper(profile: Path, run_dir: Path, *extra: str) -> str:
    rc, out = ds("submit", "--cluster", str(profile), "--procs-per-node", "1", "--cpus-per-task", "1", "--mem", "1",
                 "--time", "00:05:00", "--out", str(run_dir), *extra, "--", "sleep", "300")
    assert rc == 0, out
    return job_id(run_dir)


# ----------------------------------------------------------------------------- SLURM

def test_slurm_plan_says_no_time_limit_is_passed_on_a_partition_without_one(slurm_profile, tmp_path):
    rc, out = ds("plan", "--cluster", str(slurm_profile), "--procs-per-node", "1", "--out", str(tmp_path / "r"),
                 "--", "sleep", "1")
    assert rc == 0, out
    assert ("time limit (1x1): none passed to the scheduler: partition 'cpu''s default applies, UNLIMITED "
            "(recorded in the profile by cluster discover)") in out
    assert "#SBATCH --time" not in out


def test_slurm_a_stopped_job_is_active_and_cancel_stops_it(slurm_cluster, slurm_profile, tmp_path):
    run_dir = tmp_path / "stopped"
    job = sleeper(slurm_profile, run_dir)
    try:
        wait_for("the job runs", lambda: slurm_cluster.job(job).get("JobState") == "RUNNING")
        # its batch script started (slurmstepd opened the log): the STOP is not sent mid-launch
        wait_for("the job's log", (run_dir / job_record(run_dir)["log"]).exists)

        def stopped() -> bool:
            # slurmctld keeps STOPPED only for a signal it accepted; on a busy host a signal sent while
            # the job is still being set up was once lost (CI, 2026-11-27), so it is sent until it holds
            subprocess.run(["scancel", "--signal=STOP", job], check=True, timeout=30)
            return any(slurm_cluster.job(job).get("JobState") == "STOPPED" or time.sleep(0.5) for _ in range(10))

        try:
            wait_for("the job is STOPPED", stopped)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}; slurmctld's log of it:\n{slurm_log(slurm_cluster, job)}") from None
        shown = status(run_dir)
        assert re.search(rf"{job}\s.*STOPPED", shown) and "exit" not in shown, shown
        rc, out = ds("cancel", str(run_dir))
        assert rc == 0 and f"cancelled 1 job(s): {job}" in out, out
        wait_for("the job is CANCELLED", lambda: slurm_cluster.job(job).get("JobState") == "CANCELLED")
        assert "CANCELLED" in status(run_dir)
    finally:
        subprocess.run(["scancel", job], timeout=30)


def test_slurm_a_job_id_that_now_names_another_job_is_not_touched(slurm_cluster, slurm_profile, tmp_path):
    """jobs.json of a run whose scheduler was reinstalled: its id now belongs to an unrelated job."""
    other = slurm_cluster.sbatch("--job-name=someone-elses", "-o", "/dev/null", "--wrap", "sleep 300", cwd=tmp_path)
    run_dir = tmp_path / "old-run"
    run_dir.mkdir()
    record = {"job_id": other, "name": "ds-old-run-0a1b2c", "shape": "1x1", "partition": "cpu",
              "script": "job-1x1.slurm.sh", "log": f"logs/ds-old-run-0a1b2c-{other}.out"}
    (run_dir / "jobs.json").write_text(json.dumps({"submissions": [{
        "scheduler": "slurm", "cluster": "slurm-test", "submitted_at": "2026-01-01T00:00:00+00:00",
        "run_dir": str(run_dir), "what": "an old run", "jobs": [record], "user": "root"}]}))
    try:
        for verb in ("status", "cancel"):
            rc, out = ds(verb, str(run_dir))
            assert rc == 2, out
            assert f"error: job {other} of {run_dir / 'jobs.json'} is named 'someone-elses', but diffscale " \
                   "submitted 'ds-old-run-0a1b2c'" in out, out
        assert slurm_cluster.job(other)["JobState"] in ("PENDING", "RUNNING")  # not cancelled
    finally:
        subprocess.run(["scancel", other], timeout=30)


# ----------------------------------------------------------------------------- Grid Engine

def test_sge_state_codes_read_as_words_and_a_cancelled_pending_job_as_cancelled(sge_profile, tmp_path):
    # 8 slots on a 4-slot host: the job waits forever (preflight says so; --force submits it anyway)
    run_dir = tmp_path / "held"
    rc, out = ds("submit", "--cluster", str(sge_profile), "--procs-per-node", "1", "--cpus-per-task", "8",
                 "--time", "00:05:00", "--force", "--out", str(run_dir), "--", "sleep", "300")
    assert rc == 0, out
    job = job_id(run_dir)
    try:
        status_once(run_dir, "PENDING")
        subprocess.run(["qhold", job], check=True, timeout=30)
        assert "state hqw" in status_once(run_dir, "PENDING (held)")
        rc, out = ds("cancel", str(run_dir))
        assert rc == 0 and f"cancelled 1 job(s): {job}" in out, out
        shown = status_once(run_dir, "CANCELLED")
        assert "by diffscale cancel" in shown and "FAILED" not in shown, shown
    finally:
        subprocess.run(["qdel", job], capture_output=True, timeout=30)


def test_sge_a_cancelled_running_job_reads_as_cancelled_not_failed(sge_profile, tmp_path):
    run_dir = tmp_path / "running"
    job = sleeper(sge_profile, run_dir)
    try:
        status_once(run_dir, "RUNNING")
        rc, out = ds("cancel", str(run_dir))
        assert rc == 0 and f"cancelled 1 job(s): {job}" in out, out
        shown = status_once(run_dir, "exit 137")  # qacct has the job
        assert "CANCELLED" in shown and "FAILED" not in shown, shown
        rc, out = ds("cancel", str(run_dir))
        assert rc == 0 and "nothing to cancel" in out, out
    finally:
        subprocess.run(["qdel", job], capture_output=True, timeout=30)
