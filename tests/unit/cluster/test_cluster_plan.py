"""plan(): rank tables, resolved defaults, continuation, and the port formula."""

from __future__ import annotations

import subprocess
import sys

import pytest

from diffscale.cluster.planning.plan import PlanOptions, make_plan
from diffscale.cluster.planning.shape import Shape, parse_race
from diffscale.cluster.planning.workload import DiffscaleRun, UserCommand
from diffscale.cluster.profiles.loading import load_profile
from diffscale.cluster.scripts.jobspec import Continuation, job_name
from diffscale.config import presets
from diffscale.errors import UserError
from diffscale.runtime.distributed import port_from_job_id

from cluster_fixtures import fixture_profile


def _run():
    return DiffscaleRun(config=presets.get_preset("medium"), run_dir="/runs/r", python="python3")


def test_slurm_rank_table_two_nodes_of_four():
    plan = make_plan(load_profile("purdue-gilbreth"), Shape(2, 4), _run())
    rows = [(r.rank, r.node, r.local_rank, r.device) for r in plan.ranks]
    assert rows == [(0, 0, 0, "cuda:0"), (1, 0, 1, "cuda:1"), (2, 0, 2, "cuda:2"), (3, 0, 3, "cuda:3"),
                    (4, 1, 0, "cuda:0"), (5, 1, 1, "cuda:1"), (6, 1, 2, "cuda:2"), (7, 1, 3, "cuda:3")]
    assert plan.ranks[5].started_by == "srun task (SLURM_PROCID=5, SLURM_LOCALID=1, SLURM_NODEID=1)"
    assert plan.ranks[0].master.startswith("first host of SLURM_JOB_NODELIST : 20000 + SLURM_JOB_ID % 20000")


def test_sge_rank_tables():
    one = make_plan(load_profile("bu-scc"), Shape(1, 2), _run())
    assert [r.started_by for r in one.ranks] == ["torchrun --standalone (RANK=0, LOCAL_RANK=0)",
                                                 "torchrun --standalone (RANK=1, LOCAL_RANK=1)"]
    two = make_plan(fixture_profile("sge-two-host"), Shape(2, 2), _run())
    assert [r.host for r in two.ranks] == ["host 0 of PE_HOSTFILE"] * 2 + ["host 1 of PE_HOSTFILE"] * 2
    assert two.ranks[2].started_by == "torchrun via qrsh -inherit --node_rank=1 (RANK=2, LOCAL_RANK=0)"
    assert two.ranks[0].master == "first host of PE_HOSTFILE : 20000 + JOB_ID % 20000"


def test_cpu_ranks_ask_for_no_gpus():
    plan = make_plan(fixture_profile("slurm-test"), Shape(2, 1, partition="gpu", use_gpus=False), _run())
    assert plan.spec.gpus_per_node == 0 and plan.ranks[0].device == "cpu"
    assert "--gpus-per-node" not in plan.script()
    gpu = make_plan(fixture_profile("slurm-test"), Shape(1, 2, partition="gpu"), _run())
    assert "#SBATCH --gpus-per-node=2" in gpu.script()


def test_defaults_resolved_from_the_partition():
    plan = make_plan(load_profile("purdue-gilbreth"), Shape(1, 4), _run())
    assert plan.spec.cpus_per_rank == 8  # 64 cores / 4 ranks, capped at 8
    assert plan.spec.time_s <= 48 * 3600 and plan.spec.time_s % 900 == 0
    assert plan.spec.continuation is Continuation.REQUEUE and plan.spec.signal == "USR2"


def test_host_memory_asks_for_the_ranks_alone_and_says_where_the_figure_comes_from():
    # the day-one report: --mem=50G for a job whose resident-data ranks start no loader workers
    plan = make_plan(load_profile("purdue-gilbreth"), Shape(1, 4), _run(), PlanOptions(account="a"))
    assert "#SBATCH --mem=15G" in plan.script()  # 4 ranks x 3 GiB, + a quarter
    note = next(n for n in plan.notes if n.startswith("host memory"))
    assert note.startswith("host memory 15 GiB per node: 4 ranks x ~3.0 GiB = 12 GiB, plus a quarter for headroom; "
                           "no data-loader workers counted")
    assert "the ~3 GiB per rank is an estimate, not a measured RSS" in note
    # data each rank loads counts; the node's memory caps the request and the note says so
    big = DiffscaleRun(config=presets.get_preset("medium"), run_dir="/runs/r", python="python3", data_bytes=100 << 30)
    capped = make_plan(load_profile("nyu-torch"), Shape(1, 4), big, PlanOptions(account="a"))
    assert "#SBATCH --mem=256G" in capped.script()
    assert "4 ranks x ~103.0 GiB = 412 GiB, plus a quarter for headroom, capped at the node's 256 GiB" in \
        next(n for n in capped.notes if n.startswith("host memory"))
    # --mem given: no estimate, no note
    given = make_plan(load_profile("purdue-gilbreth"), Shape(1, 4, mem_per_node_gb=40), _run())
    assert "#SBATCH --mem=40G" in given.script() and not any(n.startswith("host memory") for n in given.notes)


