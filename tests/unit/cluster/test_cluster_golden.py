"""Golden job scripts: every bundled profile (and two test fixtures) renders byte for byte
what tests/golden/*.sh holds. Regenerate after an intended change with

    DIFFSCALE_REGEN_GOLDEN=1 .venv/bin/python -m pytest tests/unit/cluster/test_cluster_golden.py

and review the diff. Each golden script is also parsed by ``bash -n``.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from diffscale.cluster.planning.couple import coupled_plans
from diffscale.cluster.planning.plan import PlanOptions, make_plan
from diffscale.cluster.planning.shape import Shape
from diffscale.cluster.planning.workload import DiffscaleRun, UserCommand
from diffscale.cluster.profiles.loading import available, load_profile
from diffscale.cluster.scripts.jobspec import RaceSpec, job_name
from diffscale.config import merge, presets
from diffscale.data.locations import SpoolSpec
from diffscale.io.kernels import KernelCache

from cluster_fixtures import RECORDED_AT, fixture_profile, probe_file, recorded_start

GOLDEN = Path(__file__).resolve().parents[2] / "golden"
# Fixed, hostile run directory: golden files must not depend on the machine.
RUN_DIR = "/scratch/it's a \"weird\" $HOME `date` dir\nline two"
PYTHON = "/opt/diffscale-venv/bin/python"
KERNELS = "/home/it's \"me\" $USER/.cache/diffscale/kernels"
BUNDLED = ("bu-scc", "purdue-gilbreth", "uchicago-midway3", "dkrz-levante", "nyu-torch")


def _profile(name: str):
    return fixture_profile(name) if name in ("sge-two-host", "slurm-test") else load_profile(name)


def _cases():
    """(golden file stem, profile, shape, workload, options)."""
    xl = presets.get_preset("xl")
    tiny = presets.get_preset("tiny")
    run = DiffscaleRun(config=xl, run_dir=RUN_DIR, python=PYTHON)
    user = UserCommand(("python", "train.py", "--name", "it's $x"), RUN_DIR, PYTHON)
    cases = []
    for name in sorted(available()):
        if name not in BUNDLED:
            continue
        profile = load_profile(name)
        part = profile.partition(None)
        g = part.gpus_per_node or 2
        nodes = 1 if profile.sge else 2
        cases.append((f"{name}-train", name, Shape(nodes, g), run, PlanOptions(account="myproject")))
        cases.append((f"{name}-user", name, Shape(1, g), user, PlanOptions()))
        for other in profile.partitions:  # every other partition / GPU class: its own golden
            if other.name != part.name:
                cases.append((f"{name}-partition-{other.name}", name,
                              Shape(1, other.gpus_per_node or 2, partition=other.name), run,
                              PlanOptions(account="myproject")))
    long = DiffscaleRun(config=merge(xl, {"train": {"steps": 2_000_000}}), run_dir=RUN_DIR, python=PYTHON)
    cases.append(("dkrz-levante-chain", "dkrz-levante", Shape(1, 4), long, PlanOptions(account="bb1234")))
    rivals = (job_name(RUN_DIR, "4x1"),)
    cases.append(("purdue-gilbreth-race-1x4", "purdue-gilbreth", Shape(1, 4), run,
                  PlanOptions(race=RaceSpec("1x4", rivals))))
    cases.append(("sge-two-host-train", "sge-two-host", Shape(2, 2),
                  DiffscaleRun(config=tiny, run_dir=RUN_DIR, python=PYTHON),
                  PlanOptions(race=RaceSpec("2x2", (job_name(RUN_DIR, "1x2"),)))))
    # A diffusion-policy run as BU SCC users submit it: their module and conda environment first.
    policy = DiffscaleRun(config=presets.get_preset("policy"), run_dir=RUN_DIR, python=PYTHON)
    cases.append(("bu-scc-policy", "bu-scc", Shape(1, 1), policy,
                  PlanOptions(account="myproject", setup=("module load miniconda", "conda activate dp-$USER"))))
    # A lab's own script that puts its environment on PATH, no "activate" in the line: the job picks
    # the `python` it finds afterwards.
    cases.append(("uchicago-midway3-setup", "uchicago-midway3", Shape(1, 2), run,
                  PlanOptions(account="myproject", setup=(". /project/lab/useenv.sh",))))
    cases.append(("slurm-test-cpu-user", "slurm-test", Shape(2, 1), user, PlanOptions(signal="USR1")))
    cases.append(("sge-two-host-user", "sge-two-host", Shape(2, 2), user, PlanOptions()))
    # `diffscale plan` tells a training job where the kernel cache it looked in is (a hostile path too)
    cached = DiffscaleRun(config=xl, run_dir=RUN_DIR, python=PYTHON, kernels=KernelCache(KERNELS))
    cases.append(("nyu-torch-train-kernel-cache", "nyu-torch", Shape(1, 2, partition="h200"), cached, PlanOptions()))
    return cases


CASES = _cases()


def _matches_golden(text: str, stem: str) -> None:
    """``text`` is GOLDEN/STEM.sh (rewritten with DIFFSCALE_REGEN_GOLDEN=1), valid bash, and its
    SBATCH directives carry only quoting-free values."""
    path = GOLDEN / f"{stem}.sh"
    if os.environ.get("DIFFSCALE_REGEN_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"missing {path}: run with DIFFSCALE_REGEN_GOLDEN=1"
    assert text == path.read_text(), f"{stem}: script differs from {path} (DIFFSCALE_REGEN_GOLDEN=1 to accept)"
    syntax = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr
    for line in _directives(text):
        if line.startswith("#SBATCH"):
            assert re.fullmatch(r"#SBATCH --[a-z-]+(=[A-Za-z0-9_.+:=/@,%-]+)?", line), (stem, line)


@pytest.mark.parametrize("stem,profile,shape,workload,options", CASES, ids=[c[0] for c in CASES])
def test_golden_script(stem, profile, shape, workload, options):
    _matches_golden(make_plan(_profile(profile), shape, workload, options).script(), stem)


def _coupled():
    """The two jobs of `diffscale submit --couple` on Levante: ICON on 2 compute nodes writes the
    spool (a hostile path, like the run directory), field-icon trains on one A100."""
    spool = SpoolSpec(Path(RUN_DIR) / "spool $x", 3840)
    cfg = merge(presets.get_preset("field-icon"), {"data": {"source": spool.source}})
    return coupled_plans(load_profile("dkrz-levante"), cfg, spool, ("./icon.exe", "--namelist", "it's $x.nml"),
                         run_dir=RUN_DIR, python=PYTHON, sim=Shape(2, 128, partition="compute", use_gpus=False),
                         trainer=Shape(1, 1), options=PlanOptions(account="bb1234"))


@pytest.mark.parametrize("index,role", [(0, "simulation"), (1, "trainer")])
def test_golden_coupled_scripts(index, role):
    plan = _coupled()[index]
    assert plan.role == role and plan.spec.script_file == f"job-{role}-{plan.shape.label}.slurm.sh"
    text = plan.script()
    _matches_golden(text, f"dkrz-levante-coupled-{role}")
    assert "RUN_DIR='/scratch/it'\"'\"'s a \"weird\" $HOME `date` dir\nline two'" in text


def test_golden_race_across_partitions(tmp_path):
    """`submit --partition auto --race 3` on the lab's cluster (recorded `sbatch --test-only`): the
    8 x H200 candidate, third by finish, racing 16 and 8 L40S in another partition."""
    from diffscale.cluster.planning.partition_auto import compare
    from diffscale.cluster.planning.partition_choice import ranked
    from diffscale.cluster.planning.partition_race import raced, raced_plans
    from diffscale.cluster.planning.usage import rank_usage
    from diffscale.cluster.probe.result import load

    probes = [probe_file(tmp_path / f"{gpu}.json", main_gib=5.1, workers=2, worker_gib=7.3, gpu=f"NVIDIA {gpu}",
                         steps_per_s=rate) for gpu, rate in (("H200", 40.0), ("L40S", 8.7))]
    user = UserCommand(("python", "train.py", "--name", "it's $x"), RUN_DIR, PYTHON,
                       usage=rank_usage([(load(p), str(p)) for p in probes]))
    found = compare(fixture_profile("lab-l40s-h200"), user, PlanOptions(account="mylab"), recorded_start,
                    RECORDED_AT, total_steps=1_000_000)
    plans = raced_plans(raced(ranked(found), 3))
    assert [p.spec.race.key for p in plans] == ["l40s-4x4", "l40s-2x4", "h200-1x8"]
    _matches_golden(plans[2].script(), "lab-auto-race-h200-1x8")


def test_the_coupled_jobs_share_the_run_but_not_their_resources():
    sim, trainer = _coupled()
    sim_text, trainer_text = sim.script(), trainer.script()
    # the simulation: CPU ranks on compute nodes, told where to write; the trainer: one GPU, no spool variable
    assert "#SBATCH --partition=compute" in sim_text and "--gpus-per-node" not in sim_text
    assert "export DIFFSCALE_SPOOL='/scratch/it'\"'\"'s a \"weird\" $HOME `date` dir\nline two/spool $x'" in sim_text
    assert "#SBATCH --gpus-per-node=1" in trainer_text and "DIFFSCALE_SPOOL" not in trainer_text
    assert "#SBATCH --time=08:00:00" in trainer_text  # as long as the simulation may run (8 h on compute)
    assert sim.spec.job_name.endswith("-simulation") and trainer.spec.job_name.endswith("-trainer")
    assert trainer.workload.config.data.source.startswith("spool:/scratch/it's")
    assert any("--dependency=after:<simulation job>" in note for note in trainer.notes)


def test_every_bundled_profile_and_partition_has_goldens():
    stems = {c[0] for c in CASES}
    for name in BUNDLED:
        assert f"{name}-train" in stems and f"{name}-user" in stems
        profile = load_profile(name)
        default = profile.partition(None).name
        for part in profile.partitions:
            assert part.name == default or f"{name}-partition-{part.name}" in stems


def _directives(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith(("#SBATCH", "#$"))]


@pytest.mark.parametrize("name", BUNDLED)
def test_the_chosen_partition_reaches_the_script(name):
    """A plan for a partition asks the scheduler for it: its name, node feature, GPU type or
    resources are directives of the script, so the job cannot land on another partition's GPUs."""
    profile = load_profile(name)
    scripts = {}
    for part in profile.partitions:
        run = DiffscaleRun(config=presets.get_preset("medium"), run_dir="/runs/r", python=PYTHON)
        plan = make_plan(profile, Shape(1, part.gpus_per_node or 2, partition=part.name), run,
                         PlanOptions(account="myproject"))
        directives = _directives(plan.script())
        assert part.selectors(profile.scheduler), (name, part.name)
        for selector in part.selectors(profile.scheduler):
            if selector.startswith("GPU type "):
                gres = selector.removeprefix("GPU type ")
                assert any(f"gpu:{gres}:" in d or f"={gres}:" in d for d in directives), (name, part.name, directives)
            else:
                assert f"#SBATCH {selector}" in directives or f"#$ {selector}" in directives, (name, part.name)
        scripts[part.name] = tuple(directives)
    assert len(set(scripts.values())) == len(scripts), f"{name}: two partitions give the same directives"


