"""``sweep submit`` and ``sweep status`` on CPU, with stand-in sbatch / scontrol on PATH that record
what they are asked (the real schedulers run the same flow in tests/integration/test_sweep_jobs.py);
Grid Engine's array tasks read from qstat; the profile's array limit read and written back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diffscale.cli import main
from diffscale.cluster.jobs.scheduler import array_tasks, parse_qstat_xml
from diffscale.cluster.profiles.loading import dump_profile, load_profile, profile_from_dict, profile_to_dict
from diffscale.studies.runner import gpu_slots

FIXTURES = Path(__file__).resolve().parent / "cluster" / "fixtures"

SBATCH = """#!/bin/bash
echo "$PWD $*" >> "$FAKE_LOG"
if [ "$1" = --test-only ] && grep -q -- "${FAKE_REFUSE:-never}" "$2"; then
    echo "sbatch: error: Batch job submission failed: Requested node configuration is not available" >&2
    exit 1
fi
echo 4242
"""
SCONTROL = """#!/bin/bash
echo "JobId=$4 JobName=x UserId=$(id -un)(0) JobState=${FAKE_STATE:-PENDING} Reason=None ExitCode=1:0"
"""


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("sbatch", SBATCH), ("scontrol", SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "asked.txt"))
    monkeypatch.chdir(tmp_path)
    return tmp_path / "asked.txt"


def test_submit_writes_one_array_and_each_element_its_job_record(fake_slurm, tmp_path, capsys, monkeypatch):
    sweep = tmp_path / "sw"
    argv = ["sweep", "submit", "--cluster", str(FIXTURES / "slurm-test.yaml"), "--procs-per-node", "1",
            "--time", "00:05:00", "--parallel", "1", "--axis", "v=a,b c", "--out", str(sweep), "--", "echo", "{v}"]
    assert main(argv) == 0
    assert "submitted array job 4242: 2 element(s) of shape cpu-1x1" in capsys.readouterr().out
    asked = fake_slurm.read_text().splitlines()
    assert asked == [f"{sweep} --test-only {sweep / 'array-cpu-1x1.slurm.sh'}",
                     f"{sweep} --parsable {sweep / 'array-cpu-1x1.slurm.sh'}"]  # shown to the scheduler first
    assert "#SBATCH --array=0-1%1" in (sweep / "array-cpu-1x1.slurm.sh").read_text()
    for task, run in enumerate(("000", "001")):
        sub = json.loads((sweep / "runs" / run / "jobs.json").read_text())["submissions"][-1]
        assert sub["jobs"][0]["job_id"] == f"4242_{task}"
        assert (sweep / "runs" / run / sub["jobs"][0]["script"]).is_file()
    assert main(["sweep", "status", str(sweep)]) == 0
    assert "2 pending, 0 running, 0 done, 0 failed" in capsys.readouterr().out
    assert main(["sweep", "submit", str(sweep), "--failed"]) == 2
    assert "has failed" in capsys.readouterr().err
    monkeypatch.setenv("FAKE_STATE", "FAILED")  # the scheduler says both ended without the exit line
    assert main(["sweep", "status", str(sweep)]) == 0
    assert "0 pending, 0 running, 0 done, 2 failed" in capsys.readouterr().out
    assert main(["sweep", "submit", str(sweep), "--failed"]) == 0
    assert len(json.loads((sweep / "runs" / "001" / "jobs.json").read_text())["submissions"]) == 2
    # the first array's script stays as it was submitted; the resubmission has its own
    assert "#SBATCH --array=0-1%1" in (sweep / "array-cpu-1x1.slurm.sh").read_text()
    assert "(array-cpu-1x1.2.slurm.sh)" in capsys.readouterr().out


def test_a_shape_the_scheduler_refuses_submits_nothing(fake_slurm, tmp_path, capsys, monkeypatch):
    """All or nothing: the 2-node array is refused by sbatch --test-only, so the 1-node array that
    fits is not submitted either, and no element is recorded as submitted."""
    sweep = tmp_path / "sw"
    monkeypatch.setenv("FAKE_REFUSE", "--nodes=2")
    argv = ["sweep", "submit", "--cluster", str(FIXTURES / "slurm-test.yaml"), "--procs-per-node", "1", "--time",
            "00:05:00", "--axis", "cluster.shape=1x1,2x1", "--axis", "v=a", "--out", str(sweep), "--", "echo", "{v}"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "shape cpu-2x1 (array-cpu-2x1.slurm.sh): `sbatch --test-only` failed: sbatch: error: Batch job submission " \
           "failed: Requested node configuration is not available; nothing was submitted" in err
    assert all(" --parsable " not in line for line in fake_slurm.read_text().splitlines())
    assert not list(sweep.glob("runs/*/jobs.json"))
    assert main(["sweep", "status", str(sweep)]) == 0
    assert "2 pending, 0 running, 0 done" in capsys.readouterr().out


def test_grid_engine_array_tasks_are_known_by_their_own_ids():
    assert array_tasks("1-7:2") == [1, 3, 5, 7] and array_tasks("4") == [4] and array_tasks("1,3") == [1, 3]
    xml = ("<job_info><queue_info><job_list state='running'><JB_job_number>77</JB_job_number><JB_name>ds</JB_name>"
           "<JB_owner>me</JB_owner><state>r</state><tasks>2</tasks></job_list></queue_info><job_info>"
           "<job_list state='pending'><JB_job_number>77</JB_job_number><JB_name>ds</JB_name><JB_owner>me</JB_owner>"
           "<state>qw</state><tasks>3-4:1</tasks></job_list></job_info></job_info>")
    jobs = parse_qstat_xml(xml)
    assert jobs["77.2"]["state"] == "r" and jobs["77.3"]["state"] == "qw" and jobs["77.4"]["state"] == "qw"


def test_a_profile_carries_its_array_limit(tmp_path):
    text = (FIXTURES / "slurm-test.yaml").read_text() + "max_array_size: 500\n"
    (tmp_path / "p.yaml").write_text(text)
    profile = load_profile(str(tmp_path / "p.yaml"))
    assert profile.max_array_size == 500
    assert profile_from_dict(profile_to_dict(profile), source="x").max_array_size == 500
    assert "max_array_size: 500" in dump_profile(profile)


def test_gpu_slots():
    assert gpu_slots(None) == [None] and gpu_slots("0,2") == ["0", "2"]