def test_user_command_has_no_continuation_and_no_warning_unless_asked():
    cmd = UserCommand(("python", "train.py"), "/runs/r", "python3")
    plan = make_plan(load_profile("purdue-gilbreth"), Shape(4, 1), cmd)
    assert plan.spec.continuation is Continuation.NONE and plan.spec.signal is None
    assert "--signal" not in plan.script()
    assert "srun --kill-on-bad-exit=1 --nodes=4 --ntasks-per-node=1" in plan.script()
    lightning = make_plan(load_profile("purdue-gilbreth"), Shape(4, 1), cmd, PlanOptions(signal="USR1"))
    assert "#SBATCH --signal=B:USR1@120" in lightning.script()


def test_script_port_formula_is_the_runtimes():
    for job_id in ("1", "19999", "20000", "123457", "9876543"):
        shell = subprocess.run(["bash", "-c", f"SLURM_JOB_ID={job_id}; echo $((20000 + SLURM_JOB_ID % 20000))"],
                               capture_output=True, text=True).stdout.strip()
        assert int(shell) == port_from_job_id(job_id)


def test_race_parsing_and_names():
    assert parse_race("1x4, 4x1") == [(1, 4), (4, 1)]
    with pytest.raises(UserError) as err:
        parse_race("1x4")
    assert err.value.message == "--race '1x4' needs at least two shapes -- write e.g. --race 1x4,4x1"
    with pytest.raises(UserError):
        parse_race("1x4,four")
    assert job_name("/a/b/My Run!") .startswith("ds-my-run-") and job_name("/a/b/x", "1x4").endswith("-1x4")
    assert job_name("/a/b/x") != job_name("/c/b/x")


def test_shape_validation_names_the_flag():
    with pytest.raises(UserError) as err:
        Shape(0, 1)
    assert err.value.message == "--nodes 0 must be at least 1 -- ask for 1 or more nodes"


def test_a_field_run_is_estimated_from_its_network_counted_on_the_meta_device():
    import torch

    from diffscale.cluster.planning import estimates
    from diffscale.tasks.base import count_parameters
    from diffscale.tasks.registry import build_task

    tiny = presets.get_preset("tiny")  # the meta-device count agrees with the UNet walk where both apply
    walked, counted = estimates.model_cost(tiny.model), estimates.network_cost(tiny)
    assert abs(counted.macs_per_sample / walked.macs_per_sample - 1) < 0.01
    assert abs(counted.params / walked.params - 1) < 0.02
    field = presets.get_preset("field-icon")
    cost = estimates.cost_of(field)
    with torch.device("meta"):
        network = build_task(field, torch.device("meta"), load_data=False).build_network()
    assert cost.params == count_parameters(network) and cost.macs_per_sample > cost.params * 0.9
    # A step of this ~1 MFLOP network is bound by launches, not FLOPs: no millions of samples per second.
    rate = estimates.samples_per_s_per_rank(field, "A100-80GB", 8, has_gpus=True)
    assert rate.value == field.train.batch_per_gpu / estimates.ASSUMED_MIN_GPU_STEP_S

    run = DiffscaleRun(config=field, run_dir="/runs/r", python="python3")
    plan = make_plan(load_profile("dkrz-levante"), Shape(1, 1), run, PlanOptions(account="bb1"))
    assert plan.ok and plan.estimate_s is not None
    assert [c.ok for c in plan.checks if c.name == "GPU memory"] == [True]


@pytest.mark.parametrize("name", ["field-icon", "field-large", "policy", "policy-tiny"])
def test_a_presets_stated_network_cost_is_the_counted_one(name):
    """Planning a preset reads its network's cost from a table (no torch on the login node)."""
    from dataclasses import replace

    from diffscale.cluster.planning import estimates

    cfg = presets.get_preset(name)
    assert estimates.cost_of(cfg) == estimates.network_cost(cfg) == estimates.PRESET_NETWORK_COSTS[name]
    wider = replace(cfg, model=replace(cfg.model, **{"hidden" if name.startswith("field") else "down_dims":
                                                     512 if name.startswith("field") else (64, 128)}))
    assert estimates.cost_of(wider) == estimates.network_cost(wider) != estimates.PRESET_NETWORK_COSTS[name]


@pytest.mark.parametrize("flags, message", [
    (["--nodes", "1000000000"], "error: --nodes 1000000000 is out of range: more nodes than any partition diffscale "
                                "plans for holds (at most 4096) -- pass --nodes 4096 or less"),
    (["--nodes", "1000000", "--force"], "error: --nodes 1000000 is out of range"),
    (["--gpus-per-node", "20000"], "error: --gpus-per-node 20000 is out of range: more GPUs per node than any node "
                                   "holds (at most 64) -- pass --gpus-per-node 64 or less"),
    # the profile knows the nodes: refused before a rank is laid out, the script not printed
    (["--gpus-per-node", "8"], "error: preflight check 'GPUs per node' failed: 8 GPUs per node asked, but "
                               "'a100-80gb' nodes have 4 -- use --gpus-per-node 4 (or fewer) and more --nodes; "
                               "or pass --force to go ahead anyway"),
])
def test_absurd_sizes_are_refused_before_any_table(flags, message, capsys, tmp_path):
    from diffscale.cli import main

    assert main(["plan", "--cluster", "purdue-gilbreth", "--preset", "tiny", "--out", str(tmp_path / "r"),
                 *flags]) == 2
    captured = capsys.readouterr()
    assert captured.err.strip() == message or captured.err.startswith(message)
    assert captured.out == ""  # no script, no rank table


