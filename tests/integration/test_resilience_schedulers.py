"""Runs outlive their jobs on the real SLURM and Grid Engine; the doctor explains real failed jobs.

* SLURM, a 2-minute limit: the run needs more compute than a job holds, so the first job must be
  stopped. ``--signal=B:USR2@60`` -> every rank checkpoints -> exit 85 -> ``scontrol requeue`` ->
  the job resumes from the newest checkpoint, as often as it takes, and finishes.
* Grid Engine ``h_rt=120`` with a soft limit ``s_rt=60``: SIGUSR1 -> checkpoint -> exit 85 -> the
  script submits a continuation job held on itself -> it resumes, and so on until it finishes.
* Waits end when the jobs do; their deadline is time without a new checkpoint, so a busy machine
  (slower jobs, more of them) passes and a stuck run fails.
* Both runs are submitted at once and wait out their limits side by side, and end with the same
  weights, EMA and optimizer state bit for bit although they were stopped at different steps
  (where both stopped at the same steps, an uninterrupted run in this process is the reference;
  CPU, one thread everywhere: the thread count changes float summation order).
* The doctor names the cause of a job OOM-killed under ``--mem`` and of a job killed at its time limit.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from diffscale.cli import main
from diffscale.runtime import checkpoint as ckpt

pytestmark = pytest.mark.integration

STEPS = 600  # ~75 s of compute on one idle core of the test machine: more than a 2-minute job warned 60 s early holds
LIMIT = ["--time", "00:02:00", "--signal-lead", "60", "--force"]
"""Each job has 60 s before its warning: start-up takes 10-15 s on an idle machine and several
times that on a busy one, which must still leave every job time to train (a 1-minute limit did
not: a job warned before its trainer had started made no progress at all). With 90 s and 900
steps the two runs took up to 9 minutes beside the rest of the suite. ``--force``: plan's wall-time
check assumes a cluster's start-up of minutes and refuses a limit this short."""
RUN = ["--preset", "tiny", "--set", f"train.steps={STEPS}", "--set", "train.batch_per_gpu=16",
       "--set", "train.log_every=5", "--set", "train.checkpoint_every=50", "--set", "train.sample_count=4",
       "--set", "train.sample_steps=2",
       "--max-restarts", "200"]  # a busy machine needs more segments (each is mostly start-up): never the limit here


def ds(*argv: str, timeout: float = 300) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, "-m", "diffscale", *argv], capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr


def profile(scheduler: str, out: Path) -> Path:
    rc, text = ds("cluster", "discover", "--scheduler", scheduler, "--name", f"{scheduler}-test", "--out", str(out))
    assert rc == 0, text
    # a site environment line, as real profiles carry: one intra-op thread, so the job and the
    # in-process reference run sum floats in the same order
    body = out.read_text()
    assert "\nenv: {}\n" in body
    out.write_text(body.replace("\nenv: {}\n", "\nenv:\n  OMP_NUM_THREADS: '1'\n"))
    return out


@pytest.fixture(scope="module")
def slurm_profile(slurm_cluster, tmp_path_factory) -> Path:
    return profile("slurm", tmp_path_factory.mktemp("profiles") / "slurm.yaml")


@pytest.fixture(scope="module")
def sge_profile(sge_cluster, tmp_path_factory) -> Path:
    return profile("sge", tmp_path_factory.mktemp("profiles") / "sge.yaml")


def job_ids(run_dir: Path) -> list[str]:
    return [j["job_id"] for j in json.loads((run_dir / "jobs.json").read_text())["submissions"][-1]["jobs"]]


def _newest_step(run_dir: Path) -> int:
    found = ckpt.list_checkpoints(run_dir)
    return ckpt.step_of(found[-1]) if found else -1


