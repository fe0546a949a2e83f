"""Sweeps: definition, expansion, plan, a local sweep run end to end with status and collect, and
the data fraction a sweep axis varies."""

from __future__ import annotations

import csv
import json

import pytest
import torch

from diffscale.cli import main
from diffscale.data.device_loader import DataPosition, DeviceBatcher
from diffscale.errors import UserError
from diffscale.studies import definition as d
from diffscale.studies.expand import expand
from diffscale.studies.plan import plan_sweep

from helpers import MICRO, REPO, run_cli

SLURM_TEST = REPO / "tests" / "unit" / "cluster" / "fixtures" / "slurm-test.yaml"
SGE_TEST = REPO / "tests" / "unit" / "cluster" / "fixtures" / "sge-two-host.yaml"


def _sweep(**raw):
    return d.from_dict(raw, name="t", source="test")


def test_axes_expand_as_a_product_with_zip_groups_and_seeds_last(tmp_path):
    sweep = _sweep(base={"preset": "tiny"}, axes={"optim.lr": [1e-4, 3e-4]},
                   zip=[{"train.batch_per_gpu": [8, 16], "optim.warmup_steps": [1, 2]}], seeds=[0, 1])
    elements = expand(sweep, tmp_path)
    assert len(elements) == 8
    assert elements[0].values == (("optim.lr", "0.0001"), ("train.seed", "0"), ("train.batch_per_gpu", "8"),
                                  ("optim.warmup_steps", "1"))
    assert [e.value("train.batch_per_gpu") + "/" + e.value("optim.warmup_steps") for e in elements[:4]] == \
        ["8/1", "16/2", "8/1", "16/2"]
    assert elements[5].run_dir == str(tmp_path / "runs" / "005")
    assert elements[5].overrides == ("optim.lr=0.0003", "train.seed=0", "train.batch_per_gpu=16",
                                     "optim.warmup_steps=2")


def test_a_command_gets_each_value_literally_and_its_own_run_dir(tmp_path):
    hostile = "it's $(rm -rf /) `x` a b"
    sweep = _sweep(base={"command": ["python", "t.py", "--name={name}", "--out", "{run_dir}", "{{literal}}", "{seed}"]},
                   axes={"name": [hostile, "plain"]}, seeds=[3])
    elements = expand(sweep, tmp_path)
    assert elements[0].command(sweep.command) == ("python", "t.py", f"--name={hostile}", "--out",
                                                  str(tmp_path / "runs" / "000"), "{literal}", "3")
    assert elements[1].value("seed") == "3"


@pytest.mark.parametrize("raw,says", [
    ({"base": {"preset": "tiny"}, "zip": [{"optim.lr": [1, 2], "train.seed": [1]}]},
     "zipped axes have different lengths (optim.lr has 2, train.seed has 1)"),
    ({"base": {"command": "python t.py {a} {b}"}, "axes": {"a": [1]}}, "placeholder {b} of the command has no value"),
    ({"base": {"preset": "tiny"}, "axes": {"lr": [1]}}, "axis lr is neither a config field"),
    ({"base": {"preset": "tiny"}, "axes": {"optim.lr": [1, 1]}}, "axis optim.lr lists a value twice"),
    ({"base": {"preset": "tiny"}, "axes": {"train.seed": [1]}, "seeds": [1, 2]}, "axis train.seed is given twice"),
    ({"base": {"preset": "tiny", "command": "x"}}, "both a user command and a diffscale base"),
    ({"base": {"preset": "tiny"}, "cluster": {"name": "x", "parallel": -1}}, "cluster.parallel -1 is negative"),
])
def test_bad_definitions_are_refused_naming_the_field(raw, says):
    with pytest.raises(UserError) as err:
        _sweep(**raw)
    assert says in err.value.message


def test_a_value_failing_validation_is_named_with_its_element(tmp_path):
    sweep = _sweep(out=str(tmp_path / "s"), base={"preset": "tiny"}, axes={"train.steps": [10, -1]})
    with pytest.raises(UserError) as err:
        plan_sweep(sweep)
    assert err.value.message.startswith("element 1 (train.steps=-1): config train.steps")


