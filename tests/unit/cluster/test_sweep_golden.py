"""Golden array scripts of a sweep, with hostile values (quotes, ``$()``, spaces, backticks) in its
axes and sweep directory: rendered byte for byte as tests/golden/sweep-*.sh hold them (regenerate
with DIFFSCALE_REGEN_GOLDEN=1), valid bash, and every value reaching an element's command intact."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from diffscale.cluster.profiles.types import SchedulerKind
from diffscale.studies import definition as d
from diffscale.studies.arrays import ArraySpec, ArrayTask, render
from diffscale.studies.plan import plan_sweep

GOLDEN = Path(__file__).resolve().parents[2] / "golden"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
SWEEP_DIR = "/scratch/it's a \"weird\" $HOME `date` sweep"
HOSTILE = ["it's", "$(touch /tmp/pwned)", "a b `id`"]


def _check(stem: str, text: str) -> None:
    path = GOLDEN / f"{stem}.sh"
    if os.environ.get("DIFFSCALE_REGEN_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"missing {path}: run with DIFFSCALE_REGEN_GOLDEN=1"
    assert text == path.read_text(), f"{stem}: script differs from {path} (DIFFSCALE_REGEN_GOLDEN=1 to accept)"
    subprocess.run(["bash", "-n", str(path)], check=True)


def _plan(profile: str, monkeypatch):
    monkeypatch.setattr("sys.executable", "/opt/diffscale-venv/bin/python")
    sweep = d.from_dict({"out": SWEEP_DIR, "base": {"command": ["python", "/opt/train.py", "--name", "{name}",
                                                                "--seed={seed}", "--out", "{run_dir}"]},
                         "axes": {"name": HOSTILE}, "seeds": [0, 1],
                         "cluster": {"name": str(FIXTURES / profile), "procs_per_node": 1, "parallel": 2,
                                     "time": "01:00:00"}}, name="hostile", source="test")
    return plan_sweep(sweep, force=True)


@pytest.mark.parametrize("profile,stem", [("slurm-test.yaml", "sweep-slurm-array"),
                                          ("sge-two-host.yaml", "sweep-sge-array")])
def test_golden_array_script_with_hostile_axis_values(profile, stem, monkeypatch):
    plan = _plan(profile, monkeypatch)
    assert len(plan.groups) == 1 and len(plan.elements) == 6
    group = plan.groups[0]
    _check(stem, render(group.array))
    _check(f"{stem}-element", group.plans[3].script())


@pytest.mark.parametrize("profile", ["slurm-test.yaml", "sge-two-host.yaml"])
def test_each_element_command_reaches_its_process_literally(profile, monkeypatch, tmp_path):
    """The element's job script, run by bash with echo standing in for srun / torchrun: the
    arguments arrive as the axes gave them."""
    plan = _plan(profile, monkeypatch)
    for plan_k, element in zip(plan.groups[0].plans, plan.groups[0].elements, strict=True):
        script = plan_k.script()
        line = next(ln for ln in script.splitlines() if "/opt/train.py" in ln)
        argv = line[line.index("python "):].rstrip(" &")
        out = subprocess.run(["bash", "-c", f"printf '%s\\n' {argv}"], capture_output=True, text=True, check=True)
        assert out.stdout.splitlines() == list(element.command(plan.definition.command))


def test_an_array_refuses_a_value_a_script_cannot_carry(monkeypatch):
    plan = _plan("slurm-test.yaml", monkeypatch)
    array = plan.groups[0].array
    bad = ArraySpec(spec=array.spec, job_name=array.job_name, tasks=(ArrayTask(0, "/x\nrm -rf ~", "job.sh"),))
    from diffscale.errors import UserError

    with pytest.raises(UserError, match="holds a line break"):
        render(bad)
    assert array.spec.scheduler is SchedulerKind.SLURM


def test_golden_training_sweep_shares_a_kernel_cache_per_graph(monkeypatch):
    monkeypatch.setattr("sys.executable", "/opt/diffscale-venv/bin/python")
    sweep = d.from_dict({"out": SWEEP_DIR, "base": {"preset": "tiny"}, "axes": {"data.fraction": [0.1, 1.0]},
                         "seeds": [0, 1], "cluster": {"name": str(FIXTURES / "slurm-test.yaml"), "partition": "gpu",
                                                      "gpus_per_node": 1, "time": "00:30:00"}},
                        name="fraction", source="test")
    plan = plan_sweep(sweep, force=True)
    group = plan.groups[0]
    assert len(plan.groups) == 1 and len(group.elements) == 4
    _check("sweep-slurm-train-array", render(group.array))
    _check("sweep-slurm-train-array-element", group.plans[3].script())
    assert len({dict(p.spec.command_env)["TORCHINDUCTOR_CACHE_DIR"] for p in group.plans}) == 1
