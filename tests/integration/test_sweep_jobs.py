"""Sweeps as job arrays on the real SLURM and Grid Engine of the test set-up: a user command with
placeholders, a data-fraction x seed study of a tiny CPU training collected into one table, then
copied, damaged and read again (the copy's own runs, a damaged state.json rebuilt, a deleted run
missing and submitted again); an element killed mid-run and resubmitted with --failed resuming
from its checkpoint and ending in the weights of an uninterrupted run; one rank of an element
killed, and the failure reason naming that rank; a shape the cluster cannot hold refused whole."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from scheduler_jobs import discovered_profile, ds, resolve_node_names

from helpers import MICRO

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def slurm_profile(slurm_cluster, tmp_path_factory) -> Path:
    resolve_node_names(slurm_cluster.nodes)
    return discovered_profile("slurm", tmp_path_factory)


@pytest.fixture(scope="module")
def sge_profile(sge_cluster, tmp_path_factory) -> Path:
    return discovered_profile("sge", tmp_path_factory)


def states(sweep: Path) -> dict[str, dict]:
    rc, out = ds("sweep", "status", str(sweep))
    assert rc == 0, out
    return json.loads((sweep / "state.json").read_text())


def wait_sweep(sweep: Path, timeout: float = 600) -> dict[str, dict]:
    """Every element's state once none is pending or running."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = states(sweep)
        if all(s["state"] in ("done", "failed") for s in now.values()):
            return now
        time.sleep(2)
    raise TimeoutError(f"sweep {sweep} still running: {now}")


def tiny_sweep(tmp_path: Path, profile: Path, axes: dict, steps: int, seeds: list[int], *extra: str) -> Path:
    definition = {"name": "tiny", "out": str(tmp_path / "sweep"),
                  "base": {"preset": "tiny", "set": [*MICRO, f"train.steps={steps}", "runtime.device=cpu", *extra]},
                  "axes": axes, "seeds": seeds,
                  "cluster": {"name": str(profile), "procs_per_node": 1, "cpus_per_task": 1, "parallel": 2,
                              "time": "00:20:00"}}
    path = tmp_path / "tiny.yaml"
    path.write_text(json.dumps(definition))
    return path


