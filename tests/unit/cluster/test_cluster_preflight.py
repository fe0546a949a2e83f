"""Every preflight failure named in the cluster issue, with the message and the fix."""

from __future__ import annotations

import math

import pytest

from diffscale.cluster.planning.plan import PlanOptions, make_plan
from diffscale.cluster.planning.shape import Shape
from diffscale.cluster.planning.workload import DiffscaleRun, UserCommand
from diffscale.cluster.profiles.loading import load_profile
from diffscale.cluster.scripts.timefmt import hms
from diffscale.config import merge, presets
from diffscale.runtime.resources import GIB


def _run(preset="medium", data_bytes=0, **sections):
    cfg = merge(presets.get_preset(preset), sections) if sections else presets.get_preset(preset)
    return DiffscaleRun(config=cfg, run_dir="/runs/r", python="python3", data_bytes=data_bytes)


def _check(plan, name):
    return next(c for c in plan.checks if c.name == name)


def test_more_gpus_per_node_than_the_partition_has():
    plan = make_plan(load_profile("purdue-gilbreth"), Shape(1, 8), _run())
    c = _check(plan, "GPUs per node")
    assert c.ok is False
    assert c.detail == "8 GPUs per node asked, but 'a100-80gb' nodes have 4"
    assert c.fix == "use --gpus-per-node 4 (or fewer) and more --nodes"
    assert not plan.ok


def test_32_tasks_x_4_cpus_on_64_core_gpu_nodes():
    # the user's job: 32 tasks x 4 CPUs = 128 on Levante's 64-core GPU nodes
    plan = make_plan(load_profile("dkrz-levante"), Shape(1, 32, cpus_per_rank=4, use_gpus=False), _run())
    c = _check(plan, "CPUs per node")
    assert c.ok is False
    assert c.detail == "32 tasks x 4 CPUs = 128 > 64 cores per 'gpu' node"
    assert c.fix == "use --cpus-per-task 2 (64 cores / 32 tasks)"


def test_too_many_cores_per_rank_on_four_gpus():
    plan = make_plan(load_profile("purdue-gilbreth"), Shape(1, 4, cpus_per_rank=32), _run())
    c = _check(plan, "CPUs per node")
    assert (c.ok, c.detail, c.fix) == (False, "4 tasks x 32 CPUs = 128 > 64 cores per 'a100-80gb' node",
                                       "use --cpus-per-task 16 (64 cores / 4 tasks)")


def test_ranks_holding_their_data_oom_on_256_gib_nodes():
    # 4 GPUs on NYU Torch's 256 GiB L40S nodes, each rank loading a 64 GiB npz file whole:
    # 4 x (3 GiB + 64 GiB) = 268 GiB
    plan = make_plan(load_profile("nyu-torch"), Shape(1, 4), _run(data_bytes=64 * GIB))
    c = _check(plan, "host RAM per node")
    assert c.ok is False
    assert c.detail == ("4 ranks x ~67.0 GiB = 268 GiB (estimated) "
                        "> 256 GiB per node: the kernel would OOM-kill the job")
    assert c.fix == ("use at most 3 ranks per node (--gpus-per-node 3) and more --nodes, "
                     "or train on a smaller data file (every rank loads all of its ~64.0 GiB)")
    # and the fix really fits
    fixed = make_plan(load_profile("nyu-torch"), Shape(1, 3), _run(data_bytes=64 * GIB))
    assert _check(fixed, "host RAM per node").ok is True


def test_diffscale_train_counts_no_loader_workers():
    # the user's OOM-killed job had 8 loader workers per GPU; diffscale train keeps its data on
    # the device and starts none, so 4 ranks with a 6 GB data set each need 4 x (3 + 5.6) GiB
    plan = make_plan(load_profile("nyu-torch"), Shape(1, 4), _run(data_bytes=6_000_000_000))
    c = _check(plan, "host RAM per node")
    assert (c.ok, c.detail) == (True, "4 ranks x ~8.6 GiB = 34.4 GiB (estimated) of 256 GiB")
    assert plan.spec.mem_per_node_gb == 43  # 34.4 GiB x 1.25 headroom, in the scheduler's G (GiB)


def test_fewer_ranks_cannot_help_names_memory_or_a_partition():
    plan = make_plan(load_profile("nyu-torch"), Shape(1, 4, mem_per_node_gb=100), _run(data_bytes=200 * GIB))
    c = _check(plan, "host RAM per node")
    assert c.ok is False and c.detail.endswith("> 100 GiB per node: the kernel would OOM-kill the job")
    assert c.fix == ("train on a smaller data file (every rank loads all of its ~200.0 GiB), "
                     "or ask for more memory (--mem up to 256)")
    bare = make_plan(load_profile("nyu-torch"), Shape(1, 4), _run(data_bytes=300 * GIB))
    assert _check(bare, "host RAM per node").fix == (
        "train on a smaller data file (every rank loads all of its ~300.0 GiB), "
        "or use a partition with more memory per node")