def test_the_array_limit_is_refused_with_the_fix(tmp_path):
    sweep = _sweep(out=str(tmp_path / "s"), base={"preset": "tiny"}, seeds=[0, 1, 2],
                   cluster={"name": str(SLURM_TEST), "procs_per_node": 1, "max_array": 2})
    with pytest.raises(UserError) as err:
        plan_sweep(sweep)
    assert err.value.message == ("job shape cpu-1x1 has 3 elements, more than one array may hold (2, MaxArraySize in "
                                 "slurm.conf) -- split the sweep (fewer values per axis, or one sweep file per part), "
                                 "or set cluster.max_array to the cluster's limit if it is higher")


@pytest.mark.parametrize("profile,task_var", [(SLURM_TEST, "SLURM_ARRAY_TASK_ID"), (SGE_TEST, "SGE_TASK_ID")])
def test_one_array_per_job_shape_each_element_a_normal_job_script(tmp_path, profile, task_var):
    sweep = _sweep(out=str(tmp_path / "s"), base={"preset": "tiny"}, axes={"cluster.shape": ["1x1", "1x2"]},
                   seeds=[0, 1], cluster={"name": str(profile), "procs_per_node": 1, "parallel": 1, "cpus_per_task": 1,
                                          "time": "00:20:00"})
    plan = plan_sweep(sweep, force=True)
    assert [g.label.split("-", 1)[1] for g in plan.groups] == ["1x1", "1x2"]
    assert [[e.index for e in g.elements] for g in plan.groups] == [[0, 1], [2, 3]]
    from diffscale.studies.arrays import render

    script = render(plan.groups[1].array)
    assert f"case \"${task_var}\" in" in script
    assert str(tmp_path / "s" / "runs" / "003") in script
    element_script = plan.groups[1].plans[0].script()
    assert "--resume auto" in element_script and "runs/002/config.yaml" in element_script
    caches = {dict(p.spec.command_env)["TORCHINDUCTOR_CACHE_DIR"] for g in plan.groups for p in g.plans}
    assert len(caches) == 2  # one kernel cache per world size: the seeds share theirs