def test_a_command_sweep_runs_each_element_with_its_values_on_slurm(slurm_profile, tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import pathlib, sys\npathlib.Path('got.txt').write_text(sys.argv[1] + '|' + sys.argv[2])\n")
    rc, out = ds("sweep", "submit", "--cluster", str(slurm_profile), "--procs-per-node", "1", "--time", "00:05:00",
                 "--axis", "lr=1e-4,3e-4", "--axis", "tag=it's $(x),a b", "--out", str(tmp_path / "sweep"),
                 "--", sys.executable, str(script), "{lr}", "{tag}")
    assert rc == 0, out
    final = wait_sweep(tmp_path / "sweep", timeout=300)
    assert [s["state"] for s in final.values()] == ["done"] * 4
    got = sorted((tmp_path / "sweep" / "runs" / f"{i:03d}" / "got.txt").read_text() for i in range(4))
    assert got == sorted(f"{lr}|{tag}" for lr in ("1e-4", "3e-4") for tag in ("it's $(x)", "a b"))


def test_a_data_fraction_by_seed_study_finishes_and_collects_on_slurm(slurm_profile, tmp_path):
    fraction_by_seed_study(slurm_profile, tmp_path)


def test_a_data_fraction_by_seed_study_finishes_and_collects_on_grid_engine(sge_profile, tmp_path):
    fraction_by_seed_study(sge_profile, tmp_path)


def fraction_by_seed_study(profile: Path, tmp_path: Path) -> None:
    """6 elements (3 fractions x 2 seeds, two at a time) of a tiny CPU training: every one done, one
    row per fraction over its seeds. (Each element is a job that imports torch: the study's size is
    most of this test's time.)"""
    definition = tiny_sweep(tmp_path, profile, {"data.fraction": [0.1, 0.5, 1.0]}, steps=4, seeds=[0, 1])
    rc, out = ds("sweep", "submit", str(definition))
    assert rc == 0, out
    final = wait_sweep(tmp_path / "sweep", timeout=900)
    assert [s["state"] for s in final.values()] == ["done"] * 6, final
    rc, out = ds("sweep", "collect", str(tmp_path / "sweep"))
    assert rc == 0, out
    rows = (tmp_path / "sweep" / "collect-summary.csv").read_text().splitlines()
    assert [r.split(",")[:2] for r in rows[1:]] == [["0.1", "2"], ["0.5", "2"], ["1.0", "2"]]
    copied_and_damaged(tmp_path / "sweep", tmp_path / "moved")


def copied_and_damaged(sweep: Path, copy: Path) -> None:
    """The finished study moved elsewhere, then damaged: its state.json cut short and one run
    directory deleted. The copy reads its own runs, rebuilds the states from them, says what is
    missing, and ``sweep submit`` runs the missing element again to its end."""
    shutil.copytree(sweep, copy)
    before = (copy / "collect-runs.csv").read_text()
    shutil.rmtree(sweep)
    rc, out = ds("sweep", "collect", str(copy))
    assert rc == 0, out
    assert (copy / "collect-runs.csv").read_text() == before  # the same runs, read where they are now
    (copy / "state.json").write_text((copy / "state.json").read_text()[:40])
    shutil.rmtree(copy / "runs" / "003")
    rc, out = ds("sweep", "status", str(copy))
    assert rc == 0, out
    assert "state.json is damaged" in out and "5 done, 0 failed, 0 stopped, 1 missing" in out, out
    rc, out = ds("sweep", "report", str(copy))
    assert rc == 0 and "<td>missing</td>" in (copy / "report.html").read_text(), out
    rc, out = ds("sweep", "submit", str(copy))
    assert rc == 0, out
    assert "element 3's run directory was gone" in out and "1 element(s) of shape" in out, out
    final = wait_sweep(copy, timeout=600)
    assert [s["state"] for s in final.values()] == ["done"] * 6, final


def _final_weights(run_dir: Path) -> dict:
    from safetensors.torch import load_file

    newest = sorted((run_dir / "checkpoints").glob("step_*"))[-1]
    return {name: load_file(newest / name) for name in ("model.safetensors", "ema.safetensors")}


def test_a_killed_element_resubmitted_with_failed_ends_bit_for_bit(slurm_profile, tmp_path):
    # long enough that the kill lands between the first checkpoint (step 100) and the end
    definition = tiny_sweep(tmp_path, slurm_profile, {"optim.lr": [2e-4]}, 600, [0], "train.checkpoint_every=100",
                            "train.log_every=50")
    rc, out = ds("sweep", "submit", str(definition))
    assert rc == 0, out
    element = tmp_path / "sweep" / "runs" / "000"
    job = json.loads((element / "jobs.json").read_text())["submissions"][-1]["jobs"][0]["job_id"]
    deadline = time.monotonic() + 300
    while not list((element / "checkpoints").glob("step_*")) and time.monotonic() < deadline:
        time.sleep(0.1)
    saved = sorted((element / "checkpoints").glob("step_*"))
    assert saved, "no checkpoint before the kill: a resubmission would start from step 0"
    subprocess.run(["scancel", job], check=True, timeout=30)
    final = wait_sweep(tmp_path / "sweep", timeout=120)
    assert final["0"]["state"] == "failed", final
    rc, out = ds("sweep", "submit", str(tmp_path / "sweep"), "--failed")
    assert rc == 0, out
    assert wait_sweep(tmp_path / "sweep", timeout=600)["0"]["state"] == "done"
    rc, log = ds("logs", str(element))  # the resubmitted job's log: it resumed, it did not start over
    resumed = int(saved[-1].name.removeprefix("step_"))
    assert rc == 0 and any(f"resumed from step {step}" in log for step in range(resumed, 600)), log
    straight = tmp_path / "straight"
    rc, out = ds("train", str(element / "config.yaml"), "--out", str(straight), timeout=600)
    assert rc == 0, out
    resumed, uninterrupted = _final_weights(element), _final_weights(straight)
    assert resumed.keys() == uninterrupted.keys()
    for name, tensors in resumed.items():
        for key, value in tensors.items():
            assert value.equal(uninterrupted[name][key]), (name, key)


def test_a_killed_rank_is_the_failure_reason_and_the_doctor_agrees_on_slurm(slurm_profile, tmp_path):
    killed_rank(slurm_profile, tmp_path, "SLURM_PROCID")


def test_a_killed_rank_is_the_failure_reason_and_the_doctor_agrees_on_grid_engine(sge_profile, tmp_path):
    killed_rank(sge_profile, tmp_path, "RANK")  # torchrun's ranks on the one host


def killed_rank(profile: Path, tmp_path: Path, rank_variable: str) -> None:
    """One of an element's two ranks killed with kill -9: the survivor's error (a gloo connection
    reset with [host]:port in brackets, or the rank torchrun ended itself) is in the log too; status
    names the killed rank, its signal and the job's exit code, and the doctor says the same."""
    definition = tiny_sweep(tmp_path, profile, {"cluster.shape": ["1x2"]}, 3000, [0],
                            "train.checkpoint_every=100", "train.log_every=20")
    rc, out = ds("sweep", "submit", str(definition))
    assert rc == 0, out
    element = tmp_path / "sweep" / "runs" / "000"
    deadline = time.monotonic() + 300
    while not list((element / "checkpoints").glob("step_*")) and time.monotonic() < deadline:
        time.sleep(0.2)
    rank1 = [pid for pid in _train_pids(element) if _env(pid).get(rank_variable) == "1"]
    assert rank1, "rank 1 is not running"
    os.kill(rank1[0], signal.SIGKILL)
    final = wait_sweep(tmp_path / "sweep", timeout=180)["0"]
    assert final["state"] == "failed" and final["exit_code"] not in (None, 0), final
    assert final["reason"].startswith("rank 1 on ") and " was killed (SIGKILL) while it trained" in final["reason"]
    rc, out = ds("sweep", "status", str(tmp_path / "sweep"))
    assert rc == 0 and "was killed (SIGKILL)" in out, out
    rc, out = ds("doctor", str(element))
    assert rc == 0 and "a rank was killed from outside" in out and "the program raised" not in out, out


def _train_pids(run_dir: Path) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"train" in argv and str(run_dir).encode() in argv and not argv[0].endswith(b"srun"):
                found.append(int(entry.name))
    return found


def _env(pid: int) -> dict[str, str]:
    try:
        pairs = (Path(f"/proc/{pid}") / "environ").read_bytes().split(b"\0")
    except OSError:
        return {}
    return dict(p.decode(errors="replace").split("=", 1) for p in pairs if b"=" in p)


def test_a_shape_the_cluster_cannot_hold_is_refused_before_anything_is_submitted(slurm_profile, tmp_path):
    """The discovered profile knows the partition's 2 nodes: a 3-node element fails its preflight, and
    the 1-node element beside it is not submitted either."""
    rc, out = ds("sweep", "submit", "--cluster", str(slurm_profile), "--procs-per-node", "1", "--time", "00:05:00",
                 "--axis", "cluster.shape=1x1,3x1", "--out", str(tmp_path / "sweep"), "--", "true")
    assert rc == 2, out
    assert "preflight check 'nodes' failed for element 1 (cluster.shape=3x1): 3 nodes > the partition's maximum 2" \
        in out, out
    assert not (tmp_path / "sweep").exists()
