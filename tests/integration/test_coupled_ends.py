"""A coupled trainer (``diffscale submit --couple``) ends with its simulation however the
simulation ends, on the real SLURM and Grid Engine: a normal end, an end before the trainer's
buffer filled, a failure, a cancel (scancel / qdel) and a kill at its time limit. Each layout
runs once per scheduler, all ten submitted together, and each case's test reads what its layout
left: the trainer ended within a minute of the simulation, with its final checkpoint (or the
failure named), and `status` says so.

The simulation is numpy only (no torch to import): three output steps of 80 cells fill the
trainer's buffer of 240 samples; then it exits with its status, or sleeps until it is cancelled
or killed at its time limit. The trainer's set-up line puts a wrapper of this interpreter first
on PATH (no "activate" in it): the job must run it, and its log says so.
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from scheduler_jobs import discovered_profile, ds, resolve_node_names, wait_done

from diffscale.doctor import diagnose
from diffscale.doctor.sources import gather
from diffscale.runtime import checkpoint as ckpt
from diffscale.runtime.job_end import JobRef, job_end, parse_qacct, parse_scontrol_line

pytestmark = pytest.mark.integration

SIMULATION = r'''
import os, sys, time
import numpy as np
spool, files, status, linger = os.environ["DIFFSCALE_SPOOL"], int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
rng = np.random.default_rng(0)
for step in range(files):  # the spool format: a temporary name, then the next number (tasks/fields/spool.py)
    tmp = os.path.join(spool, f".{step}.tmp.npz")
    np.savez(tmp, cond=rng.normal(size=(80, 7)).astype("f4"), x=rng.normal(size=(80, 256)).astype("f4"),
             sim_time=600.0 * step)
    os.replace(tmp, os.path.join(spool, f"{step:010d}.npz"))
    print("SIMULATION wrote", step, flush=True)
time.sleep(linger)
raise SystemExit(status)
'''

TRAINER = ["--preset", "field-icon", "--set", "runtime.device=cpu", "--set", "model.hidden=32", "--set",
           "model.depth=1", "--set", "model.embed_dim=16", "--set", "train.steps=1000000", "--set",
           "train.log_every=5", "--set", "train.checkpoint_every=10", "--set", "train.sample_count=4", "--set",
           "train.sample_steps=2"]
ONE_PASS = 240 // 16  # steps over the final buffer after the end: its samples over the global batch


@dataclass(frozen=True)
class Case:
    files: int
    status: int
    linger_s: float
    sim_time: str = "00:10:00"
    cancel: bool = False


# name -> the simulation; ordered for submission: the longest first
CASES = {
    "time limit": Case(3, 0, 600, sim_time="limit"),
    "cancel": Case(3, 0, 600, cancel=True),
    "normal end": Case(3, 0, 0),
    "early end": Case(1, 0, 0),
    "failure": Case(3, 3, 0),
}
SIM_TIME = {"slurm": "00:01:00", "sge": "00:00:20"}  # SLURM counts minutes
"""The simulation's wall time in the time-limit case."""


@dataclass
class Layout:
    run_dir: Path
    jobs: list[dict]
    states: dict[str, dict]
    sim_log: str
    train_log: str
    status: str
    gap_s: float
    """How long the trainer ran on after the simulation ended (``_ran_on_s``)."""


def _programs(tmp: Path) -> tuple[Path, Path]:
    """(the simulation's script, a python of an environment the trainer's set-up puts on PATH)."""
    script = tmp / "simulation.py"
    script.write_text(SIMULATION)
    wrapper = tmp / "env" / "bin" / "python"
    wrapper.parent.mkdir(parents=True, exist_ok=True)
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    return script, wrapper


def _submit(scheduler: str, profile: Path, tmp: Path, name: str, case: Case) -> Path:
    script, wrapper = tmp / "simulation.py", tmp / "env" / "bin" / "python"
    run_dir = tmp / f"{name} it's \"odd\""  # quotes and spaces, as users name folders (no '$': SGE refuses it)
    sim_time = SIM_TIME[scheduler] if case.sim_time == "limit" else case.sim_time
    shape = ["--procs-per-node", "1", "--cpus-per-task", "1", "--sim-cpus-per-task", "1"]
    if scheduler == "slurm":
        shape += ["--sim-partition", "cpu", "--mem", "2"]
    else:
        shape += ["--sim-partition", "all.q"]
    rc, out = ds("submit", "--cluster", str(profile), "--couple", f"{run_dir / 'spool'}:240", *shape,
                 "--sim-time", sim_time, "--time", "00:10:00", "--no-chain", "--force",
                 "--setup", f"export PATH={wrapper.parent}:$PATH", "--out", str(run_dir), *TRAINER,
                 "--", str(wrapper), str(script), str(case.files), str(case.status), str(case.linger_s))
    assert rc == 0, out
    return run_dir