def test_mem_above_the_node():
    plan = make_plan(load_profile("nyu-torch"), Shape(1, 4, mem_per_node_gb=300), _run())
    c = _check(plan, "host RAM per node")
    assert (c.ok, c.detail, c.fix) == (False, "--mem 300 GiB > 256 GiB per 'l40s' node", "ask at most --mem 256")


def test_time_above_the_partition_maximum():
    plan = make_plan(load_profile("purdue-gilbreth"), Shape(1, 4, time_s=72 * 3600), _run())
    c = _check(plan, "wall time")
    assert c.ok is False
    assert c.detail == "--time 72:00:00 > the partition's maximum 48:00:00"
    assert c.fix == ("ask --time 48:00:00 or less; leave --time out and plan splits the run into resumable segments")


def test_user_command_time_above_maximum_names_its_own_resume():
    plan = make_plan(load_profile("uchicago-midway3"), Shape(1, 4, time_s=3 * 86400),
                     UserCommand(("python", "train.py"), "/runs/r", "python3"))
    c = _check(plan, "wall time")
    assert c.ok is False and c.fix == "ask --time 48:00:00 or less and make the command resume from its checkpoints"


def test_run_longer_than_the_limit_becomes_a_chain_of_segments():
    # xl for 2,000,000 steps on one 12-hour Levante job: segments, and the check passes
    plan = make_plan(load_profile("dkrz-levante"), Shape(1, 4), _run("xl", train={"steps": 2_000_000}))
    c = _check(plan, "wall time")
    assert c.ok is True and c.detail.startswith(f"{len(plan.segments)} segments of 12:00:00 (max 12:00:00)")
    assert len(plan.segments) > 1
    assert plan.segments[0].steps.startswith("~0..") and plan.segments[-1].steps.endswith("..2000000")
    assert plan.spec.continuation.value == "chain"


def test_preset_too_big_for_the_gpu():
    plan = make_plan(load_profile("uchicago-midway3"), Shape(1, 4), _run("medium", train={"batch_per_gpu": 4096}))
    c = _check(plan, "GPU memory")
    assert c.ok is False
    assert c.detail.startswith("preset medium, batch 4096 per GPU: ~") and c.detail.endswith(
        "GB (estimated) > 90 % of 48 GB per L40S")
    assert c.fix.startswith("lower train.batch_per_gpu to ")
    fit = int(c.fix.split("lower train.batch_per_gpu to ")[1].split()[0])
    accum = int(c.fix.split("raise train.grad_accum to ")[1].split()[0])
    assert fit * accum >= 4096
    fixed = make_plan(load_profile("uchicago-midway3"), Shape(1, 4),
                      _run("medium", train={"batch_per_gpu": fit, "grad_accum": accum}))
    assert _check(fixed, "GPU memory").ok is True


def test_global_batch_not_divisible():
    plan = make_plan(load_profile("purdue-gilbreth"), Shape(2, 4), _run(), PlanOptions(global_batch=1001))
    c = _check(plan, "global batch")
    assert c.ok is False
    assert c.detail == "global batch 1001 is not divisible by 8 ranks x 1 accumulation steps"
    assert c.fix == "use a multiple of 8 (e.g. 1000 or 1008) or change the shape"


def test_multi_host_needs_a_multi_host_pe():
    plan = make_plan(load_profile("bu-scc"), Shape(2, 2), _run())
    c = _check(plan, "parallel environment")
    assert c.ok is False
    assert c.detail == "2 hosts asked, but the profile names no multi-host PE"


def test_unknown_facts_are_reported_unknown_not_passed():
    plan = make_plan(load_profile("bu-scc"), Shape(1, 2), _run())
    assert _check(plan, "GPUs per node").ok is None
    assert _check(plan, "CPUs per node").ok is None
    assert plan.ok  # unknown does not refuse the job


@pytest.mark.parametrize("profile", ["bu-scc", "purdue-gilbreth", "uchicago-midway3", "dkrz-levante", "nyu-torch"])
def test_a_sensible_job_passes_on_every_bundled_cluster(profile):
    p = load_profile(profile)
    g = p.partition(None).gpus_per_node or 1
    plan = make_plan(p, Shape(1, g), _run("medium"), PlanOptions(account="mylab"))
    assert plan.ok, [c for c in plan.checks if c.ok is False]


@pytest.mark.parametrize("profile, how", [
    ("purdue-gilbreth", "`slist`"), ("dkrz-levante", "DKRZ project"), ("nyu-torch", "`my_slurm_accounts`")])
def test_a_site_that_requires_an_account_refuses_a_plan_without_one(profile, how):
    p = load_profile(profile)
    plan = make_plan(p, Shape(1, p.partition(None).gpus_per_node or 1), _run())
    c = _check(plan, "required by the site")
    assert (c.ok, c.detail) == (False, f"{p.title} refuses jobs without --account")
    assert c.fix.startswith("pass --account ACCOUNT (") and how in c.fix
    assert not plan.ok
    given = make_plan(p, Shape(1, p.partition(None).gpus_per_node or 1), _run(), PlanOptions(account="mylab"))
    assert (_check(given, "required by the site").ok, _check(given, "required by the site").detail) == (
        True, "--account mylab")


