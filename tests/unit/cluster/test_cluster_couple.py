"""`diffscale plan --couple`: a simulation job and a trainer job following its spool, from the CLI."""

from __future__ import annotations

import pytest
import yaml

from diffscale.cli import main

from cluster_fixtures import FIXTURES

LEVANTE = ["plan", "--cluster", "dkrz-levante", "--account", "bb1234"]


def test_plan_couple_renders_the_simulation_and_the_trainer(tmp_path, capsys):
    config = tmp_path / "field.yaml"
    config.write_text(yaml.safe_dump({"preset": "field-icon", "train": {"steps": 100}}))
    spool = tmp_path / "spool"
    assert main([*LEVANTE, "--couple", f"{spool}:960", "--sim-nodes", "2", "--sim-procs-per-node", "128",
                 "--out", str(tmp_path / "run"), str(config), "--", "./icon.exe", "run.nml"]) == 0
    out = capsys.readouterr().out
    assert "job script (simulation 2x128)" in out and "job script (trainer 1x1)" in out
    assert "#SBATCH --partition=compute" in out and "#SBATCH --ntasks-per-node=128" in out  # the only CPU partition
    assert f"export DIFFSCALE_SPOOL={spool}" in out and "./icon.exe run.nml &" in out
    assert "preflight: dkrz-levante / gpu, trainer job, shape 1x1" in out
    assert "it trains once its buffer holds 960 samples" in out
    assert not (tmp_path / "run").exists() and not spool.exists()  # plan is a dry run


def test_the_trainers_time_limit_says_it_follows_the_simulation_and_when_each_job_stops(tmp_path, capsys):
    config = tmp_path / "field.yaml"
    config.write_text(yaml.safe_dump({"preset": "field-icon", "train": {"steps": 100}}))
    argv = [*LEVANTE, "--couple", str(tmp_path / "spool"), "--out", str(tmp_path / "run")]
    assert main([*argv, str(config), "--", "./icon.exe"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # notes wrap
    assert ("time limit (simulation 1x1): 08:00:00: the partition's maximum (diffscale cannot estimate a user "
            "command's time; pass --time)") in out
    assert ("time limit (trainer 1x1): 08:00:00: the simulation's wall time (its partition's maximum), so the trainer "
            "can follow it to the end") in out and "rounded up to 15 min" not in out
    assert ("note: the trainer stops once it has trained train.steps=100 steps (estimated 3 min of training), or once "
            "the simulation has ended (up to its wall time, 08:00:00; its script then writes ended.json into the spool "
            "with its exit status) and one more pass over the final buffer is trained; a failed simulation stops the "
            "trainer with its status. What the simulation writes after train.steps is not trained on -- raise "
            "train.steps to train for longer") in out
    assert main([*argv, "--sim-time", "02:00:00", str(config), "--", "./icon.exe"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "time limit (trainer 1x1): 02:00:00: the simulation's wall time (--sim-time)" in out
    assert main([*argv, "--time", "01:00:00", str(config), "--", "./icon.exe"]) == 0  # the trainer's own
    assert "time limit (trainer 1x1): 01:00:00 (--time)" in capsys.readouterr().out


def test_the_config_keeps_its_buffer_size_unless_couple_names_one(tmp_path, capsys):
    config = tmp_path / "field.yaml"
    config.write_text(yaml.safe_dump({"preset": "field-icon", "data": {"source": "spool:/elsewhere:480"}}))
    assert main([*LEVANTE, "--couple", str(tmp_path / "spool"), "--out", str(tmp_path / "run"), str(config),
                 "--", "./sim"]) == 0
    assert "it trains once its buffer holds 480 samples" in capsys.readouterr().out


def test_grid_engine_submits_the_trainer_on_its_own(tmp_path, capsys):
    assert main(["plan", "--cluster", str(FIXTURES / "sge-two-host.yaml"), "--couple", str(tmp_path / "spool"),
                 "--preset", "field-icon", "--sim-partition", "gpu", "--out", str(tmp_path / "run"),
                 "--", "./sim"]) == 0
    out = capsys.readouterr().out
    assert "Grid Engine cannot hold a job until another starts (-hold_jid waits for its end)" in out


@pytest.mark.parametrize("argv, message", [
    (["--couple", "/s", "--preset", "field-icon"], "--couple needs the simulation's command after `--` -- write e.g."),
    (["--couple", "/s", "--", "./sim"], "--couple needs the trainer's config: a CONFIG.yaml right before `--`, or"),
    (["--couple", "/s", "--preset", "field-icon", "--race", "1x1,1x2", "--", "./sim"],
     "--race and --couple cannot be combined"),
    (["--couple", "/s", "--preset", "field-icon", "--sim-procs-per-node", "0", "--", "./sim"],
     "--sim-procs-per-node 0 is out of range: at least 1 process per node -- pass --sim-procs-per-node 1"),
    (["--couple", "/s:0", "--preset", "field-icon", "--", "./sim"],
     "--couple '/s:0' is not a spool directory -- write --couple SPOOL_DIR or SPOOL_DIR:N"),
])
def test_couple_refusals(argv, message, tmp_path, capsys):
    assert main([*LEVANTE, "--out", str(tmp_path / "run"), *argv]) == 2
    assert capsys.readouterr().err.startswith(f"error: {message}")


def test_a_profile_without_one_cpu_partition_asks_which(tmp_path, capsys):
    assert main(["plan", "--cluster", "purdue-gilbreth", "--couple", "/s", "--preset", "field-icon",
                 "--out", str(tmp_path / "run"), "--", "./sim"]) == 2
    assert ("error: which partition should the simulation run on? cluster 'purdue-gilbreth': it has no CPU-only "
            "partition -- pass --sim-partition NAME") in capsys.readouterr().err
