"""The launcher-environment parser on recorded torchrun, SLURM and Grid Engine environments."""

import os
import subprocess
from pathlib import Path

import pytest

from diffscale.cluster.planning.plan import PlanOptions, make_plan
from diffscale.cluster.planning.shape import Shape
from diffscale.cluster.planning.workload import DiffscaleRun
from diffscale.cluster.profiles.loading import load_profile
from diffscale.config.presets import get_preset
from diffscale.errors import UserError
from diffscale.runtime.distributed import detect_launch, expand_hostlist, port_from_job_id, slurm_hostnames

from helpers import SLURM_HOSTLISTS as HOSTLISTS

SGE_TWO_HOST = Path(__file__).parent / "cluster" / "fixtures" / "sge-two-host.yaml"

TORCHRUN = {  # rank 5 of a 2-node x 4-GPU torchrun job (recorded)
    "RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1",
    "MASTER_ADDR": "gpu-a01", "MASTER_PORT": "29400", "TORCHELASTIC_USE_AGENT_STORE": "True",
    "TORCHELASTIC_RESTART_COUNT": "0",
}

SLURM_SRUN = {  # task 6 of `srun` in an sbatch job with --nodes=2 --ntasks-per-node=4 (recorded)
    "SLURM_JOB_ID": "4812345", "SLURM_PROCID": "6", "SLURM_LOCALID": "2", "SLURM_NODEID": "1",
    "SLURM_NTASKS": "8", "SLURM_NTASKS_PER_NODE": "4(x2)", "SLURM_JOB_NUM_NODES": "2", "SLURM_STEP_ID": "0",
    "SLURM_JOB_NODELIST": "gilbreth-j[001-002]", "SLURM_STEP_NODELIST": "gilbreth-j[001-002]",
    "CUDA_VISIBLE_DEVICES": "0,1,2,3",
}


def test_torchrun_environment():
    info = detect_launch(TORCHRUN)
    assert (info.launcher, info.rank, info.local_rank, info.world_size, info.local_world_size, info.node_rank) == (
        "torchrun", 5, 1, 8, 4, 1)
    assert (info.master_addr, info.master_port, info.agent_store) == ("gpu-a01", 29400, True)


def test_slurm_task_started_by_srun():
    info = detect_launch(SLURM_SRUN)
    assert (info.launcher, info.rank, info.local_rank, info.world_size, info.local_world_size, info.node_rank) == (
        "slurm", 6, 2, 8, 4, 1)
    assert info.master_addr == "gilbreth-j001"
    assert info.master_port == port_from_job_id("4812345") == 20000 + 4812345 % 20000
    assert "first host of SLURM_JOB_NODELIST" in info.master_source


def test_slurm_batch_shell_without_srun_is_one_process():
    env = {k: v for k, v in SLURM_SRUN.items() if k not in ("SLURM_STEP_ID", "SLURM_STEP_NODELIST")}
    env.update(SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_NODEID="0")
    assert detect_launch(env).launcher == "single"


def test_master_set_by_the_job_script_wins():
    info = detect_launch(dict(SLURM_SRUN, MASTER_ADDR="10.0.0.7", MASTER_PORT="31000"))
    assert (info.master_addr, info.master_port) == ("10.0.0.7", 31000)


def test_no_launcher_is_a_single_process():
    assert detect_launch({}).world_size == 1


@pytest.mark.parametrize("spec, hosts", HOSTLISTS)
def test_slurm_hostlists(spec, hosts):
    assert expand_hostlist(spec) == hosts


@pytest.mark.parametrize("spec", ["n[3-1]", "n[x]", "n[1-2", "n1-2]"])
def test_what_slurm_rejects_is_an_error_not_a_guess(spec):
    with pytest.raises(ValueError, match="is not a SLURM hostlist"):
        expand_hostlist(spec)


# The same forms through SLURM's own scontrol run where SLURM is installed and started:
# tests/integration/test_schedulers_smoke.py (marker slurm), never skipped for want of it here.


def _fake_scontrol(tmp_path, monkeypatch, script: str) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/sh\n" + script)
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def test_scontrol_expands_where_slurm_is_installed(tmp_path, monkeypatch):
    _fake_scontrol(tmp_path, monkeypatch, '[ "$1 $2" = "show hostnames" ] && printf "from-scontrol\\nb\\n"\n')
    assert slurm_hostnames("whatever[1-2]") == ["from-scontrol", "b"]


def test_a_failing_scontrol_falls_back_to_the_parser(tmp_path, monkeypatch):
    _fake_scontrol(tmp_path, monkeypatch, "echo 'slurm_load_ctl_conf error' >&2; exit 1\n")
    assert slurm_hostnames("a[1-2]-b[01-02]")[:2] == ["a1-b01", "a1-b02"]


def test_master_is_the_first_host_of_a_multi_group_nodelist():
    env = {k: v for k, v in SLURM_SRUN.items() if k != "SLURM_STEP_NODELIST"}
    env["SLURM_JOB_NODELIST"] = "a[1-2]-b[01-02]"
    assert detect_launch(env, hostnames=expand_hostlist).master_addr == "a1-b01"


def test_an_unreadable_nodelist_names_the_fix():
    env = dict(SLURM_SRUN, SLURM_STEP_NODELIST="gpu[9-1]")
    with pytest.raises(UserError, match="cannot read the job's node list") as info:
        detect_launch(env, hostnames=expand_hostlist)
    assert "MASTER_ADDR" in info.value.fix


def test_grid_engine_hosts_from_pe_hostfile_with_duplicate_lines(tmp_path):
    """The rendered SGE script's own host selection, run by bash on a recorded PE_HOSTFILE
    where one host appears once per queue instance."""
    plan = make_plan(load_profile(str(SGE_TWO_HOST)), Shape(2, 2),
                     DiffscaleRun(config=get_preset("tiny"), run_dir=str(tmp_path), python="python"), PlanOptions())
    line = next(ln for ln in plan.script().splitlines() if "PE_HOSTFILE" in ln and "mapfile" in ln)
    hostfile = tmp_path / "pe_hostfile"
    hostfile.write_text("node07 2 gpu.q@node07 UNDEFINED\nnode03 1 all.q@node03 UNDEFINED\n"
                        "node07 2 all.q@node07 UNDEFINED\nnode03 1 gpu.q@node03 UNDEFINED\n")
    out = subprocess.run(["bash", "-c", f'{line}\nprintf "%s\\n" "${{HOSTS[@]}}"'], capture_output=True, text=True,
                         env={"PE_HOSTFILE": str(hostfile), "PATH": "/usr/bin:/bin"})
    assert out.stdout.split() == ["node07", "node03"]  # master = first host, duplicates merged