def test_the_profile_s_node_count_is_checked_before_the_table(tmp_path, capsys):
    from diffscale.cli import main

    argv = ["plan", "--cluster", str(fixture_profile("lab-l40s-h200").source), "--preset", "tiny",
            "--out", str(tmp_path / "r"), "--nodes", "5"]
    assert main(argv) == 2
    assert capsys.readouterr().err == ("error: preflight check 'nodes' failed: 5 nodes > the partition's maximum 4 "
                                       "-- use --nodes 4 or fewer; or pass --force to go ahead anyway\n")
    assert main([*argv, "--force"]) == 0  # a profile may be out of date: --force still goes ahead
    assert "nodes" in capsys.readouterr().out


def test_a_large_job_prints_its_first_and_last_node():
    plan = make_plan(load_profile("purdue-gilbreth"), Shape(4096, 4), _run())
    shown = plan.shown_ranks()
    assert len(shown) == 4 + 1 + 4 and shown[4] is None
    assert [r.rank for r in shown if r is not None] == [0, 1, 2, 3, 16380, 16381, 16382, 16383]
    assert shown[-1].host == "node 4095 of SLURM_JOB_NODELIST"
    small = make_plan(load_profile("purdue-gilbreth"), Shape(2, 4), _run())
    assert small.shown_ranks() == list(small.ranks)


@pytest.mark.parametrize("line, changes", [
    ('export PATH="$ENV/bin:$PATH"', True), (". useenv.sh", True), ("source ./useenv.sh", True),
    ("export NCCL_DEBUG=INFO", False), ("cd /tmp", False), ("true activate", False),
])
def test_the_job_runs_the_python_its_set_up_lines_put_on_path(line, changes, tmp_path):
    """The script's own lines, run by bash: a set-up line that changes which `python` the shell
    finds -- whatever its words -- makes the job run that one; any other keeps the planned one."""
    from diffscale.cluster.scripts.shellparts import python_choice

    env_bin = tmp_path / "env" / "bin"
    env_bin.mkdir(parents=True)
    (env_bin / "python").write_text("#!/bin/sh\n")
    (env_bin / "python").chmod(0o755)
    (tmp_path / "useenv.sh").write_text(f'export PATH="{env_bin}:$PATH"\n')
    lines = python_choice("/home/me/.venv/bin/python", (line,))
    done = subprocess.run(["bash", "-c", "\n".join(lines)], capture_output=True, text=True, cwd=tmp_path,
                          env={"PATH": "/usr/bin:/bin", "ENV": str(tmp_path / "env")})
    chosen = str(env_bin / "python") if changes else "/home/me/.venv/bin/python"
    assert done.returncode == 0 and done.stdout == f"diffscale: python {chosen}\n", done.stderr


def test_set_up_lines_make_the_job_check_its_python_and_the_plan_says_so():
    from diffscale.cluster.planning.plan import job_python

    run = DiffscaleRun(config=presets.get_preset("tiny"), run_dir="/runs/r", python="/home/me/.venv/bin/python")
    assert job_python(run, (". useenv.sh",), asked=False) == (
        "the job runs the `python` its set-up lines put on PATH, if they change which `python` the shell finds (conda "
        "activate, a venv, a module, export PATH=...), else this host's /home/me/.venv/bin/python; the job checks "
        "that itself and its log names the interpreter it runs ('diffscale: python ...'); pass --python PATH to "
        "choose one")
    assert job_python(run, (". useenv.sh",), asked=True) is None  # --python wins
    assert job_python(run, (), asked=False) is None


def test_conda_activate_runs_the_environment_s_python(tmp_path, capsys):
    from diffscale.cli import main

    base = ["plan", "--cluster", "bu-scc", "--account", "mylab", "--preset", "policy", "--gpus-per-node", "1",
            "--setup", "module load miniconda", "--setup", "conda activate dp", "--out", str(tmp_path / "r")]
    assert main(base) == 0
    out = capsys.readouterr().out
    assert '\n"$job_python" -m torch.distributed.run --standalone' in out
    assert f"\njob_python={sys.executable}\n" in out
    assert " ".join(out.split()).count("note: the job runs the `python` its set-up lines put on PATH") == 1
    assert main([*base, "--python", "/opt/envs/dp/bin/python"]) == 0
    out = capsys.readouterr().out
    assert "\n/opt/envs/dp/bin/python -m torch.distributed.run --standalone" in out
    assert "job_python" not in out and "put on PATH" not in out
