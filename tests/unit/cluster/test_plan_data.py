"""plan and submit of a run on the user's own data: the path the job reads (absolute, since the job
runs in its run directory), whether it exists here, and network sizes that follow the data."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from diffscale.cli import main
from diffscale.cluster.jobs.scheduler import Slurm
from diffscale.data.locations import absolute, local_path

PLAN = ["plan", "--cluster", "purdue-gilbreth", "--account", "mylab", "--gpus-per-node", "1"]
POLICY = ["--preset", "policy", "--set", "model.obs_dim=0", "--set", "model.action_dim=0"]


def _demos(path, obs_dim=5):
    rng = np.random.default_rng(0)
    np.savez(path, obs=rng.normal(size=(60, obs_dim)).astype(np.float32),
             action=rng.normal(size=(60, 2)).astype(np.float32), episode_ends=np.array([30, 60]))


class _Recording(Slurm):
    """sbatch stand-in: numbers the jobs."""

    def __init__(self) -> None:
        self.scripts: list[str] = []

    def submit(self, script, run_dir, *, after=None, started=False) -> str:
        self.scripts.append(script.name)
        return str(100 + len(self.scripts))


@pytest.mark.parametrize("spec, path, made", [
    ("zarr:data/pusht.zarr", "data/pusht.zarr", "zarr:{cwd}/data/pusht.zarr"),
    ("zarr:data/pusht.zarr:keypoint+state", "data/pusht.zarr", "zarr:{cwd}/data/pusht.zarr:keypoint+state"),
    ("lerobot:sets/pusht:observation.state", "sets/pusht", "lerobot:{cwd}/sets/pusht:observation.state"),
    ("npz:./demos.npz", "./demos.npz", "npz:{cwd}/demos.npz"),
    ("imagefolder:pictures", "pictures", "imagefolder:{cwd}/pictures"),
    ("emnist:raw:letters", "raw", "emnist:{cwd}/raw:letters"),
    ("mnist:raw", "raw", "mnist:{cwd}/raw"),
    ("spool:spool:3840", "spool", "spool:{cwd}/spool:3840"),
    ("npz:/abs/demos.npz", "/abs/demos.npz", "npz:/abs/demos.npz"),
    ("npz:~/demos.npz", "~/demos.npz", "npz:~/demos.npz"),  # the reader expands ~ where it runs
    ("builtin:reach2d", None, "builtin:reach2d"),
    ("online:fifo:64", None, "online:fifo:64"),
])
def test_the_path_of_each_data_spec_and_the_spec_made_absolute(spec, path, made, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert local_path(spec) == path
    assert absolute(spec) == made.format(cwd=tmp_path)


@pytest.mark.parametrize("flag", [["--data"], ["--set", "data.source="]])
def test_submit_writes_a_relative_data_path_as_an_absolute_one(flag, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    _demos(tmp_path / "data" / "demos.npz")
    sched = _Recording()
    monkeypatch.setattr("diffscale.cluster.jobs.scheduler.for_kind", lambda kind: sched)
    data = ["--data", "npz:data/demos.npz"] if flag == ["--data"] else ["--set", "data.source=npz:data/demos.npz"]
    assert main(["submit", *PLAN[1:], *POLICY, *data, "--out", str(tmp_path / "run")]) == 0
    written = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert written["data"]["source"] == f"npz:{tmp_path / 'data' / 'demos.npz'}"  # the job cds into run/
    assert written["model"]["obs_dim"] == 0 and written["model"]["action_dim"] == 0  # still follow the data
    assert sched.scripts == ["job-1x1.slurm.sh"]


def test_plan_reads_the_sizes_that_follow_the_data_where_it_is_readable(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _demos(tmp_path / "demos.npz", obs_dim=7)
    assert main([*PLAN, *POLICY, "--data", "npz:demos.npz", "--out", str(tmp_path / "run")]) == 0
    printed = capsys.readouterr().out
    out = " ".join(printed.split())  # notes wrap
    assert (f"note: model.obs_dim and model.action_dim follow the data: obs_dim 7, action_dim 2, read from "
            f"npz:{tmp_path / 'demos.npz'} here") in out
    [row] = [line.split("│") for line in printed.splitlines() if line.startswith("│ data ")]
    assert row[2].strip() == "pass" and row[3].strip().startswith(f"npz:{tmp_path}")  # table cells wrap
    assert not (tmp_path / "run").exists()  # plan is a dry run


def test_a_field_run_whose_sizes_follow_built_in_data_plans_with_them(tmp_path, capsys):
    assert main([*PLAN, "--preset", "field-icon", "--set", "model.cond_dim=0", "--set", "model.x_dim=0",
                 "--out", str(tmp_path / "run")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert ("note: model.cond_dim and model.x_dim follow the data: cond_dim 7, x_dim 256, read from "
            "builtin:fields:3840 here") in out and "│ data │" not in out  # built-in data has no path


def test_plan_of_data_elsewhere_uses_the_presets_sizes_and_says_so(tmp_path, capsys):
    elsewhere = "/projectnb/lab/pusht.zarr"  # on the cluster's file system only
    assert main([*PLAN, *POLICY, "--data", f"zarr:{elsewhere}", "--out", str(tmp_path / "run")]) == 0
    out = " ".join(capsys.readouterr().out.split())  # the table wraps long details
    assert (f"note: model.obs_dim and model.action_dim follow the data: obs_dim 4, action_dim 2, the data is not "
            f"readable here (episode data '{elsewhere}' does not exist): the estimates use preset policy's sizes, "
            "and the job reads the data's own") in out
    assert "│ data │ unknown │ zarr:/projectnb/lab/pusht.zarr does not exist on this host │ make sure it exists" in out


def test_a_relative_data_path_that_does_not_exist_here_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main([*PLAN, *POLICY, "--set", "data.source=zarr:data/demos.zarr", "--out", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: data path 'data/demos.zarr' (data.source zarr:data/demos.zarr) does not exist under {tmp_path} -- "
        "the job runs in its run directory, so plan and submit make a relative path absolute from the current one: "
        "run them from the folder the path is relative to, or give the path on the cluster's file system as an "
        "absolute one")


@pytest.mark.parametrize("argv, message", [
    (["--data", "npz:x.npz", "--", "python", "train.py"], "--data applies to diffscale runs, not to a user command"),
    (["--data", "npz:x.npz", "--preset", "field-icon", "--couple", "/s", "--cluster", "dkrz-levante", "--", "./sim"],
     "--data and --couple cannot be combined: the trainer reads the spool --couple names -- drop --data"),
])
def test_data_is_refused_where_the_job_does_not_read_it(argv, message, tmp_path, capsys):
    cluster = [] if "--cluster" in argv else ["--cluster", "purdue-gilbreth"]
    assert main(["plan", *cluster, "--account", "a", "--out", str(tmp_path / "run"), *argv]) == 2
    assert capsys.readouterr().err.startswith(f"error: {message}")


def test_the_data_check_says_where_the_job_reads_its_data():
    from diffscale.cluster.planning.data_checks import data_path
    from diffscale.cluster.planning.workload import DiffscaleRun, UserCommand
    from diffscale.config import presets

    cfg = presets.get_preset("policy")
    cfg.data.source = "zarr:/scratch/pusht.zarr"

    def run(found):
        return DiffscaleRun(config=cfg, run_dir="/r", python="python", data_found=found)

    assert data_path(run(None)) is None and data_path(UserCommand(("true",), "/r", "python")) is None
    assert (data_path(run(True)).ok, data_path(run(True)).detail) == (
        True, "zarr:/scratch/pusht.zarr (found here; the job reads this absolute path)")
    missing = data_path(run(False))
    assert (missing.ok, missing.detail, missing.fix) == (
        None, "zarr:/scratch/pusht.zarr does not exist on this host",
        "make sure it exists on the cluster's file system, where the job reads it, or pass --data with a path that "
        "does")
