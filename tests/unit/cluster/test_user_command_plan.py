"""plan for a user's own command: memory from a probe or the user's statement, the Lightning
script, and --partition auto (recorded `sbatch --test-only` answers)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import re
import subprocess
from pathlib import Path

import pytest

from diffscale.cli import main
from diffscale.cluster.planning.partition_auto import compare
from diffscale.cluster.planning.partition_choice import parse_squeue_start, parse_test_only, pick
from diffscale.cluster.planning.plan import PlanOptions, make_plan
from diffscale.cluster.planning.shape import Shape
from diffscale.cluster.planning.usage import rank_usage
from diffscale.cluster.planning.workload import UserCommand
from diffscale.cluster.scripts.launcher import Launcher, resolve

from cluster_fixtures import FIXTURES, fixture_profile, probe_file, recorded_start

GOLDEN = Path(__file__).resolve().parents[2] / "golden"
RUN_DIR = "/scratch/it's a \"weird\" $HOME `date` dir\nline two"
PYTHON = "/opt/diffscale-venv/bin/python"
LAB = str(FIXTURES / "lab-l40s-h200.yaml")


def test_the_users_oom_is_refused_from_their_statement(tmp_path, capsys):
    """4 x L40S per 256 GB node, num_workers=8 each holding a copy of the data: the job that was OOM-killed."""
    code = main(["plan", "--cluster", LAB, "--nodes", "4", "--gpus-per-node", "4", "--mem-per-rank", "5.1",
                 "--workers-per-rank", "8", "--worker-mem", "7.3", "--out", str(tmp_path / "r"), "--",
                 "python", "train.py"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert ("4 ranks x (1 rank ~5.1 GiB + 8 loader workers x ~7.3 GiB) = 254 GiB (stated with --mem-per-rank, "
            "--workers-per-rank, --worker-mem) of 256 GiB per node (90% usable: 230 GiB)") in err
    assert "num_workers <= 7 per rank" in err and "--gpus-per-node 3 and more --nodes" in err


def test_a_probe_in_the_run_dir_is_used_and_a_stated_worker_count_wins(tmp_path, capsys):
    run = tmp_path / "r"
    run.mkdir()
    probe_file(run / "probe.json", main_gib=5.1, workers=2, worker_gib=7.3, gpu="NVIDIA L40S", steps_per_s=8.7)
    assert main(["plan", "--cluster", LAB, "--nodes", "4", "--gpus-per-node", "4", "--out", str(run), "--",
                 "python", "train.py"]) == 0
    out = capsys.readouterr().out
    assert "4 ranks x (1 rank ~5.1 GiB + 2 loader workers x ~7.3 GiB) = 78.8 GiB (measured by the probe" in out
    assert "#SBATCH --mem=99G" in out  # asked from the measured need, a quarter above it
    assert main(["plan", "--cluster", LAB, "--nodes", "4", "--gpus-per-node", "4", "--workers-per-rank", "8",
                 "--out", str(run), "--", "python", "train.py"]) == 2
    assert "= 254 GiB (measured by the probe" in capsys.readouterr().err


@pytest.mark.parametrize("args,message", [
    (["--workers-per-rank", "4"], "4 loader workers per rank, but no figure for one worker's memory"),
    (["--worker-mem", "3", "--workers-per-rank", "2"], "loader workers stated, but not the rank's own memory"),
    (["--mem-per-rank", "-1"], "--mem-per-rank -1 is out of range"),
    (["--launcher", "deepspeed"], "--launcher 'deepspeed' is not one of auto, lightning, plain"),
])
def test_bad_statements_are_one_line(tmp_path, capsys, args, message):
    assert main(["plan", "--cluster", LAB, *args, "--out", str(tmp_path / "r"), "--", "python", "train.py"]) == 2
    assert message in capsys.readouterr().err


def test_a_diffscale_run_takes_no_statement(capsys):
    assert main(["plan", "--cluster", LAB, "--preset", "tiny", "--mem-per-rank", "4"]) == 2
    assert "--mem-per-rank describes a user command, not a diffscale run" in capsys.readouterr().err


def test_a_script_importing_lightning_is_detected(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import torch\nfrom lightning.pytorch import Trainer\n")
    plain = tmp_path / "plain.py"
    plain.write_text("import torch  # not lightning\n")
    assert resolve("auto", ("python", str(script), "--epochs", "3")) is Launcher.LIGHTNING
    assert resolve("auto", ("python", "-u", str(plain))) is Launcher.PLAIN
    assert resolve("lightning", ("./run.sh",)) is Launcher.LIGHTNING


def _lightning_plan(profile: str, shape: Shape):
    user = UserCommand(("python", "train.py", "--name", "it's $x"), RUN_DIR, PYTHON, launcher=Launcher.LIGHTNING)
    return make_plan(fixture_profile(profile) if profile in ("slurm-test", "sge-two-host") else None, shape, user,
                     PlanOptions())


@pytest.mark.parametrize("stem,profile,shape", [
    ("slurm-test-lightning", "slurm-test", Shape(2, 2, partition="gpu")),
    ("sge-two-host-lightning", "sge-two-host", Shape(2, 2)),
])
def test_golden_lightning_scripts(stem, profile, shape):
    text = _lightning_plan(profile, shape).script()
    path = GOLDEN / f"{stem}.sh"
    if os.environ.get("DIFFSCALE_REGEN_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"{stem}: DIFFSCALE_REGEN_GOLDEN=1 to accept"
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0


def test_golden_probe_job():
    """`diffscale probe --cluster nyu-torch --partition h200 --seconds 120 -- python train.py ...`"""
    from diffscale.cluster.probe.cli import probe_job_plan
    from diffscale.cluster.profiles.loading import load_profile

    plan = probe_job_plan(load_profile("nyu-torch"), "h200", 120, RUN_DIR, ("python", "train.py", "--name", "it's $x"),
                          python=PYTHON, account="torch_pr_1")
    text = plan.script()
    path = GOLDEN / "nyu-torch-probe-h200.sh"
    if os.environ.get("DIFFSCALE_REGEN_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), "DIFFSCALE_REGEN_GOLDEN=1 to accept"
    assert "#SBATCH --nodes=1" in text and "#SBATCH --time=00:07:00" in text and "--gres=gpu:1" in text
    assert f"{PYTHON} -m diffscale probe --seconds 120 --out" in text


def test_the_lightning_slurm_script_leaves_the_rendezvous_to_lightning():
    text = _lightning_plan("slurm-test", Shape(2, 2, partition="gpu")).script()
    assert "#SBATCH --ntasks-per-node=2" in text and "#SBATCH --gpus-per-node=2" in text
    assert re.search(r"^srun .*--ntasks-per-node=2 .*python train\.py", text, re.M)
    assert "export MASTER_ADDR" not in text and "export MASTER_PORT" not in text
    assert "unset MASTER_ADDR MASTER_PORT RANK LOCAL_RANK WORLD_SIZE NODE_RANK GROUP_RANK" in text


def testrecorded_start_scheduler_answers_parse():
    assert parse_test_only((FIXTURES / "test-only" / "h200-1x8.txt").read_text()) == dt.datetime(2026, 5, 1, 16, 30)
    assert parse_test_only("sbatch: error: Batch job submission failed: Invalid partition name specified") is None
    assert parse_squeue_start("  48001 2026-05-01T16:30:00\n48002 N/A\n") == [
        ("48001", dt.datetime(2026, 5, 1, 16, 30)), ("48002", None)]


def test_the_users_case_16_l40s_now_finish_before_8_h200_after_a_6_5_h_wait(tmp_path):
    h200 = probe_file(tmp_path / "h200.json", main_gib=5.1, workers=2, worker_gib=7.3, gpu="NVIDIA H200",
                       steps_per_s=10.0)
    l40s = probe_file(tmp_path / "l40s.json", main_gib=5.1, workers=2, worker_gib=7.3, gpu="NVIDIA L40S",
                       steps_per_s=8.7)  # ~87 % of an H200 for their model
    from diffscale.cluster.probe.result import load

    usage = rank_usage([(load(h200), str(h200)), (load(l40s), str(l40s))])
    user = UserCommand(("python", "train.py"), "/runs/r", PYTHON, usage=usage)
    now = dt.datetime(2026, 5, 1, 10, 0)
    found = compare(fixture_profile("lab-l40s-h200"), user, PlanOptions(signal=None), recorded_start, now,
                    total_steps=1_000_000)
    best = pick(found)
    table = {(c.plan.partition.name, c.plan.shape.label): c for c in found}
    assert set(table) == {("l40s", "1x4"), ("l40s", "2x4"), ("l40s", "4x4"), ("h200", "1x8")}
    assert best is table[("l40s", "4x4")]
    h = table[("h200", "1x8")]
    assert h.start.at == dt.datetime(2026, 5, 1, 16, 30) and h.finish is not None and best.finish is not None
    assert best.finish < h.finish  # 16 L40S now beat 8 H200 after 6.5 h
    assert h.charge == pytest.approx(h.gpu_hours * 3.0) and best.charge == pytest.approx(best.gpu_hours * 1.0)


def test_partition_auto_for_a_command_needs_its_length(tmp_path, capsys):
    assert main(["plan", "--cluster", LAB, "--partition", "auto", "--out", str(tmp_path / "r"), "--",
                 "python", "train.py"]) == 2
    assert "--partition auto for a user command needs the run's length" in capsys.readouterr().err


def test_partition_auto_without_a_probe_on_any_gpu_names_the_missing_fact(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("diffscale.cluster.planning.partition_auto.slurm_starts", lambda workdir: recorded_start)
    assert main(["plan", "--cluster", LAB, "--partition", "auto", "--total-steps", "1000", "--mem-per-rank", "4",
                 "--out", str(tmp_path / "r"), "--", "python", "train.py"]) == 2
    err = capsys.readouterr().err
    assert "no partition and shape can be picked (no probe on L40S" in err


def test_a_profile_without_node_memory_names_the_fact_and_discover(tmp_path, capsys):
    profile = tmp_path / "bare.yaml"
    profile.write_text("name: bare\nscheduler: slurm\npartitions:\n  gpu:\n    gpus_per_node: 4\n")
    assert main(["plan", "--cluster", str(profile), "--mem-per-rank", "5", "--out", str(tmp_path / "r"), "--",
                 "python", "train.py"]) == 0
    from diffscale.cluster.profiles.loading import load_profile

    user = UserCommand(("python", "train.py"), "/r", PYTHON, usage=rank_usage([], mem_per_rank_gb=5))
    check = next(c for c in make_plan(load_profile(str(profile)), Shape(1, 4), user).checks
                 if c.name == "host RAM per node")
    assert check.ok is None and "the profile does not say how much memory a 'gpu' node has" in check.detail
    assert "`diffscale cluster discover` reads it" in check.fix


def test_submit_partition_auto_asks_how_many_candidates_to_race(tmp_path, capsys):
    assert main(["submit", "--cluster", LAB, "--partition", "auto", "--out", str(tmp_path / "r"), "--",
                 "python", "train.py"]) == 2
    err = capsys.readouterr().err
    assert "--partition auto compares partitions; submit needs to know how many of them to race" in err
    assert "diffscale submit --partition auto --race 2" in err and not (tmp_path / "r").exists()


def test_usage_is_carried_by_the_workload():
    user = UserCommand(("python", "train.py"), "/r", PYTHON)
    assert dataclasses.replace(user, launcher=Launcher.LIGHTNING).title.startswith("Lightning command: ")


def test_a_relative_script_path_that_the_job_would_not_find_fails_preflight(tmp_path, capsys, monkeypatch):
    """The job runs the command in its run dir: `python train.py` planned beside train.py would
    find none there."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('hi')\n")
    args = ["plan", "--cluster", LAB, "--nodes", "1", "--gpus-per-node", "1", "--mem-per-rank", "4",
            "--workers-per-rank", "0", "--time", "1:00:00", "--out", str(tmp_path / "r"), "--", "python"]
    assert main([*args, "train.py", "--config=train.py"]) == 2
    err = capsys.readouterr().err
    assert (f"preflight check 'command paths' failed: the job runs the command in its run directory {tmp_path / 'r'}, "
            f"where 'train.py', 'train.py' (relative, found here in {tmp_path}) does not exist -- give absolute "
            f"paths, e.g. {tmp_path / 'train.py'}") in err
    assert main([*args, str(tmp_path / "train.py"), "--lr", "1e-4"]) == 0
    assert "command paths" not in capsys.readouterr().out


def test_plan_says_when_the_probe_measured_another_command_or_no_training_step(tmp_path, capsys):
    import json

    run = tmp_path / "r"
    run.mkdir()
    probe = probe_file(run / "probe.json", main_gib=5.1, workers=2, worker_gib=7.3, gpu="NVIDIA L40S",
                       steps_per_s=8.7)
    argv = ["plan", "--cluster", LAB, "--gpus-per-node", "4", "--out", str(run), "--", "python", "train.py"]
    assert main(argv) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "measured `" not in out and "saw no training step" not in out  # the planned command, trained
    assert main([*argv, "--num-workers", "8"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert (f"note: the probe {probe} measured `python train.py`, not the planned `python train.py --num-workers 8`: "
            "its figures hold only as far as the two run alike") in out
    record = json.loads(probe.read_text())
    probe.write_text(json.dumps(dict(record, steps_per_s=None, progress_line=None)))
    assert main(argv) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert (f"note: the probe {probe} saw no training step (no progress line): its memory figures may be start-up's "
            "(imports, data loading, compiling), not training's steady state") in out
