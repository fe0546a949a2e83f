"""Sweeps a new user can trust, on this machine: a sweep directory copied, damaged and read again
(relative run dirs, a damaged state.json rebuilt from the runs, a vanished run reported missing),
text with brackets shown as it is, sweep run passing SIGTERM to its element, the grid's size
refused from the axes, collect's summary of one seed, the report's styles, and the preflight's
per-check override kept for ``--failed``."""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from diffscale.cli import main
from diffscale.errors import UserError
from diffscale.studies import definition as d
from diffscale.studies.plan import plan_sweep
from diffscale.studies.report import _styles
from diffscale.studies.state import read_definition, read_elements
from diffscale.studies.write import write_sweep

from helpers import REPO

SLURM_TEST = REPO / "tests" / "unit" / "cluster" / "fixtures" / "slurm-test.yaml"
# a command element: writes metrics.jsonl (step, loss from its value) in its run directory
WRITER = ("import json, sys\nv = float(sys.argv[1])\nwith open('metrics.jsonl', 'a') as f:\n"
          "    for step in (1, 2):\n        f.write(json.dumps({'step': step, 'loss': v / step}) + '\\n')\n")


def _command_sweep(tmp_path: Path, *axes: str) -> Path:
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    sweep = tmp_path / "sw"
    names = [axis.split("=")[0] for axis in axes]
    argv = ["sweep", "run", *(a for axis in axes for a in ("--axis", axis)), "--out", str(sweep), "--",
            sys.executable, str(script), *(f"{{{n}}}" for n in names)]
    assert main(argv) == 0
    return sweep


def _summary(sweep: Path) -> list[dict[str, str]]:
    with (sweep / "collect-summary.csv").open() as f:
        return list(csv.DictReader(f))


