"""Users' own trainers on the real test schedulers: a Lightning DDP job through the script
diffscale writes for it, --partition auto with one partition kept busy (the pick, and a race of
two partitions the free one wins), and qacct's record of a job that hit its memory limit."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from scheduler_jobs import discovered_profile, ds, resolve_node_names, wait_done

from helpers import required

pytestmark = pytest.mark.integration

# A Lightning Trainer on CPUs: ddp over num_nodes x devices processes; every rank prints what it sees.
LIGHTNING = r'''
import sys
import torch
import lightning as L
from torch.utils.data import DataLoader, TensorDataset

class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(4, 1)
    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

nodes, devices = int(sys.argv[1]), int(sys.argv[2])
data = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8)
trainer = L.Trainer(accelerator="cpu", devices=devices, num_nodes=nodes, strategy="ddp", max_steps=3,
                    logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
trainer.fit(Tiny(), data)
import torch.distributed as dist
print(f"LIGHTNING rank={trainer.global_rank} world={trainer.world_size} dist={dist.get_world_size()} "
      f"env={type(trainer.strategy.cluster_environment).__name__}", flush=True)
dist.destroy_process_group()  # as docs/clusters.md advises: gloo's threads can otherwise abort the exit
'''


@pytest.fixture(scope="module")
def slurm_profile(slurm_cluster, tmp_path_factory) -> Path:
    resolve_node_names(slurm_cluster.nodes)
    return discovered_profile("slurm", tmp_path_factory)


@pytest.fixture(scope="module")
def sge_profile(sge_cluster, tmp_path_factory) -> Path:
    return discovered_profile("sge", tmp_path_factory)


def test_lightning_ddp_two_nodes_on_slurm(slurm_profile, tmp_path):
    required("lightning")
    script = tmp_path / "train.py"
    script.write_text(LIGHTNING)
    run_dir = tmp_path / "run it's"
    rc, out = ds("submit", "--cluster", str(slurm_profile), "--nodes", "2", "--procs-per-node", "1",
                 "--time", "00:05:00", "--out", str(run_dir), "--", sys.executable, str(script), "2", "1")
    assert rc == 0, out
    script_text = next(run_dir.glob("job-*.slurm.sh")).read_text()
    assert "unset MASTER_ADDR" in script_text and "export MASTER_ADDR" not in script_text  # detected as Lightning
    states = wait_done(run_dir, timeout=150)
    rc, log = ds("logs", str(run_dir))
    assert states[0]["state"] == "COMPLETED", (states, log)
    seen = sorted(re.findall(r"LIGHTNING rank=(\d) world=2 dist=2 env=SLURMEnvironment", log))
    assert seen == ["0", "1"], log


def test_lightning_ddp_on_grid_engine_through_torchrun(sge_profile, tmp_path):
    """The test Grid Engine has one host: 1 node x 2 processes (Lightning reads torchrun's variables)."""
    required("lightning")
    script = tmp_path / "train.py"
    script.write_text(LIGHTNING)
    run_dir = tmp_path / "run"
    rc, out = ds("submit", "--cluster", str(sge_profile), "--procs-per-node", "2", "--time", "00:05:00",
                 "--out", str(run_dir), "--", sys.executable, str(script), "1", "2")
    assert rc == 0, out
    states = wait_done(run_dir, timeout=180)
    rc, log = ds("logs", str(run_dir))
    assert states[0]["state"] == "COMPLETED", (states, log)
    seen = sorted(re.findall(r"LIGHTNING rank=(\d) world=2 dist=2 env=TorchElasticEnvironment", log))
    assert seen == ["0", "1"], log


def _probe(path: Path, gpu: str | None, steps_per_s: float) -> str:
    fig = {"pid": 1, "cmdline": "python train.py", "memory_bytes": 2**28, "rss_bytes": 2**28, "pss_bytes": 2**28,
           "uss_bytes": 2**28, "threads": 4}
    path.write_text(json.dumps({
        "version": 1, "command": ["python", "train.py"], "seconds": 30, "ran_s": 30.0, "ended": "limit",
        "exit_code": None, "measure": "PSS (/proc/PID/smaps_rollup)", "main": fig, "workers": [],
        "workers_at_once": 0, "tree_peak_bytes": 2**28, "threads_peak": 4, "gpu_bytes": None, "gpu_name": gpu,
        "gpu_note": "recorded", "steps_per_s": steps_per_s, "progress_line": "x", "host": "n1", "cpus": 4,
        "notes": []}))
    return str(path)


def _two_partitions(path: Path, *, max_nodes: int, fast_extra: str = "") -> Path:
    """A profile of the test SLURM's two partitions: 'fast' (gpu, H200s) and 'slow' (cpu)."""
    path.write_text("name: two\nscheduler: slurm\npartitions:\n"
                    "  fast: {submit_name: gpu, gpus_per_node: 2, gpu_type: H200, cpus_per_node: 4, "
                    f"mem_per_node_gb: 8, max_nodes: {max_nodes}{fast_extra}}}\n"
                    "  slow: {submit_name: cpu, gpus_per_node: 0, cpus_per_node: 4, mem_per_node_gb: 8, "
                    f"max_nodes: {max_nodes}}}\n")
    return path


def _block_the_gpus(slurm_cluster) -> str:
    """A 30-minute job on every GPU of the 'gpu' partition (scancel it when done)."""
    return slurm_cluster.sbatch("--partition=gpu", "--nodes=2", "--gpus-per-node=2", "--cpus-per-task=1",
                                "--mem=100M", "--time=00:30:00", "--output=/dev/null", "--wrap", "sleep 600")


def test_partition_auto_avoids_the_partition_a_blocking_job_keeps_busy(slurm_cluster, tmp_path):
    """'fast' (the GPU partition, probed at 10 steps/s) is held for 30 min by a job on every GPU;
    'slow' (the CPU partition, 1 step/s) is free: slow finishes first, fast would start in ~30 min."""
    profile = _two_partitions(tmp_path / "two.yaml", max_nodes=2, fast_extra=", charge_per_gpu_hour: 2.0")
    blocker = _block_the_gpus(slurm_cluster)
    try:
        slurm_cluster.wait(blocker, timeout=30, states={"RUNNING"})
        # one core and 1 GB a node: what the blocker leaves free (with all of a node's, SLURM would wait for it)
        rc, out = ds("plan", "--cluster", str(profile), "--partition", "auto", "--procs-per-node", "1", "--mem", "1",
                     "--cpus-per-task", "1",
                     "--total-steps", "1000", "--probe", _probe(tmp_path / "fast.json", "NVIDIA H200", 10.0),
                     "--probe", _probe(tmp_path / "slow.json", None, 1.0), "--out", str(tmp_path / "r"),
                     "--", "python", "train.py")
    finally:
        subprocess.run(["scancel", blocker], check=False)
    assert rc == 0, out
    assert re.search(r"pick: partition slow, 2 node\(s\) x 1", out), out
    fast = [ln for ln in out.splitlines() if ln.lstrip("│ ").startswith("fast")]
    assert fast and all("sbatch --test-only" in ln for ln in fast), out
    assert all(re.search(r"\b(2\d|30) min\b", ln) for ln in fast), out  # starts when the blocker's 30 min end


def test_partition_auto_races_two_partitions_and_the_free_one_wins(slurm_cluster, tmp_path):
    """`submit --partition auto --race 2`: 'fast' (GPU partition) is held by a blocking job, 'slow'
    (CPU partition) is free. Both 1x1 candidates are submitted, each under its own key; the slow
    one starts, claims the run and cancels the fast one by name; status names the winner."""
    profile = _two_partitions(tmp_path / "two.yaml", max_nodes=1)
    blocker = _block_the_gpus(slurm_cluster)
    run_dir = tmp_path / "raced"
    try:
        slurm_cluster.wait(blocker, timeout=30, states={"RUNNING"})
        rc, out = ds("submit", "--cluster", str(profile), "--partition", "auto", "--race", "2",
                     "--procs-per-node", "1", "--mem", "1", "--cpus-per-task", "1", "--total-steps", "1000",
                     "--probe", _probe(tmp_path / "fast.json", "NVIDIA H200", 10.0),
                     "--probe", _probe(tmp_path / "slow.json", None, 1.0), "--out", str(run_dir),
                     "--", sys.executable, "-c", "print('RACE WINNER RAN')")
        assert rc == 0, out
        states = {s["job_id"]: s for s in wait_done(run_dir, timeout=90)}
    finally:
        subprocess.run(["scancel", blocker], check=False)
    assert "race between slow-1x1, fast-1x1: the first to start owns the run" in out, out
    jobs_ = {j["race_key"]: j for j in json.loads((run_dir / "jobs.json").read_text())["submissions"][-1]["jobs"]}
    assert {k: (j["partition"], j["shape"]) for k, j in jobs_.items()} == {"slow-1x1": ("slow", "1x1"),
                                                                         "fast-1x1": ("fast", "1x1")}
    assert states[jobs_["slow-1x1"]["job_id"]]["state"] == "COMPLETED", states
    assert states[jobs_["fast-1x1"]["job_id"]]["state"] == "CANCELLED", states
    assert (run_dir / "race.claim").readlink() == Path("slow-1x1")
    rc, status = ds("status", str(run_dir))
    assert rc == 0 and "race: slow-1x1 (partition slow, shape 1x1) owns the run" in status, status
    rc, log = ds("logs", str(run_dir), "--job", jobs_["slow-1x1"]["job_id"])
    assert "shape slow-1x1 started first and owns this run" in log and "RACE WINNER RAN" in log, log


def test_qacct_of_a_job_over_its_memory_limit(sge_cluster, tmp_path):
    """A job asking -l h_vmem=300M that allocates more: the doctor reads qacct's maxvmem against it."""
    # Grid Engine enforces h_vmem as an address-space limit: allocations fail (MemoryError) rather
    # than the job being killed. The hog grows to the limit and holds it, so the accounting's
    # sampling sees the peak, then fails.
    hog = tmp_path / "hog.py"
    hog.write_text("import time\nheld = []\ntry:\n    while True:\n        held.append(bytearray(8 << 20))\n"
                   "except MemoryError:\n    time.sleep(5)\n    raise SystemExit(1)\n")
    script = tmp_path / "hog.sh"
    script.write_text("#!/bin/bash\n#$ -S /bin/bash\n#$ -cwd\n#$ -j y\n#$ -l h_vmem=300M\n"
                      f"{sys.executable} {hog}\n")
    job = sge_cluster.qsub(str(script), cwd=tmp_path)
    sge_cluster.wait(job, timeout=60)
    rc, out = ds("doctor", job)
    assert rc == 0, out
    assert re.search(r"Grid Engine's accounting \(qacct\) shows .*maxvmem [\d.]+ GiB of h_vmem 0\.3 GiB", out), out
