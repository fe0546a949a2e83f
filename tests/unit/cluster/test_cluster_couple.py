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
    assert ("time limit (simulation 1x1): 08:00:00: its partition's maximum (diffscale cannot estimate a "
            "simulation's time; pass --sim-time)") in out
    assert ("time limit (trainer 1x1): 08:00:00: the simulation's wall time (its partition's maximum), so the trainer "
            "can follow it to the end") in out and "rounded up to 15 min" not in out
    assert ("note: the trainer stops once it has trained train.steps=100 steps (estimated 3 min of training), or once "
            "the simulation has ended, however it ends: when its command ends by itself, its script writes ended.json "
            "into the spool with the exit status; a cancel, its time limit or a failed node the trainer learns from "
            "SLURM, which it asks about the simulation's job while it trains. It then trains one more pass over the "
            "final buffer and exits 0, or, after a failure (a non-zero exit status, a failed job) or with a buffer "
            "that never filled, stops with an error naming it; a later job of the trainer trains no more.") in out
    assert "up to its wall time" not in out
    assert "100 steps -> ~3 min" in out  # the estimate in one unit wherever it appears
    assert main([*argv, "--sim-time", "02:00:00", "--time", "01:00:00", str(config), "--", "./icon.exe"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "time limit (simulation 1x1): 02:00:00 (--sim-time)" in out
    assert "time limit (trainer 1x1): 01:00:00 (--time)" in out  # the trainer's own
    assert main([*argv, "--sim-time", "02:00:00", str(config), "--", "./icon.exe"]) == 0
    assert "time limit (trainer 1x1): 02:00:00: the simulation's wall time (--sim-time)" in " ".join(
        capsys.readouterr().out.split())


@pytest.mark.parametrize("chain, jobs, how", [
    ([], 6, "then 4 more trainer segments, each held until the one before has ended"),
    (["--no-chain"], 2, "which requeues itself at each time limit (--no-chain)"),
])
def test_plan_names_the_jobs_submit_sends(chain, jobs, how, tmp_path, capsys):
    argv = [*LEVANTE, "--couple", str(tmp_path / "spool"), "--preset", "field-icon", "--set", "train.steps=20000000",
            "--sim-time", "01:00:00", *chain, "--out", str(tmp_path / "run"), "--", "./icon.exe"]
    assert main(argv) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert (f"note: submit sends {jobs} jobs: the simulation (job-simulation-1x1.slurm.sh), then the trainer "
            "(job-trainer-1x1.slurm.sh) held until the simulation has started (--dependency=after:<simulation job>), "
            f"{how}") in out


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
    out = " ".join(capsys.readouterr().out.split())
    assert ("note: submit sends 2 jobs: the simulation (job-simulation-1x1.sge.sh), then the trainer "
            "(job-trainer-1x1.sge.sh) on its own (Grid Engine cannot hold a job until another starts: -hold_jid "
            "waits for its end)") in out
    assert "a failed node the trainer learns from Grid Engine" in out


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
