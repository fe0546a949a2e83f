"""Sweeps as job arrays on the real SLURM and Grid Engine of the test set-up: a user command with
placeholders, a data-fraction x seed study of a tiny CPU training collected into one table, and an
element killed mid-run and resubmitted with --failed ending in the weights of an uninterrupted run."""

from __future__ import annotations

import json
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
    subprocess.run(["scancel", job], check=True, timeout=30)
    final = wait_sweep(tmp_path / "sweep", timeout=120)
    assert final["0"]["state"] == "failed", final
    rc, out = ds("sweep", "submit", str(tmp_path / "sweep"), "--failed")
    assert rc == 0, out
    assert wait_sweep(tmp_path / "sweep", timeout=600)["0"]["state"] == "done"
    straight = tmp_path / "straight"
    rc, out = ds("train", str(element / "config.yaml"), "--out", str(straight), timeout=600)
    assert rc == 0, out
    resumed, uninterrupted = _final_weights(element), _final_weights(straight)
    assert resumed.keys() == uninterrupted.keys()
    for name, tensors in resumed.items():
        for key, value in tensors.items():
            assert value.equal(uninterrupted[name][key]), (name, key)