def test_a_copied_damaged_sweep_reads_its_own_runs_and_says_what_it_lost(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sweep = _command_sweep(tmp_path, "v=1,2,3")
    assert [r["run_dir"] for r in json.loads((sweep / "elements.json").read_text())] == ["runs/000", "runs/001",
                                                                                          "runs/002"]
    copy = tmp_path / "copy"
    shutil.copytree(sweep, copy)
    shutil.rmtree(sweep)  # the original is gone: the copy must not read it (nor find nothing)
    (copy / "runs" / "001" / "metrics.jsonl").write_text('{"step": 1, "loss": 7.0}\n')
    assert main(["sweep", "collect", str(copy)]) == 0
    assert [r["final_loss_mean"] for r in _summary(copy)] == ["0.5", "7", "1.5"]
    # damaged state.json: named, kept aside, each state rebuilt from the runs (every command logged exit 0)
    (copy / "state.json").write_text('{"0": {"index": 0, "state": "done"')
    capsys.readouterr()
    assert main(["sweep", "status", str(copy)]) == 0
    out, err = capsys.readouterr()
    assert "state.json is damaged" in err and "kept as state.json.damaged" in err
    assert "0 pending, 0 running, 3 done, 0 failed, 0 stopped, 0 missing" in out
    assert (copy / "state.json.damaged").read_text().startswith('{"0"')
    # a vanished run directory is missing, not done; run makes it again and runs only it
    shutil.rmtree(copy / "runs" / "002")
    assert main(["sweep", "status", str(copy)]) == 0
    assert "2 done, 0 failed, 0 stopped, 1 missing" in capsys.readouterr().out
    assert main(["sweep", "collect", str(copy)]) == 0
    assert "missing: the run directories of element(s) 2 are gone" in capsys.readouterr().out
    assert main(["sweep", "report", str(copy)]) == 0
    assert "<td>missing</td>" in (copy / "report.html").read_text()
    assert main(["sweep", "run", str(copy)]) == 0
    said = capsys.readouterr().out
    assert "element 2's run directory was gone" in said and "2 of 3 element(s) done; running 1 here" in said
    assert (copy / "runs" / "002" / "metrics.jsonl").is_file()


def test_an_old_sweep_with_absolute_run_dirs_reads_the_runs_beside_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sweep = _command_sweep(tmp_path, "v=1,2")
    rows = json.loads((sweep / "elements.json").read_text())
    for row in rows:  # as sweeps were written before: absolute paths of where it was planned
        row["run_dir"] = f"/elsewhere/sw/{row['run_dir']}"
    (sweep / "elements.json").write_text(json.dumps(rows))
    assert [r.run_dir for r in read_elements(sweep)] == [str(sweep / "runs" / "000"), str(sweep / "runs" / "001")]


def test_status_and_collect_show_text_with_brackets_as_it_is(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "fail.py"
    script.write_text("raise SystemExit('RuntimeError: [pair.cc:534] Read error [127.0.0.1]:41234 [/bold]')\n")
    assert main(["sweep", "run", "--axis", "tag=a[red]b[/red],y", "--out", str(tmp_path / "sw"), "--",
                 sys.executable, str(script), "{tag}"]) == 1
    capsys.readouterr()
    assert main(["sweep", "status", str(tmp_path / "sw")]) == 0
    out = capsys.readouterr().out
    assert "a[red]b[/red]" in out and "Read error [127.0.0.1]:41234 [/bold]" in out.replace("\n", " ")
    assert "0 done, 2 failed" in out
    state = json.loads((tmp_path / "sw" / "state.json").read_text())["0"]
    assert state["exit_code"] == 1 and state["reason"].endswith("[127.0.0.1]:41234 [/bold]")


def test_sweep_run_passes_sigterm_to_its_element_and_records_it_stopped(tmp_path):
    script = tmp_path / "slow.py"
    script.write_text("import pathlib, signal, sys, time\n"
                      "signal.signal(signal.SIGTERM, lambda *a: (pathlib.Path('got-term').write_text('yes'), "
                      "sys.exit(85)))\npathlib.Path('started').write_text('yes')\ntime.sleep(600)\n")
    sweep = tmp_path / "sw"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    runner = subprocess.Popen([sys.executable, "-m", "diffscale", "sweep", "run", "--axis", "k=a,b", "--out",
                               str(sweep), "--", sys.executable, str(script), "{k}"], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    started = sweep / "runs" / "000" / "started"
    deadline = time.monotonic() + 120
    while not started.exists() and time.monotonic() < deadline and runner.poll() is None:
        time.sleep(0.1)
    assert started.exists(), runner.communicate()[0]
    runner.send_signal(signal.SIGTERM)
    out, _ = runner.communicate(timeout=120)
    assert runner.returncode == 128 + signal.SIGTERM, out
    assert (sweep / "runs" / "000" / "got-term").read_text() == "yes"  # the element got the signal
    states = json.loads((sweep / "state.json").read_text())
    assert states["0"]["state"] == "stopped" and states["0"]["exit_code"] == 85
    assert "1" not in states or states["1"]["state"] == "pending"  # nothing more was started
    assert not (sweep / "runs" / "001" / "started").exists()


def test_a_grid_too_large_is_refused_from_its_axes_and_a_large_legal_one_plans_its_first_elements(tmp_path,
                                                                                                   capsys):
    values = ",".join(str(i) for i in range(100))
    argv = ["sweep", "plan", "--preset", "tiny", "--axis", f"optim.warmup_steps={values}", "--axis",
            f"train.seed={values}", "--out", str(tmp_path / "sw")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "the first 20 of 10,000 elements shown and planned" in out and "runs/0019" in out
    assert "runs/0020" not in out
    assert main([*argv, "--axis", "optim.lr=1e-4,2e-4"]) == 2
    said = capsys.readouterr().err
    assert "the sweep has 20,000 elements (100 x 100 x 2), more than max_elements (10,000)" in said
    # every value is still checked, though its element is not among the first shown
    assert main([*argv[:5], f"optim.warmup_steps={values},-1", *argv[6:], "--max-elements", "20000"]) == 2
    assert "element 10000 (optim.warmup_steps=-1, train.seed=0): config optim.warmup_steps: is negative" in \
        capsys.readouterr().err


def test_one_seed_has_no_spread_and_each_combination_its_own_style(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sweep = _command_sweep(tmp_path, "v=1,2", "w=a,b")
    assert main(["sweep", "collect", str(sweep)]) == 0
    assert {r["final_loss_sd"] for r in _summary(sweep)} == {""}  # one run per group: no "sd 0"
    styles = _styles(read_elements(sweep), ["v", "w"])
    assert len({(c, s) for c, s, _ in styles.values()}) == 4  # the second axis tells curves apart too
    assert styles[3][2] == "v=2, w=b"


def test_a_cpu_element_needs_no_force_and_a_forced_check_is_kept_for_failed(tmp_path, capsys):
    sweep = d.from_dict({"base": {"preset": "tiny"}, "axes": {"cluster.shape": ["1x2"]}, "out": str(tmp_path / "s"),
                         "cluster": {"name": str(SLURM_TEST), "procs_per_node": 2, "time": "00:20:00",
                                     "mem": "1G"}}, name="t", source="t.yaml")
    with pytest.raises(UserError, match=r"host RAM per node' failed .*: 2 ranks x ~0.6 GiB = 1.2 GiB \(estimated\) > "
                       r"1 GiB per node.* \(cluster.procs_per_node: 1\) and more cluster.nodes, or ask for more memory "
                       r"\(cluster.mem up to 8\); or force this check alone"):
        plan_sweep(sweep)
    forced = d.from_dict({**sweep.raw, "cluster": {**sweep.raw["cluster"], "force": ["Host RAM per node"]}},
                         name="t", source="t.yaml")
    write_sweep(plan_sweep(forced))  # that check alone is forced, and the sweep directory keeps it
    again = d.from_dict(read_definition(tmp_path / "s"), name="s", source=str(tmp_path / "s"))
    assert again.cluster is not None and again.cluster.force == ("Host RAM per node",) and plan_sweep(again).groups
    # without --mem the estimate from the preset passes: ~0.6 GiB a CPU rank of tiny, not a GPU rank's 3
    estimated = d.from_dict({**sweep.raw, "cluster": {k: v for k, v in sweep.raw["cluster"].items() if k != "mem"}},
                            name="t", source="t.yaml")
    plan = plan_sweep(estimated)
    check = next(c for c in plan.groups[0].plans[0].checks if c.name == "host RAM per node")
    assert check.ok and "2 ranks x ~0.6 GiB" in check.detail


def test_out_on_the_command_line_wins_over_the_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.yaml").write_text(json.dumps({"out": str(tmp_path / "from-file"), "axes": {"k": ["a"]},
                                                 "base": {"command": "true {k}"}}))
    assert main(["sweep", "run", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "from-flag")]) == 0
    assert (tmp_path / "from-flag" / "elements.json").is_file() and not (tmp_path / "from-file").exists()