def _jobs(run_dir: Path) -> list[dict]:
    return json.loads((run_dir / "jobs.json").read_text())["submissions"][-1]["jobs"]


def _cancel_once_training(run_dir: Path, cancel: list[str], errors: list[str]) -> None:
    """What a user does: the trainer trains, and the simulation job is cancelled under it."""
    metrics, deadline = run_dir / "metrics.jsonl", time.monotonic() + 420
    while time.monotonic() < deadline:
        if metrics.is_file() and '"kind": "ready"' in metrics.read_text():
            subprocess.run([*cancel, _jobs(run_dir)[0]["job_id"]], capture_output=True, timeout=60)
            return
        time.sleep(0.5)
    errors.append(f"{run_dir}: the trainer never trained")


def _times(scheduler: str, job_id: str) -> tuple[float, float]:
    """(start, end) of a job that ended, as its scheduler recorded them (epoch seconds)."""
    ended = job_end(JobRef(scheduler, job_id))
    assert ended is not None and ended.at is not None, (job_id, ended)
    if scheduler == "slurm":
        shown = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=60)
        start = parse_scontrol_line(shown.stdout)["StartTime"]
        return datetime.datetime.strptime(start, "%Y-%m-%dT%H:%M:%S").timestamp(), ended.at
    record = parse_qacct(subprocess.run(["qacct", "-j", job_id], capture_output=True, text=True, timeout=60).stdout)
    return datetime.datetime.strptime(record["start_time"], "%a %b %d %H:%M:%S %Y").timestamp(), ended.at


def _ran_on_s(scheduler: str, sim: str, trainer: str) -> float:
    """How long the trainer ran on after its simulation ended (or after it started, when it started
    later: Grid Engine may queue it until a slot is free)."""
    sim_end, (trainer_start, trainer_end) = _times(scheduler, sim)[1], _times(scheduler, trainer)
    return trainer_end - max(sim_end, trainer_start)


def _layout(scheduler: str, run_dir: Path) -> Layout:
    """What one layout left, once its jobs have ended."""
    states = {s["job_id"]: s for s in wait_done(run_dir, timeout=480)}
    jobs = _jobs(run_dir)
    rc, status = ds("status", str(run_dir))
    assert rc == 0, status
    return Layout(run_dir, jobs, states, (run_dir / jobs[0]["log"]).read_text(), (run_dir / jobs[1]["log"]).read_text(),
                  " ".join(status.split()), _ran_on_s(scheduler, jobs[0]["job_id"], jobs[1]["job_id"]))


@pytest.fixture(scope="module")
def layouts(slurm_cluster, sge_cluster, tmp_path_factory) -> dict[str, dict[str, Layout]]:
    """Every case on both schedulers, all submitted at once so that they run side by side (the
    time-limit cases set the pace: SLURM counts its limits in minutes and checks them every ~30 s)."""
    resolve_node_names(slurm_cluster.nodes)
    schedulers = ("slurm", "sge")
    profiles = {s: discovered_profile(s, tmp_path_factory) for s in schedulers}
    tmp = {s: tmp_path_factory.mktemp(f"{s}-ends") for s in schedulers}
    for folder in tmp.values():
        _programs(folder)
    with ThreadPoolExecutor(2 * len(CASES)) as pool:
        submitted = {(s, name): pool.submit(_submit, s, profiles[s], tmp[s], name, case)
                     for name, case in CASES.items() for s in schedulers}
        run_dirs = {key: future.result() for key, future in submitted.items()}
    errors: list[str] = []
    watchers = [threading.Thread(target=_cancel_once_training, daemon=True,
                                 args=(run_dirs[s, "cancel"], ["scancel" if s == "slurm" else "qdel"], errors))
                for s in schedulers]
    for watcher in watchers:
        watcher.start()
    found = {s: {name: _layout(s, run_dirs[s, name]) for name in CASES} for s in schedulers}
    for watcher in watchers:
        watcher.join(timeout=10)
    assert not errors, errors
    return found


