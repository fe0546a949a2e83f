"""``--partition auto --race N``: the N candidates that finish first (recorded `sbatch --test-only`
answers), raced across partitions under keys unique per partition and shape; the errors of a
bad count; what submit records and status shows of the winner."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
from pathlib import Path

import pytest

from diffscale.cli import main
from diffscale.cluster.jobs.race import claim, owner
from diffscale.cluster.jobs.records import JobState
from diffscale.cluster.jobs.scheduler import Slurm
from diffscale.cluster.planning.partition_auto import compare
from diffscale.cluster.planning.partition_choice import ranked
from diffscale.cluster.planning.partition_race import race_label, raced, raced_plans
from diffscale.cluster.planning.plan import PlanOptions
from diffscale.cluster.planning.usage import rank_usage
from diffscale.cluster.planning.workload import UserCommand
from diffscale.cluster.probe.result import load
from diffscale.cluster.scripts.jobspec import job_name
from diffscale.errors import UserError

from cluster_fixtures import FIXTURES, RECORDED_AT, fixture_profile, probe_file, recorded_start

LAB = str(FIXTURES / "lab-l40s-h200.yaml")
# Ranked by finish with these rates (the H200s free at 16:30, the L40S nodes now): 16 L40S 12:16,
# 8 L40S 14:29, 8 H200 17:30, 4 L40S 18:55. The table lists them l40s 1x4, 2x4, 4x4, h200 1x8.
BEST_FIRST = ["l40s-4x4", "l40s-2x4", "h200-1x8", "l40s-1x4"]


def _probes(tmp_path: Path) -> list[str]:
    h200 = probe_file(tmp_path / "h200.json", main_gib=5.1, workers=2, worker_gib=7.3, gpu="NVIDIA H200",
                      steps_per_s=40.0)
    l40s = probe_file(tmp_path / "l40s.json", main_gib=5.1, workers=2, worker_gib=7.3, gpu="NVIDIA L40S",
                      steps_per_s=8.7)
    return ["--probe", str(h200), "--probe", str(l40s)]


def _found(tmp_path: Path, run_dir: str = "/runs/r"):
    files = _probes(tmp_path)[1::2]
    user = UserCommand(("python", "train.py"), run_dir, "/opt/venv/bin/python",
                       usage=rank_usage([(load(Path(f)), f) for f in files]))
    return compare(fixture_profile("lab-l40s-h200"), user, PlanOptions(signal=None), recorded_start, RECORDED_AT,
                   total_steps=1_000_000)


def test_the_race_takes_the_n_earliest_finishes_not_the_table_order(tmp_path):
    found = _found(tmp_path)
    assert [race_label(c.plan.partition.name, c.plan.shape.label) for c in found] == [
        "l40s-1x4", "l40s-2x4", "l40s-4x4", "h200-1x8"]
    best = ranked(found)
    assert [race_label(c.plan.partition.name, c.plan.shape.label) for c in best] == BEST_FIRST
    assert [c.finish for c in best] == sorted(c.finish for c in best)
    chosen = raced(best, 3)
    assert [c.plan.partition.name for c in chosen] == ["l40s", "l40s", "h200"]
    plans = raced_plans(chosen)
    keys = [p.spec.race.key for p in plans]
    names = [p.spec.job_name for p in plans]
    assert keys == BEST_FIRST[:3]
    assert names == [job_name("/runs/r", k) for k in keys] and len(set(names)) == 3
    assert [p.spec.script_file for p in plans] == [f"job-{k}.slurm.sh" for k in keys]
    for plan, name in zip(plans, names, strict=True):
        assert set(plan.spec.race.rivals) == set(names) - {name}
    h200 = plans[2].script()
    assert "#SBATCH --partition=h200" in h200 and f"#SBATCH --job-name={names[2]}" in h200
    assert "ln -s h200-1x8 \"$RUN_DIR/race.claim\"" in h200
    assert f"scancel --name={names[0]} || true" in h200 and f"scancel --name={names[1]} || true" in h200


def test_race_keys_are_unique_per_partition_and_shape_and_safe_file_names(tmp_path):
    keys = [race_label(p, "1x4") for p in ("a100", "l40s", "gpu.a100", "gpu_a100", "gpu a100", "h200:big", "..")]
    assert len(set(keys)) == len(keys)  # the same shape in two partitions, and names that clean to one
    assert keys[:2] == ["a100-1x4", "l40s-1x4"]  # plain names stay readable
    for key in keys:
        assert re.fullmatch(r"[A-Za-z0-9]+(-[A-Za-z0-9]+)*", key), key
        assert re.fullmatch(r"ds-[a-z0-9-]+-[0-9a-f]{6}-[A-Za-z0-9-]+", job_name("/runs/r", key))
    assert claim(tmp_path, keys[2]).won and owner(tmp_path) == keys[2] and not claim(tmp_path, keys[3]).won


def test_too_few_candidates_for_the_count_is_one_clear_error(tmp_path):
    best = ranked(_found(tmp_path))
    with pytest.raises(UserError) as err:
        raced(best, 5)
    assert err.value.message == ("--race 5 is more than the 4 candidates that can be raced (those with no problem "
                                 "in the note column above) -- pass --race 4 or less")
    with pytest.raises(UserError, match=r"^--race 2: only one candidate can be raced \(l40s-4x4\); a race needs two"):
        raced(best[:1], 2)


def _shifted(workdir):
    # the recorded answers as if recorded now: the CLI compares them with the real clock
    now = dt.datetime.now().replace(microsecond=0)
    return lambda plan: recorded_start(plan, shift_to=now)


def _auto(tmp_path: Path, verb: str, *race: str) -> list[str]:
    return [verb, "--cluster", LAB, "--partition", "auto", *race, "--total-steps", "1000000", *_probes(tmp_path),
            "--out", str(tmp_path / "run"), "--", "python", "train.py"]


def _row(out: str, partition: str, shape: str) -> str:
    return next(ln for ln in out.splitlines() if re.match(rf"[│| ]*{partition}\s*[│|]\s*{shape}\s", ln))


def test_plan_marks_the_raced_candidates_in_the_table(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("diffscale.cluster.planning.partition_auto.slurm_starts", _shifted)
    assert main(_auto(tmp_path, "plan", "--race", "3")) == 0
    out = capsys.readouterr().out
    assert "<- race 1" in _row(out, "l40s", "4x4") and "<- race 2" in _row(out, "l40s", "2x4")
    assert "<- race 3" in _row(out, "h200", "1x8") and "<- race" not in _row(out, "l40s", "1x4")
    assert ("race: l40s-4x4 (partition l40s, 4 node(s) x 4), l40s-2x4 (partition l40s, 2 node(s) x 4), "
            "h200-1x8 (partition h200, 1 node(s) x 8); the first to start owns the run and cancels the others") in out
    assert "pick:" not in out and not (tmp_path / "run").exists()


class _Recording(Slurm):
    """sbatch stand-in: numbers the jobs, answers states from ``now_states``."""

    def __init__(self) -> None:
        self.scripts: list[str] = []
        self.now_states: dict[str, tuple[str, bool]] = {}

    def submit(self, script, run_dir, *, after=None, started=False) -> str:
        self.scripts.append(script.name)
        return str(100 + len(self.scripts))

    def states(self, job_ids):
        out = []
        for job_id in job_ids:
            state, active = self.now_states.get(job_id, ("PENDING", True))
            out.append(JobState(job_id, state, active=active))
        return out


def test_submit_races_the_best_candidates_and_status_names_the_winner(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("diffscale.cluster.planning.partition_auto.slurm_starts", _shifted)
    sched = _Recording()
    monkeypatch.setattr("diffscale.cluster.jobs.scheduler.for_kind", lambda kind: sched)
    run = tmp_path / "run"
    assert main(_auto(tmp_path, "submit", "--race", "3")) == 0
    out = capsys.readouterr().out
    assert "race between l40s-4x4, l40s-2x4, h200-1x8: the first to start owns the run" in out
    assert sched.scripts == [f"job-{k}.slurm.sh" for k in BEST_FIRST[:3]]
    sub = json.loads((run / "jobs.json").read_text())["submissions"][-1]
    assert sub["race"] == BEST_FIRST[:3]
    assert [(j["job_id"], j["partition"], j["shape"], j["race_key"]) for j in sub["jobs"]] == [
        ("101", "l40s", "4x4", "l40s-4x4"), ("102", "l40s", "2x4", "l40s-2x4"), ("103", "h200", "1x8", "h200-1x8")]
    names = [j["name"] for j in sub["jobs"]]
    assert len(set(names)) == 3 and all(n.endswith(k) for n, k in zip(names, BEST_FIRST, strict=False))
    h200 = (run / "job-h200-1x8.slurm.sh").read_text()
    assert "#SBATCH --partition=h200" in h200 and f"scancel --name={names[0]} || true" in h200
    # the H200 job started first: it claimed the run, the L40S jobs were cancelled by name
    os.symlink("h200-1x8", run / "race.claim")
    sched.now_states = {"101": ("FAILED", False), "102": ("CANCELLED", False), "103": ("RUNNING", True)}
    assert main(["status", str(run)]) == 0
    out = capsys.readouterr().out
    assert "race: h200-1x8 (partition h200, shape 1x8) owns the run" in out
    assert "lost the race to h200-1x8 (partition h200, shape 1x8)" in out
    assert re.search(r"101\s*[│|]\s*l40s-4x4\s*[│|].*CANCELLED", out), out


@pytest.mark.parametrize("verb", ["plan", "submit"])
@pytest.mark.parametrize("race,message", [
    (["--race", "1"], "--race 1 is out of range: a race needs at least 2 candidates -- pass --race 2 or more"),
    (["--race", "-3"], "--race -3 is out of range: a race needs at least 2 candidates"),
    (["--race", "5"], "--race 5 is more than the 4 candidates that can be raced (those with no problem in the note "
                      "column above) -- pass --race 4 or less"),
    (["--race", "1x4,2x4"], "--race 1x4,2x4 lists shapes of one partition, but --partition auto races its best "
                            "candidates (each its own partition and shape) -- pass a count with --partition auto"),
])
def test_bad_race_counts_are_one_line_and_submit_nothing(tmp_path, capsys, monkeypatch, verb, race, message):
    monkeypatch.setattr("diffscale.cluster.planning.partition_auto.slurm_starts", _shifted)
    sched = _Recording()
    monkeypatch.setattr("diffscale.cluster.jobs.scheduler.for_kind", lambda kind: sched)
    assert main(_auto(tmp_path, verb, *race)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert sched.scripts == [] and not (tmp_path / "run").exists()


def test_a_count_without_partition_auto_names_both_forms(tmp_path, capsys):
    assert main(["plan", "--cluster", LAB, "--race", "2", "--out", str(tmp_path / "r"), "--", "python", "t.py"]) == 2
    assert ("--race 2 counts --partition auto's candidates, but --partition auto is not given -- add --partition "
            "auto to race the candidates that finish first, or list shapes of one partition: --race 1x4,2x2"
            ) in capsys.readouterr().err