def test_nyu_h200_asks_for_h200s_not_any_gpu():
    # the day-one report: `plan --cluster nyu-torch --partition h200` wrote no GPU type at all
    run = DiffscaleRun(config=presets.get_preset("xl"), run_dir="/runs/r", python=PYTHON)
    plan = make_plan(load_profile("nyu-torch"), Shape(1, 4, partition="h200"), run, PlanOptions(account="torch_pr_1"))
    assert "#SBATCH --constraint=h200" in _directives(plan.script())
    assert "#SBATCH --gres=gpu:4" in _directives(plan.script())


def test_hostile_path_is_one_literal_word_in_every_script():
    # The run dir appears only as a quoted RUN_DIR=... assignment and quoted argv words.
    for stem, profile, shape, workload, options in CASES:
        text = make_plan(_profile(profile), shape, workload, options).script()
        directives = [ln for ln in text.splitlines() if ln.startswith(("#SBATCH", "#$"))]
        # directive lines are parsed by sbatch/qsub, not a shell: only safe characters there
        for line in directives:
            assert re.fullmatch(r"(#SBATCH --[a-z-]+(=[A-Za-z0-9_.+:=/@,%-]+)?"
                                r"|#\$ -[A-Za-z_]+( [A-Za-z0-9_.+:=/@,%-]+)*)", line), (stem, line)
        assert "RUN_DIR='/scratch/it'\"'\"'s a \"weird\" $HOME `date` dir\nline two'" in text, stem