# How each end reads: the trainer's last words, `status`'s line, the simulation job's state.
DONE = {"normal end": "exit status 0", "cancel": "cancelled", "time limit": "killed at its time limit"}
SIM_STATE = {"slurm": {"normal end": "COMPLETED", "cancel": "CANCELLED", "time limit": "TIMEOUT",
                       "early end": "COMPLETED", "failure": "FAILED"},
             "sge": {"normal end": "COMPLETED", "cancel": "FAILED", "time limit": "FAILED",  # qacct: failed 100 / 37
                     "early end": "COMPLETED", "failure": "FAILED"}}


def _check(layout: Layout, name: str, scheduler: str) -> None:
    spool, log = layout.run_dir / "spool", layout.sim_log + layout.train_log
    sim, trainer = (layout.states[j["job_id"]]["state"] for j in layout.jobs)
    assert len(layout.jobs) == 2 and sim == SIM_STATE[scheduler][name], (layout.states, log)
    assert layout.gap_s <= 60, (layout.gap_s, log)  # the trainer ended within a minute of the simulation
    assert f"diffscale: python {layout.run_dir.parent / 'env' / 'bin' / 'python'}" in layout.train_log, log
    assert json.loads((spool / "job.json").read_text())["job_id"] == layout.jobs[0]["job_id"]
    state = ckpt.load_checkpoint(ckpt.list_checkpoints(layout.run_dir)[-1])
    assert "requeueing" not in log and "continuation job" not in log
    if name in DONE:
        assert trainer == "COMPLETED", (layout.states, log)
        assert state.task["buffer_counters"].tolist() == [240, 240, 3, 3]
        ended = [json.loads(r) for r in (layout.run_dir / "metrics.jsonl").read_text().splitlines()
                 if '"source_ended"' in r]
        assert len(ended) == 1 and state.step == ended[0]["step"] + ONE_PASS, log
        assert f"the simulation writing {spool} ended ({DONE[name]}" in log and f"done: {state.step} steps" in log
        assert f"done: the simulation ended ({DONE[name]} at 20" in layout.status, layout.status
        assert (spool / "ended.json").exists() == (name == "normal end")  # a stop from outside writes none
    else:
        assert trainer == "FAILED", (layout.states, log)
        failed = 3 if scheduler == "slurm" else 1  # Grid Engine's torchrun reports a failed command as 1
        error = (f"the simulation writing {spool} ended (exit status 0) after 80 samples in 1 spool files, fewer than "
                 "the 240 the buffer waits for" if name == "early end" else
                 f"the simulation writing {spool} failed (exit status {failed}) after 3 spool files")
        assert f"error: {error}; checkpointed at step 0" in layout.train_log, log
        assert f"stopped: {error}; it ended at 20" in layout.status, layout.status
        found = gather(str(layout.run_dir))  # doctor: each log read once, the simulation's end named
        logs = [Path(o).resolve() for o, _ in found.texts if Path(o).is_file()]
        assert len(logs) == len(set(logs)) == 2, logs
        rule = "simulation-too-short" if name == "early end" else "simulation-failed"
        assert rule in {f.rule for f in diagnose(found)}


@pytest.mark.parametrize("name", CASES)
def test_slurm_coupled_trainer_ends_with_its_simulation(layouts, name):
    _check(layouts["slurm"][name], name, "slurm")
    if name == "normal end":  # held until the simulation started (--dependency=after:)
        layout = layouts["slurm"][name]
        assert layout.jobs[1]["after"] == layout.jobs[0]["job_id"] and layout.jobs[0]["after"] is None
        assert [j["script"] for j in layout.jobs] == ["job-simulation-1x1.slurm.sh", "job-trainer-1x1.slurm.sh"]
        assert layout.sim_log.count("SIMULATION wrote") == 3
        spool = layout.run_dir / "spool"
        assert f"data spool {spool}" in layout.train_log
        assert f"buffer full: 240 samples from 3 spool files of {spool}" in layout.train_log


@pytest.mark.parametrize("name", CASES)
def test_sge_coupled_trainer_ends_with_its_simulation(layouts, name):
    _check(layouts["sge"][name], name, "sge")
