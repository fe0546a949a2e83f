"""The seams new tasks rely on: one config precedence, checkpoints of the previous format,
verbs that never vanish, and a loop that reaches the task only through its protocol."""

import json
import re
from pathlib import Path

import pytest
import yaml

from diffscale.cli import build_parser, main
from diffscale.config import ConfigSources, resolve_config
from diffscale.errors import UserError
from diffscale.runtime import checkpoint as ckpt

from helpers import REPO, micro_args


def test_config_precedence_is_preset_then_file_then_flags_then_set_then_fixed(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"preset": "small", "train": {"steps": 11, "seed": 5},
                                      "data": {"source": "builtin:digits"}, "runtime": {"device": "cuda"}}))
    cfg = resolve_config(ConfigSources(config_file=config, data="builtin:glyphs", device="cpu",
                                       overrides=["train.seed=7", "runtime.device=mps"],
                                       fixed={"train": {"seed": 9}}))
    assert cfg.preset == "small" and cfg.model.sample_size == 28  # the file's preset
    assert cfg.train.steps == 11  # the file over the preset
    assert cfg.data.source == "builtin:glyphs"  # --data over the file
    assert cfg.runtime.device.value == "mps"  # --set over --device
    assert cfg.train.seed == 9  # what the verb fixes comes last
    assert resolve_config(ConfigSources(preset="tiny", config_file=config)).preset == "tiny"  # --preset names the base


def test_every_verb_resolves_configs_the_same_way():
    """train, plan/submit and the bench worker all build configs through resolve_config."""
    sources = {path: path.read_text() for path in (REPO / "src/diffscale").rglob("*.py")}
    callers = sorted(str(p.relative_to(REPO)) for p, text in sources.items() if "resolve_config(" in text)
    assert {"src/diffscale/cli.py", "src/diffscale/cluster/cli.py", "src/diffscale/bench/worker.py"} <= set(callers)
    for path, text in sources.items():  # nobody merges presets by hand any more
        assert not re.search(r"merge\(get_preset\(", text), path


def test_a_task_change_in_a_config_file_starts_from_that_tasks_network(tmp_path):
    config = tmp_path / "field.yaml"
    config.write_text(yaml.safe_dump({"task": "policy", "model": {"obs_horizon": 3}}))
    cfg = resolve_config(ConfigSources(config_file=config))
    assert cfg.task == "policy" and cfg.model.obs_horizon == 3 and cfg.model.pred_horizon == 16
    with pytest.raises(UserError, match=r"config task: 'imagse' is not one of images, fields, policy "
                                        r"\(did you mean 'images'\?\)"):
        resolve_config(ConfigSources(overrides=["task=imagse"]))


def _as_format_1(checkpoint: Path) -> None:
    """Rewrite a checkpoint as the format-1 writer left it: ``format`` instead of ``version``,
    no task.safetensors, the manifest over the remaining files."""
    state = json.loads((checkpoint / "state.json").read_text())
    state["format"] = 1
    del state["version"]
    (checkpoint / "state.json").write_text(json.dumps(state, indent=1, sort_keys=True))
    (checkpoint / "task.safetensors").unlink()
    files = {p.name: {"sha256": ckpt._sha256(p), "bytes": p.stat().st_size}
             for p in sorted(checkpoint.iterdir()) if p.name != "manifest.json"}
    (checkpoint / "manifest.json").write_text(json.dumps({"format": 1, "step": state["step"], "files": files}))


def test_a_format_1_checkpoint_loads_and_the_run_resumes_from_it(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--out", str(run), "--max-steps", "4", *micro_args(steps=6)]) == 0
    newest = ckpt.list_checkpoints(run)[-1]
    _as_format_1(newest)
    state = ckpt.load_checkpoint(newest)
    assert state.meta.version == 1 and state.task == {} and state.meta.signature["task"] == "images"
    assert state.meta.data_position["offset"] > 0 and state.meta.world_size == 1
    assert main(["train", "--out", str(run), "--resume", "auto", *micro_args(steps=6)]) == 0
    assert "resumed from step 4" in capsys.readouterr().out
    assert ckpt.load_checkpoint(ckpt.list_checkpoints(run)[-1]).meta.version == ckpt.FORMAT_VERSION


def test_a_checkpoint_from_a_newer_format_is_skipped_with_the_reason(tmp_path):
    run = tmp_path / "run"
    assert main(["train", "--out", str(run), *micro_args(steps=4)]) == 0
    newest = ckpt.list_checkpoints(run)[-1]
    state = json.loads((newest / "state.json").read_text())
    state["version"] = 99
    (newest / "state.json").write_text(json.dumps(state))
    manifest = json.loads((newest / "manifest.json").read_text())
    path = newest / "state.json"
    manifest["files"]["state.json"] = {"sha256": ckpt._sha256(path), "bytes": path.stat().st_size}
    (newest / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ckpt.CorruptCheckpoint, match="format 99 is newer than this diffscale reads"):
        ckpt.load_checkpoint(newest)


def test_every_verb_is_registered():
    parser = build_parser()
    verbs = set(parser._subparsers._group_actions[0].choices)  # argparse keeps them here
    assert {"train", "sample", "export", "eval", "presets", "plan", "submit", "status", "logs", "cancel", "bench",
            "doctor", "cluster"} <= verbs


def test_nothing_outside_tasks_asks_which_task_it_is():
    for path in (REPO / "src/diffscale").rglob("*.py"):
        if "tasks" in path.parts or path.parent.name == "config":
            continue
        text = path.read_text()
        assert not re.search(r"\.task\s*==|task\s*==\s*[\"']", text), path
        assert "task.images" not in text and "clean_images" not in text and "network.unet" not in text, path


def test_no_module_over_400_lines_and_no_function_over_60():
    """A longer module or function is a sign it owns two concerns: split it where it reads better."""
    import ast

    too_long = []
    for path in (REPO / "src/diffscale").rglob("*.py"):
        text = path.read_text()
        if len(text.splitlines()) > 400:
            too_long.append(f"{path.name}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60:
                too_long.append(f"{path.name}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert not too_long
