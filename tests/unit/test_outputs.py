"""Output conventions: tables that read at 80 columns (the row's name whole, columns wrapped or
left out by priority), and ``--json`` on every verb that reads state, its floats rounded."""

from __future__ import annotations

import io
import json

import pytest

from diffscale.cli import main
from diffscale.config.presets import PRESETS
from diffscale.io.tables import Column, fitted_table

from helpers import fake_run, run_cli, run_in_terminal


@pytest.mark.parametrize("width", [80, 100, 150])
def test_presets_read_at_any_width_with_every_name_whole(width):
    code, shown = run_in_terminal("presets", columns=width)  # a terminal window of that width
    assert code == 0, shown
    lines = shown.splitlines()
    assert max(len(line) for line in lines) <= width
    names = [line.split("│")[1].strip() for line in lines if line.startswith("│") and line.split("│")[1].strip()]
    assert names == list(PRESETS)
    assert ("left out at this width: batch/GPU" in shown) == (width < 90)
    assert "CPU demo (minutes" in shown  # the purpose stays, wrapped


def test_presets_json_lists_every_preset_with_numbers():
    done = run_cli("presets", "--json")
    presets = json.loads(done.stdout)
    assert [p["preset"] for p in presets] == list(PRESETS)
    assert presets[0]["task"] == "images" and isinstance(presets[0]["params"], int) and presets[0]["batch_per_gpu"] > 0


def test_a_table_leaves_out_its_lowest_priority_columns_first():
    from rich.console import Console

    columns = [Column("name", 0, wrap=False), Column("a", 1), Column("b", 3), Column("c", 2)]
    rows = [["a-long-name-never-cut", "x" * 10, "y" * 10, "z" * 10]]
    table = fitted_table("t", columns, rows, 52)
    assert [c.header for c in table.columns] == ["name", "a", "c"] and table.caption == "left out at this width: b"
    console = Console(width=30, record=True, file=io.StringIO())
    console.print(fitted_table("t", columns, rows, 30))
    assert "a-long-name-never-cut" in console.export_text()


def test_status_env_and_sweep_status_answer_in_json(tmp_path, capsys):
    run = fake_run(tmp_path / "run")
    (run / "jobs.json").unlink()  # a run of this machine
    assert main(["status", str(run), "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["jobs"] is None and found["progress"]["step"] == 40 and found["progress"]["finished"] is True
    assert found["progress"]["gpus"]["gpu0_util_pct"] == 90.0 and found["progress"]["trainer"] is None
    assert main(["env", "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert [s["title"] for s in facts["sections"]][:2] == ["Host", "GPUs"]
    done = run_cli("sweep", "run", "--axis", "k=a,b", "--out", str(tmp_path / "sw"), "--", "true", "{k}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert main(["sweep", "status", str(tmp_path / "sw"), "--json"]) == 0
    assert [(e["values"]["k"], e["state"]) for e in json.loads(capsys.readouterr().out)] == [("a", "done"),
                                                                                            ("b", "done")]


def test_plan_json_holds_the_script_ranks_and_checks(tmp_path, capsys):
    assert main(["plan", "--cluster", "purdue-gilbreth", "--nodes", "1", "--gpus-per-node", "2", "--preset", "small",
                 "--account", "lab", "--out", str(tmp_path / "run"), "--json"]) == 0
    [plan] = json.loads(capsys.readouterr().out)
    assert plan["shape"] == "1x2" and plan["world_size"] == 2 and plan["script"].startswith("#!/bin/bash")
    assert [r["local_rank"] for r in plan["ranks"]] == [0, 1] and plan["ok"] is True
    assert {c["status"] for c in plan["checks"]} <= {"pass", "WARN", "unknown"}
    assert main(["plan", "--cluster", "purdue-gilbreth", "--partition", "auto", "--preset", "small", "--json"]) == 2
    assert "error: --json prints the plans of named partitions" in capsys.readouterr().err
