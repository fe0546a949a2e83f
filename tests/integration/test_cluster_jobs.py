"""diffscale's cluster verbs against the real SLURM and Grid Engine of the test set-up.

Scripts are produced by `diffscale plan/submit` and run by the real schedulers: ranks
find each other (gloo all_reduce), a race ends with one winner and the loser cancelled,
discover writes a profile plan accepts, preflight refuses a job the cluster cannot fit.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from scheduler_jobs import discovered_profile, ds, resolve_node_names, wait_done

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]

# A user's own distributed program: reads the launcher's variables, joins a gloo group
# through MASTER_ADDR/MASTER_PORT and all-reduces its rank.
ALLREDUCE = r'''
import os, torch, torch.distributed as dist
rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")))
world = int(os.environ.get("WORLD_SIZE", os.environ.get("SLURM_NTASKS", "1")))
dist.init_process_group("gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
                        rank=rank, world_size=world)
t = torch.tensor([rank + 1.0]); dist.all_reduce(t)
print(f"RANKINFO rank={rank} world={world} sum={t.item():g} "
      f"master={os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}", flush=True)
dist.destroy_process_group()
'''


def submissions(run_dir: Path) -> list[dict]:
    return json.loads((run_dir / "jobs.json").read_text())["submissions"]


@pytest.fixture(scope="module")
def slurm_profile(slurm_cluster, tmp_path_factory) -> Path:
    resolve_node_names(slurm_cluster.nodes)
    return discovered_profile("slurm", tmp_path_factory)


@pytest.fixture(scope="module")
def sge_profile(sge_cluster, tmp_path_factory) -> Path:
    return discovered_profile("sge", tmp_path_factory)


def hostile(tmp_path: Path, sge: bool = False) -> Path:
    # Grid Engine cannot enter a working directory with '$' (plan refuses it; see
    # test_sge_refuses_a_dollar_run_dir); SLURM takes it.
    return tmp_path / ("run it's \"odd\"" if sge else "run it's \"odd\" $HOME `x`")


# ----------------------------------------------------------------------------- discover + preflight

def test_discovered_slurm_profile_is_accepted_by_plan(slurm_profile, slurm_cluster):
    text = slurm_profile.read_text()
    assert "cpus_per_node: 4" in text and "gpus_per_node: 2" in text
    rc, out = ds("plan", "--cluster", str(slurm_profile), "--nodes", "2", "--procs-per-node", "1", "--time", "00:05:00",
                 "--out", "/tmp/x", "--", "python", "train.py")
    assert rc == 0, out
    assert "#SBATCH --nodes=2" in out and "#SBATCH --ntasks-per-node=1" in out


def test_discovered_sge_profile_is_accepted_by_plan(sge_profile, sge_cluster):
    text = sge_profile.read_text()
    assert "pe_single_host: smp" in text and "pe_multi_host: mpi" in text and "gpu_scope: job" in text
    rc, out = ds("plan", "--cluster", str(sge_profile), "--procs-per-node", "2", "--time", "00:05:00",
                 "--out", "/tmp/x", "--", "python", "train.py")
    assert rc == 0, out
    assert "#$ -pe smp 2" in out


def test_preflight_refuses_what_the_cluster_cannot_fit(slurm_profile):
    rc, out = ds("plan", "--cluster", str(slurm_profile), "--partition", "gpu", "--gpus-per-node", "4",
                 "--out", "/tmp/x", "--preset", "tiny")
    assert rc == 2
    assert "error: preflight check 'GPUs per node' failed: 4 GPUs per node asked, but 'gpu' nodes have 2" in out
    assert "use --gpus-per-node 2 (or fewer) and more --nodes" in out
    rc, out = ds("submit", "--cluster", str(slurm_profile), "--procs-per-node", "2", "--cpus-per-task", "4",
                 "--out", "/tmp/x-refused", "--preset", "tiny")
    assert rc == 2 and "2 tasks x 4 CPUs = 8 > 4 cores per 'cpu' node" in out
    assert not Path("/tmp/x-refused/jobs.json").exists()  # nothing was submitted


def test_sge_refuses_a_dollar_run_dir(sge_profile, tmp_path):
    rc, out = ds("submit", "--cluster", str(sge_profile), "--procs-per-node", "2", "--time", "00:05:00",
                 "--out", str(tmp_path / "a$HOME"), "--", "true")
    assert rc == 2 and "Grid Engine cannot run a job in a directory whose path contains '$'" in out


# ----------------------------------------------------------------------------- real jobs

def test_slurm_two_nodes_one_task_each_all_reduce(slurm_profile, tmp_path):
    script = tmp_path / "allreduce.py"
    script.write_text(ALLREDUCE)
    run_dir = hostile(tmp_path)
    rc, out = ds("submit", "--cluster", str(slurm_profile), "--nodes", "2", "--procs-per-node", "1",
                 "--time", "00:05:00", "--out", str(run_dir), "--", sys.executable, str(script))
    assert rc == 0, out
    states = wait_done(run_dir)
    assert states[0]["state"] == "COMPLETED", states
    rc, log = ds("logs", str(run_dir))
    assert rc == 0
    ranks = sorted(re.findall(r"RANKINFO rank=(\d) world=2 sum=3 master=n1:(\d+)", log))
    assert [r for r, _ in ranks] == ["0", "1"], log
    job_id = submissions(run_dir)[-1]["jobs"][0]["job_id"]
    from diffscale.runtime.distributed import port_from_job_id
    assert {int(p) for _, p in ranks} == {port_from_job_id(job_id)}


def test_sge_one_host_two_slots_all_reduce(sge_profile, tmp_path):
    script = tmp_path / "allreduce.py"
    script.write_text(ALLREDUCE)
    run_dir = hostile(tmp_path, sge=True)
    rc, out = ds("submit", "--cluster", str(sge_profile), "--procs-per-node", "2", "--time", "00:05:00",
                 "--out", str(run_dir), "--", sys.executable, str(script))
    assert rc == 0, out
    states = wait_done(run_dir, timeout=180)
    assert states[0]["state"] == "COMPLETED", states
    rc, log = ds("logs", str(run_dir))
    assert sorted(re.findall(r"RANKINFO rank=(\d) world=2 sum=3", log)) == ["0", "1"], log


def test_slurm_race_one_shape_cannot_start(slurm_profile, tmp_path):
    # 2x1 (submitted first) takes every core of both nodes (4 CPUs per task); 1x1 then
    # cannot start. The 2x1 job claims the run, cancels the 1x1 job by name, and trains.
    script = tmp_path / "allreduce.py"
    script.write_text(ALLREDUCE)
    run_dir = tmp_path / "race"
    rc, out = ds("submit", "--cluster", str(slurm_profile), "--race", "2x1,1x1", "--procs-per-node", "1",
                 "--cpus-per-task", "4", "--time", "00:05:00", "--out", str(run_dir), "--", sys.executable, str(script))
    assert rc == 0, out
    states = {s["job_id"]: s for s in wait_done(run_dir, timeout=120)}
    jobs_ = {j["shape"]: j["job_id"] for j in submissions(run_dir)[-1]["jobs"]}
    assert states[jobs_["2x1"]]["state"] == "COMPLETED", states
    assert states[jobs_["1x1"]]["state"] == "CANCELLED", states
    assert os.readlink(run_dir / "race.claim") == "2x1"
    rc, log = ds("logs", str(run_dir), "--job", jobs_["2x1"])
    assert "shape 2x1 started first and owns this run" in log and "RANKINFO rank=1 world=2 sum=3" in log


def test_slurm_checkpoint_signal_requeues_and_resumes(slurm_profile, tmp_path):
    # A stand-in trainer: checkpoints and exits 85 on SIGUSR2, finishes when restarted.
    fake = tmp_path / "fake_python"  # no space: see preflight.task_executable
    fake.write_text(f"#!{sys.executable}\n" + r'''
import os, signal, sys, time
rank, restart = os.environ["SLURM_PROCID"], int(os.environ.get("SLURM_RESTART_COUNT", "0"))
print(f"rank {rank} restart={restart}", flush=True)
if restart >= 1:
    print(f"rank {rank} finished", flush=True); sys.exit(0)
def checkpoint(signum, frame):
    print(f"rank {rank} checkpointed", flush=True); sys.exit(85)
signal.signal(signal.SIGUSR2, checkpoint)
open(f"started.{rank}", "w").close()
time.sleep(120)
sys.exit(3)
''')
    fake.chmod(0o755)
    run_dir = tmp_path / "requeue"
    rc, out = ds("submit", "--cluster", str(slurm_profile), "--nodes", "2", "--procs-per-node", "1",
                 "--time", "01:00:00", "--out", str(run_dir), "--preset", "tiny", "--python", str(fake))
    assert rc == 0, out
    job_id = submissions(run_dir)[-1]["jobs"][0]["job_id"]
    deadline = time.monotonic() + 120
    while not all((run_dir / f"started.{r}").exists() for r in (0, 1)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert all((run_dir / f"started.{r}").exists() for r in (0, 1)), "the ranks never started"
    # What --signal=B:USR2@LEAD does at the time limit: signal the batch shell only. srun passes a
    # signal on only to tasks it has finished launching, which takes longer on a busy machine:
    # signal again until every rank says it checkpointed (no sleep tuned to an idle machine).
    log_file = run_dir / submissions(run_dir)[-1]["jobs"][0]["log"]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not all(f"rank {r} checkpointed" in log_file.read_text() for r in (0, 1)):
        subprocess.run(["scancel", "--batch", "--signal=USR2", job_id], check=True)
        time.sleep(2)
    states = wait_done(run_dir, timeout=120)
    assert states[0]["state"] == "COMPLETED" and "restarts 1" in states[0]["detail"], states
    log = log_file.read_text()
    assert "rank 0 checkpointed" in log and "rank 1 checkpointed" in log
    assert "requeueing job" in log and "rank 0 finished" in log and "rank 1 finished" in log


# ----------------------------------------------------------------------------- diffscale training

TINY = ["--preset", "tiny", "--set", "train.steps=4", "--set", "train.batch_per_gpu=8",
        "--set", "model.block_out_channels=[16,32]", "--set", "model.attention=[false,false]",
        "--set", "model.norm_num_groups=8", "--set", "model.sample_size=16",
        "--set", "train.checkpoint_every=2", "--set", "train.sample_count=4", "--set", "train.sample_steps=2",
        "--set", "train.log_every=1"]


def test_slurm_two_node_diffscale_training(slurm_profile, tmp_path):
    run_dir = hostile(tmp_path)
    rc, out = ds("submit", "--cluster", str(slurm_profile), "--nodes", "2", "--procs-per-node", "1",
                 "--time", "00:10:00", "--out", str(run_dir), *TINY)
    assert rc == 0, out
    states = wait_done(run_dir, timeout=300)
    rc, log = ds("logs", str(run_dir))
    assert states[0]["state"] == "COMPLETED", log
    assert any(run_dir.rglob("*.safetensors")) or any((run_dir / "checkpoints").glob("*")), log
    assert any(run_dir.rglob("*.png")), log


def test_sge_one_host_two_slot_diffscale_training(sge_profile, tmp_path):
    run_dir = hostile(tmp_path, sge=True)
    rc, out = ds("submit", "--cluster", str(sge_profile), "--procs-per-node", "2", "--time", "00:10:00",
                 "--out", str(run_dir), *TINY)
    assert rc == 0, out
    states = wait_done(run_dir, timeout=300)
    rc, log = ds("logs", str(run_dir))
    assert states[0]["state"] == "COMPLETED", log
    assert any(run_dir.rglob("*.safetensors")) or any((run_dir / "checkpoints").glob("*")), log
    assert any(run_dir.rglob("*.png")), log


POLICY = ["--preset", "policy-tiny", "--set", "runtime.device=cpu", "--set", "train.steps=12", "--set",
          "train.log_every=4", "--set", "train.checkpoint_every=6", "--set", "train.sample_count=2",
          "--set", "train.sample_steps=2"]


def test_sge_policy_run_on_two_slots_trains_and_evaluates(sge_profile, tmp_path):
    """A diffusion policy as BU SCC users run it, on the test Grid Engine's CPU slots: two ranks
    train on the built-in demonstrations, then ``diffscale eval`` rolls the result out."""
    run_dir = hostile(tmp_path, sge=True)
    rc, out = ds("submit", "--cluster", str(sge_profile), "--procs-per-node", "2", "--time", "00:10:00",
                 "--setup", "export DIFFSCALE_SITE_SETUP=ran", "--out", str(run_dir), *POLICY)
    assert rc == 0, out
    states = wait_done(run_dir, timeout=300)
    rc, log = ds("logs", str(run_dir))
    assert states[0]["state"] == "COMPLETED", log
    assert "world size 2" in log and "done: 12 steps" in log, log
    assert "export DIFFSCALE_SITE_SETUP=ran" in next(run_dir.glob("job-*.sge.sh")).read_text()
    assert f"diffscale: python {sys.executable}\n" in log  # the set-up left `python` as it was: the planned one
    rc, report = ds("eval", str(run_dir), "--count", "4", "--json")
    assert rc == 0, report
    scores = json.loads(next(line for line in report.splitlines() if line.startswith("{")))  # beside its progress
    assert scores["task"] == "policy" and scores["step"] == 12 and scores["episodes"] == 4, scores
    assert 0.0 <= scores["success"] <= 1.0, scores