def wait_done(run_dir: Path, timeout: float) -> list[dict]:
    """States once no job of the run is active. The deadline is ``timeout`` s without progress:
    each new checkpoint moves it on, so a busy machine (slower segments, more of them) has the
    time it needs and a stuck run still fails."""
    from diffscale.cluster.jobs import records as jobs
    from diffscale.cluster.jobs.scheduler import for_kind
    from diffscale.cluster.profiles.types import SchedulerKind

    sched = for_kind(SchedulerKind(jobs.latest(run_dir).scheduler))
    deadline, newest = time.monotonic() + timeout, _newest_step(run_dir)
    while time.monotonic() < deadline:
        sub = jobs.latest(run_dir)  # re-read: job scripts may have submitted continuations
        states = sched.states([j.job_id for j in sub.jobs])
        if not any(s.active for s in states) and all(s.state != "GONE" for s in states):
            return [s.__dict__ for s in states]
        if _newest_step(run_dir) != newest:
            deadline, newest = time.monotonic() + timeout, _newest_step(run_dir)
        time.sleep(1)
    raise TimeoutError(f"jobs of {run_dir} made no progress for {timeout} s: {states}")


def reference_run(config: Path, out: Path) -> None:
    """The same config, uninterrupted, in this process on one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main(["train", str(config), "--out", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)


def assert_same_final_state(a: Path, b: Path) -> None:
    la, lb = ckpt.list_checkpoints(a)[-1], ckpt.list_checkpoints(b)[-1]
    assert la.name == lb.name == f"step_{STEPS:08d}"
    for name in ("model", "ema", "optimizer"):
        ta, tb = load_file(str(la / f"{name}.safetensors")), load_file(str(lb / f"{name}.safetensors"))
        assert ta.keys() == tb.keys()
        for key in ta:
            assert torch.equal(ta[key], tb[key]), f"{name}/{key}"


def job_log(run_dir: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted((run_dir / "logs").iterdir()) if p.is_file())


# ----------------------------------------------------------------------------- real failed jobs (SLURM)

@pytest.fixture(scope="module")
def timed_out_job(slurm_profile, tmp_path_factory) -> Path:
    """A job with no warning signal that outlives the 1-minute limit. Submitted once, early (the
    first test asks for it), so its minute passes while the other tests run."""
    run_dir = tmp_path_factory.mktemp("timelimit") / "run"
    rc, out = ds("submit", "--cluster", str(slurm_profile), "--partition", "short", "--procs-per-node", "1",
                 "--cpus-per-task", "1", "--mem", "1", "--out", str(run_dir), "--", "sleep", "600")
    assert rc == 0, out
    return run_dir


@pytest.fixture(scope="module")
def interrupted_runs(slurm_profile, sge_profile, timed_out_job, tmp_path_factory) -> dict[str, Path]:
    """The same run submitted at once to SLURM (``--no-chain``: one job requeued at each limit)
    and to Grid Engine (continuation jobs): their jobs wait out their time limits side by side.
    (``timed_out_job`` first: its minute passes meanwhile.)"""
    base = tmp_path_factory.mktemp("interrupted")
    runs = {"slurm": base / "slurm", "sge": base / "sge"}
    rc, out = ds("submit", "--cluster", str(slurm_profile), "--partition", "cpu", "--procs-per-node", "1", *LIMIT,
                 "--no-chain", "--out", str(runs["slurm"]), *RUN)
    assert rc == 0, out
    rc, out = ds("submit", "--cluster", str(sge_profile), "--procs-per-node", "1", *LIMIT, "--no-chain",
                 "--out", str(runs["sge"]), *RUN)
    assert rc == 0, out
    return runs


def stop_steps(log: str) -> list[int]:
    """The steps at which a run's jobs were told to stop (one per time limit reached)."""
    return [int(m) for m in re.findall(r"stop requested \(SIGUSR\d\) at step (\d+)", log)]