def test_plan_without_the_required_account_exits_2_with_the_fix(capsys):
    from diffscale.cli import main

    assert main(["plan", "--cluster", "purdue-gilbreth", "--preset", "small", "--out", "/runs/r"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: preflight check 'required by the site' failed: Purdue Gilbreth refuses jobs "
                          "without --account -- pass --account ACCOUNT (your research group's account: `slist`")
    assert main(["plan", "--cluster", "purdue-gilbreth", "--preset", "small", "--out", "/runs/r",
                 "--account", "mylab"]) == 0


def test_a_profile_account_satisfies_the_requirement_and_other_facts_can_be_required():
    from dataclasses import replace

    from diffscale.cluster.profiles.types import Fact, Requirement

    p = replace(load_profile("purdue-gilbreth"), account="grp",
                required=(Requirement(Fact.ACCOUNT), Requirement(Fact.QOS, "normal or standby")))
    c = _check(make_plan(p, Shape(1, 4), _run()), "required by the site")
    assert (c.ok, c.detail, c.fix) == (False, "Purdue Gilbreth refuses jobs without --qos",
                                       "pass --qos QOS (normal or standby)")
    ok = _check(make_plan(p, Shape(1, 4), _run(), PlanOptions(qos="standby")), "required by the site")
    assert (ok.ok, ok.detail) == (True, "--account grp, --qos standby")


def test_grid_engine_refuses_run_dirs_it_cannot_enter():
    run = DiffscaleRun(config=presets.get_preset("tiny"), run_dir="/runs/a$HOME", python="python3")
    c = _check(make_plan(load_profile("bu-scc"), Shape(1, 2), run), "run directory")
    assert (c.ok, c.detail, c.fix) == (False, "Grid Engine cannot run a job in a directory whose path contains '$'",
                                       "choose a --out path without '$' and newlines")
    ok = DiffscaleRun(config=presets.get_preset("tiny"), run_dir="/runs/it's \"odd\" dir", python="python3")
    assert _check(make_plan(load_profile("bu-scc"), Shape(1, 2), ok), "run directory").ok is True


def test_slurm_refuses_an_executable_path_with_a_space():
    run = DiffscaleRun(config=presets.get_preset("tiny"), run_dir="/runs/r", python="/opt/my env/bin/python")
    c = _check(make_plan(load_profile("purdue-gilbreth"), Shape(1, 4), run), "task executable")
    assert c.ok is False and c.fix == "use an interpreter/command path without spaces (--python, or a symlink to it)"


def test_a_limit_shorter_than_start_up_and_one_checkpoint_fails():
    from diffscale.cluster.planning import estimates

    run = DiffscaleRun(config=presets.get_preset("medium"), run_dir="/runs/r", python="python3")
    profile = load_profile("purdue-gilbreth")
    estimate = make_plan(profile, Shape(1, 4), run).estimate_s
    need, step_s = estimates.first_checkpoint_s(run.config, estimate)
    assert need == estimates.STARTUP_S + math.ceil(run.config.train.checkpoint_every * step_s)
    c = _check(make_plan(profile, Shape(1, 4, time_s=60), run), "wall time")
    assert c.ok is False
    assert c.detail.startswith("--time 00:01:00 ends before the run's first checkpoint: start-up ~3 min + "
                               f"{run.config.train.checkpoint_every} steps to a checkpoint")
    assert c.fix.startswith(f"pass --time {hms(math.ceil(need / 60) * 60)} or more")
    # a limit that reaches the first checkpoint passes; one between start-up and it names a cadence that fits
    assert _check(make_plan(profile, Shape(1, 4, time_s=need + 60), run), "wall time").ok is True
    assert need - estimates.STARTUP_S > 120  # medium on A100s: minutes between checkpoints
    middle = _check(make_plan(profile, Shape(1, 4, time_s=estimates.STARTUP_S + 60), run), "wall time")
    assert middle.ok is False
    assert middle.fix.endswith(f"or checkpoint more often (--set train.checkpoint_every={int(60 / step_s)})")


def test_plan_ends_with_the_checks_it_could_not_make(tmp_path, capsys):
    from diffscale.cli import main

    assert main(["plan", "--cluster", "bu-scc", "--preset", "tiny", "--out", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    last = " ".join(out[out.rindex("preflight (1x1):"):].split())  # rich wraps the line at the console width
    assert last == ("preflight (1x1): 5 of 9 checks passed; 4 not made, so the job may still fail on them (GPUs per "
                    "node: the profile does not say how many GPUs a 'any-gpu' node has; CPUs per node: the profile "
                    "does not say how many cores a 'any-gpu' node has; host RAM per node: the profile does not say "
                    "how much memory a 'any-gpu' node has; GPU memory: the profile does not say how much memory a "
                    "'any-gpu' GPU has)")
    assert main(["plan", "--cluster", "purdue-gilbreth", "--account", "lab", "--mem", "64", "--preset", "tiny",
                 "--out", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert out.rstrip().endswith("preflight (1x4): 8 of 8 checks passed")