def test_sweep_plan_prints_the_runs_the_array_script_and_the_preflight(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = main(["sweep", "plan", "--preset", "tiny", "--axis", "optim.lr=1e-4,3e-4", "--cluster", str(SLURM_TEST),
                 "--procs-per-node", "1", "--parallel", "2", "--out", str(tmp_path / "sw")])
    out = capsys.readouterr().out
    assert code == 0
    assert "#SBATCH --array=0-1%2" in out and "preflight: slurm-test / cpu, shape 1x1" in out
    assert not (tmp_path / "sw").exists()  # plan writes nothing


def test_data_fraction_is_one_seeded_nested_subset_whatever_the_training_seed():
    def drawn(fraction, seed, steps=12, position=None):
        b = DeviceBatcher(100, 5, seed, torch.device("cpu"), position)
        b.restrict(fraction, subset_seed=0)
        return b, torch.cat([b.next_indices() for _ in range(steps)])

    _, tenth = drawn(0.1, seed=0)
    _, other_seed = drawn(0.1, seed=7)
    _, half = drawn(0.5, seed=0, steps=40)
    assert set(tenth.tolist()) == set(other_seed.tolist()) and len(set(tenth.tolist())) == 10
    assert set(tenth.tolist()) <= set(half.tolist()) and len(set(half.tolist())) == 50
    whole, first = drawn(0.25, seed=3, steps=7)
    _, resumed = drawn(0.25, seed=3, steps=5, position=DataPosition(**whole.position.to_dict()))
    _, straight = drawn(0.25, seed=3, steps=12)
    assert torch.equal(torch.cat([first, resumed]), straight)  # a resume draws what an uninterrupted run does
    with pytest.raises(UserError, match="data.fraction 0.01 keeps 1 of 100"):
        drawn(0.01, seed=0)


def test_a_local_sweep_runs_every_element_then_status_and_collect(tmp_path):
    definition = {"name": "micro", "out": str(tmp_path / "sw"),
                  "base": {"preset": "tiny", "set": [*MICRO, "train.steps=4", "runtime.device=cpu"]},
                  "axes": {"data.fraction": [0.5, 1.0]}, "seeds": [0, 1]}
    (tmp_path / "micro.yaml").write_text(json.dumps(definition))
    done = run_cli("sweep", "run", str(tmp_path / "micro.yaml"), cwd=tmp_path, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "all 4 element(s) done" in done.stdout
    states = json.loads((tmp_path / "sw" / "state.json").read_text())
    assert [states[str(i)]["state"] for i in range(4)] == ["done"] * 4
    again = run_cli("sweep", "run", str(tmp_path / "sw"), cwd=tmp_path)
    assert "4 of 4 element(s) done; running 0 here" in again.stdout
    status = run_cli("sweep", "status", str(tmp_path / "sw"), cwd=tmp_path)
    assert "0 pending, 0 running, 4 done, 0 failed" in status.stdout
    collected = run_cli("sweep", "collect", str(tmp_path / "sw"), cwd=tmp_path)
    assert collected.returncode == 0, collected.stderr
    with (tmp_path / "sw" / "collect-summary.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [(r["data.fraction"], r["seeds"]) for r in rows] == [("0.5", "2"), ("1.0", "2")]
    assert all(float(r["final_loss_mean"]) > 0 for r in rows)
    assert (tmp_path / "sw" / "collect.png").stat().st_size > 0


def test_a_failed_element_is_reported_with_its_reason(tmp_path):
    script = tmp_path / "t.py"
    script.write_text("import sys, pathlib\nv = sys.argv[1]\npathlib.Path('seen').write_text(v)\n"
                      "if v == 'bad' and not pathlib.Path('/nonexistent').exists() and len(sys.argv) < 3:\n"
                      "    raise SystemExit('refused value ' + v)\n")
    done = run_cli("sweep", "run", "--axis", "v=good,bad,it's $(x)", "--out", str(tmp_path / "sw"), "--",
                   "python3", str(script), "{v}", cwd=tmp_path)
    assert done.returncode == 1
    assert (tmp_path / "sw" / "runs" / "002" / "seen").read_text() == "it's $(x)"
    status = run_cli("sweep", "status", str(tmp_path / "sw"), cwd=tmp_path)
    assert "2 done, 1 failed" in status.stdout
    assert json.loads((tmp_path / "sw" / "state.json").read_text())["1"]["reason"] == "refused value bad"


def test_sweep_run_says_which_element_started_and_where_running_ones_stand(tmp_path):
    """Each element's start (with where its output goes) and, every --progress-every seconds, its
    step from its metrics.jsonl, on stderr; a command with no records yet shows how long it has run."""
    script = tmp_path / "t.py"
    script.write_text("import json, time, pathlib\n"
                      "pathlib.Path('metrics.jsonl').write_text(json.dumps({'step': 7, 'total_steps': 40}) + '\\n')\n"
                      "time.sleep(3)\n")
    done = run_cli("sweep", "run", "--progress-every", "0.2", "--axis", "k=a,b", "--out", str(tmp_path / "sw"),
                   "--", "python3", str(script), "{k}", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    log = tmp_path / "sw" / "runs" / "001" / "logs" / "local.out"
    assert f"element 1 (k=b): started; its output in {log}" in done.stderr
    assert "sweep sweep: 0 of 2 done; element 0: step 7/40" in done.stderr
    assert "sweep sweep: 1 of 2 done; element 1: step 7/40" in done.stderr
    assert "element 1 (k=b): done" in done.stdout  # the end of each element stays on stdout
    refused = run_cli("sweep", "run", "--progress-every", "-1", "--axis", "k=a", "--out", str(tmp_path / "x"),
                      "--", "true", cwd=tmp_path)
    assert refused.returncode == 2 and "not a number of seconds >= 0" in refused.stderr


def test_one_element_per_gpu_each_sees_only_its_own(tmp_path):
    done = run_cli("sweep", "run", "--gpus", "0,1", "--axis", "k=a,b,c,d", "--out", str(tmp_path / "sw"), "--",
                   "python3", "-c", "import os, sys; open('gpu', 'w').write(os.environ['CUDA_VISIBLE_DEVICES'])",
                   "{k}", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "running 4 here, 2 at a time" in done.stdout
    seen = [(tmp_path / "sw" / "runs" / f"{i:03d}" / "gpu").read_text() for i in range(4)]
    assert sorted(set(seen)) == ["0", "1"]


def test_a_sweep_directory_is_read_back_and_another_sweep_is_not_written_over_it(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    command = ["--axis", "k=a,b", "--out", str(tmp_path / "sw"), "--", "true", "{k}"]
    assert main(["sweep", "run", *command]) == 0
    assert main(["sweep", "plan", str(tmp_path / "sw")]) == 0
    assert "runs/001" in capsys.readouterr().out
    assert main(["sweep", "run", "--axis", "k=a,b,c", *command[2:]]) == 2
    assert f"{tmp_path / 'sw'} holds another sweep" in capsys.readouterr().err
    assert not (tmp_path / "sw" / "runs" / "002").exists()