@pytest.mark.timeout(3600)  # each job ends at its time limit: a busy machine needs more of them
def test_slurm_time_limit_requeue_resumes_and_finishes(interrupted_runs):
    run_dir = interrupted_runs["slurm"]
    states = wait_done(run_dir, timeout=400)
    log = job_log(run_dir)
    assert states[0]["state"] == "COMPLETED", (states, log)
    assert "restarts " in states[0]["detail"], states  # it did not fit in one job
    assert "stop requested (SIGUSR2) at step" in log and "requeueing job" in log, log
    assert "resumed from step" in log and f"done: {STEPS} steps" in log, log


def test_doctor_explains_a_real_oom_killed_job(slurm_profile, tmp_path, capsys):
    run_dir = tmp_path / "oom"
    hog = "x = bytearray(1600 << 20); import time; time.sleep(5)"  # 1.6 GB under a 1 GB limit
    rc, out = ds("submit", "--cluster", str(slurm_profile), "--procs-per-node", "1", "--cpus-per-task", "1",
                 "--mem", "1", "--time", "00:05:00", "--out", str(run_dir), "--", sys.executable, "-c", hog)
    assert rc == 0, out
    states = wait_done(run_dir, timeout=120)
    # The kill hits the srun step; the batch script then exits 1, so SLURM 22.05 calls the job
    # FAILED (OUT_OF_MEMORY only when the batch step itself is killed): the log tells the cause.
    assert states[0]["state"] in ("FAILED", "OUT_OF_MEMORY"), states
    assert main(["doctor", str(run_dir)]) == 0
    report = capsys.readouterr().out
    assert "host memory exhausted (OOM kill)" in report
    assert "fix:   ask for more host memory (#SBATCH --mem, or diffscale submit --mem GiB)" in report
    assert "Detected 1 oom-kill event(s) in StepId=" in report
    assert main(["doctor", job_ids(run_dir)[0]]) == 0  # the job id alone: scontrol + its StdOut + jobcomp
    assert "host memory exhausted (OOM kill)" in capsys.readouterr().out


def test_doctor_explains_a_real_time_limit_kill(timed_out_job, capsys):
    states = wait_done(timed_out_job, timeout=150)
    assert states[0]["state"] == "TIMEOUT", states
    assert main(["doctor", str(timed_out_job)]) == 0
    report = capsys.readouterr().out
    assert "SLURM time limit reached" in report
    assert "DUE TO TIME LIMIT" in report or "JobState=TIMEOUT" in report


# ----------------------------------------------------------------------------- Grid Engine

@pytest.mark.timeout(3600)
def test_sge_soft_limit_continues_in_new_jobs_and_finishes(interrupted_runs):
    """s_rt (h_rt - lead) sends SIGUSR1 in time; every rank checkpoints and the script submits a
    continuation job (held on this one), until the target step is reached."""
    run_dir = interrupted_runs["sge"]
    states = wait_done(run_dir, timeout=400)
    log = job_log(run_dir)
    assert len(states) >= 2 and all(s["state"] == "COMPLETED" for s in states), (states, log)
    assert "stop requested (SIGUSR1) at step" in log and "continuation job" in log, log
    assert "resumed from step" in log and f"done: {STEPS} steps" in log, log


@pytest.mark.timeout(3600)
def test_runs_stopped_at_other_steps_end_in_the_state_of_an_uninterrupted_run(interrupted_runs, tmp_path):
    """The two runs were stopped at different steps (each scheduler's limits fall where its jobs
    happened to be), so ending bit for bit equal shows that resuming lost and changed nothing.
    Should both have stopped at the very same steps, an uninterrupted run here is the reference."""
    slurm, sge = interrupted_runs["slurm"], interrupted_runs["sge"]
    for run_dir in (slurm, sge):
        wait_done(run_dir, timeout=400)
    stops = {name: stop_steps(job_log(run_dir)) for name, run_dir in interrupted_runs.items()}
    assert stops["slurm"] and stops["sge"], stops
    if stops["slurm"] == stops["sge"]:
        reference_run(slurm / "config.yaml", tmp_path / "reference")
        assert_same_final_state(tmp_path / "reference", slurm)
    assert_same_final_state(slurm, sge)
