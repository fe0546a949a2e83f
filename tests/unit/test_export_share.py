"""Exported runs others can load: every file readable as the umask allows (the group's too), a
model card the Hugging Face Hub lists (library, pipeline tag, licence, tags) whose loading code
runs as written, and ``--push-to-hub`` through huggingface_hub against a local stand-in for the
Hub's HTTP API (no network here), whose received files load."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from diffscale.cli import main

from helpers import REPO, micro_args, run_cli
from hub_standin import NAMESPACE, HubStandIn

FIELDS = ["--preset", "field-icon", "--set", "data.source=builtin:fields:256", "--set", "model.hidden=32",
          "--set", "model.depth=1", "--set", "model.embed_dim=16", "--set", "train.steps=4",
          "--set", "train.log_every=2", "--set", "train.sample_count=8", "--set", "train.sample_steps=3"]
POLICY = ["--preset", "policy-tiny", "--set", "model.down_dims=[16,32]", "--set", "model.step_embed_dim=16",
          "--set", "train.batch_per_gpu=16", "--set", "train.log_every=2", "--set", "train.checkpoint_every=2",
          "--set", "train.sample_count=4", "--set", "train.sample_steps=3", "--set", "data.max_items=20",
          "--set", "train.steps=4"]
TASKS = ("images", "fields", "policy")
LISTED = {  # library_name, pipeline_tag (None: left out), a tag
    "images": ("diffusers", "unconditional-image-generation", "diffusers:DDPMPipeline"),
    "fields": ("diffscale", None, "ensemble-forecasting"),
    "policy": ("diffscale", "robotics", "diffusion-policy"),
}
CHECKS = {  # appended to each card's loading code: what it loaded samples as it says
    "images": "assert len(images) == 4 and images[0].size == (8, 8); print('loaded', len(images))",
    "fields": "assert tuple(ensembles.shape) == (4, 16, 256); print('loaded', tuple(ensembles.shape))",
    "policy": "assert tuple(actions.shape) == (1, 16, 2); print('loaded', tuple(actions.shape))",
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """A trained micro run of each task."""
    root = tmp_path_factory.mktemp("runs")
    args = {"images": micro_args(steps=4), "fields": FIELDS, "policy": POLICY}
    for task in TASKS:
        assert main(["train", "--out", str(root / task), *args[task]]) == 0
    return {task: root / task for task in TASKS}


def _card(folder: Path) -> tuple[dict, str, str]:
    """(front matter, the whole card, the Python of its loading section)."""
    text = (folder / "README.md").read_text()
    head = re.match(r"---\n(.*?)\n---\n", text, re.S)
    code = re.search(r"```python\n(.*?)```", text, re.S)
    assert head and code, text
    return yaml.safe_load(head.group(1)), text, code.group(1)


def _run_python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=300)


@pytest.mark.parametrize("mask", [0o022, 0o002])
@pytest.mark.parametrize("task", TASKS)
def test_every_exported_file_has_the_mode_the_umask_gives(task, mask, runs, tmp_path, capsys):
    out = tmp_path / "export"
    before = os.umask(mask)
    try:
        assert main(["export", str(runs[task]), "--diffusers", str(out)]) == 0
    finally:
        os.umask(before)
    paths = [out, *out.rglob("*")]
    assert any(p.suffix == ".safetensors" for p in paths)  # the weights (written 0600 by safetensors) are among them
    modes = {str(p.relative_to(out)): oct(p.stat().st_mode & 0o777) for p in paths}
    wanted = {str(p.relative_to(out)): oct((0o777 if p.is_dir() else 0o666) & ~mask) for p in paths}
    assert modes == wanted


def test_checkpoint_files_have_the_mode_the_umask_gives(tmp_path, capsys):
    """A run folder shared with a group: its weights are as readable as its config."""
    run = tmp_path / "run"
    before = os.umask(0o002)
    try:
        assert main(["train", "--out", str(run), *micro_args(steps=2)]) == 0
    finally:
        os.umask(before)
    files = [p for p in (run / "checkpoints").rglob("*") if p.is_file()]
    assert any(p.name == "model.safetensors" for p in files)
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in files} == {p.name: oct(0o664) for p in files}


@pytest.mark.parametrize("task", TASKS)
def test_the_card_lists_the_model_and_its_loading_code_runs_as_written(task, runs, tmp_path, capsys):
    out = tmp_path / "export"
    assert main(["export", str(runs[task]), "--diffusers", str(out), "--license", "apache-2.0"]) == 0
    meta, text, code = _card(out)
    library, pipeline_tag, tag = LISTED[task]
    assert meta["library_name"] == library and meta.get("pipeline_tag") == pipeline_tag
    assert meta["license"] == "apache-2.0" and tag in meta["tags"] and "diffscale" in meta["tags"]
    assert f"| data | `{yaml.safe_load((runs[task] / 'config.yaml').read_text())['data']['source']}` |" in text
    assert code.startswith("folder = 'export'  # the path of this folder\n") and str(tmp_path) not in text
    ran = _run_python(code + CHECKS[task], cwd=tmp_path)  # beside the export: the card names no absolute path
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith("loaded")


def test_a_card_without_a_licence_says_so_and_shows_the_newest_evaluation(runs, tmp_path, capsys):
    assert main(["eval", str(runs["fields"]), "--count", "2", "--steps", "2", "--json"]) == 0
    out = tmp_path / "export"
    assert main(["export", str(runs["fields"]), "--diffusers", str(out)]) == 0
    meta, text, _ = _card(out)
    assert "license" not in meta and "pipeline_tag" not in meta
    assert "| licence | licence not stated: ask the authors before reusing the weights |" in text
    assert "Evaluation (`diffscale eval`, step 4, 2 sampling steps):" in text and "| crps |" in text


# ----------------------------------------------------------------------------- the Hub (a local stand-in)

def _hub_env(hub: HubStandIn, home: Path, token: str | None) -> dict[str, str]:
    """huggingface_hub pointed at the stand-in, with a Hugging Face home of its own (no stored login)."""
    env = {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(home), "HF_HUB_DISABLE_TELEMETRY": "1", "HF_TOKEN": token or ""}
    env.pop("HF_HUB_OFFLINE", None)
    return env


@pytest.mark.parametrize("task", TASKS)
def test_push_to_hub_uploads_a_folder_that_loads(task, runs, tmp_path):
    repo = f"lab/{task}-model"
    with HubStandIn("hf_write") as hub:
        done = run_cli("export", str(runs[task]), "--diffusers", str(tmp_path / "local"), "--push-to-hub", repo,
                       "--private", "--license", "mit", env=_hub_env(hub, tmp_path / "hf", "hf_write"))
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[-1] == f"pushed to {hub.endpoint}/{repo}"
    pushed = hub.repos[repo]
    assert pushed.private and pushed.commits == [f"diffscale export of {task} at step 4"]
    local = {str(p.relative_to(tmp_path / "local")) for p in (tmp_path / "local").rglob("*") if p.is_file()}
    assert set(pushed.files) == local  # every file of the export went up
    assert hub.metadata[0]["library_name"] == LISTED[task][0] and hub.metadata[0]["license"] == "mit"
    received = pushed.write_to(tmp_path / "received")
    _, text, code = _card(received)
    assert str(tmp_path) not in text  # the Hub's card names no local path
    lines = code.splitlines(keepends=True)
    where = "".join(line for line in lines if "folder =" in line or "snapshot_download" in line)
    if LISTED[task][0] == "diffusers":  # diffusers takes the repo id itself
        assert where == f"folder = {repo!r}  # or the path of a downloaded copy\n"
    else:
        assert where == f"from huggingface_hub import snapshot_download\nfolder = snapshot_download({repo!r})\n"
    # the card's code, with the download replaced by the files the stand-in received
    rest = "".join(line for line in lines if line not in where)
    ran = _run_python(f"folder = {str(received)!r}\n" + rest + CHECKS[task], cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr


def test_push_to_hub_alone_takes_the_token_file_and_a_name_without_owner(runs, tmp_path):
    (tmp_path / "token").write_text("hf_from_file\n")
    with HubStandIn("hf_from_file") as hub:
        done = run_cli("export", str(runs["fields"]), "--push-to-hub", "fields-model", "--token-file",
                       str(tmp_path / "token"), env=_hub_env(hub, tmp_path / "hf", None))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == f"pushed to {hub.endpoint}/{NAMESPACE}/fields-model"
    pushed = hub.repos[f"{NAMESPACE}/fields-model"]
    assert not pushed.private and {"README.md", "model.safetensors", "state.safetensors"} <= set(pushed.files)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "token"]  # no folder left where it ran


def test_a_push_without_a_token_or_with_a_wrong_one_is_one_clear_error(runs, tmp_path):
    out = tmp_path / "local"
    with HubStandIn("hf_right") as hub:
        done = run_cli("export", str(runs["images"]), "--diffusers", str(out), "--push-to-hub", "lab/m",
                       env=_hub_env(hub, tmp_path / "hf", None))
        assert done.returncode == 2 and not out.exists() and hub.requests == []  # refused before anything
        assert done.stderr.strip() == (
            "error: pushing to the Hub needs a token and none was found -- set HF_TOKEN, run `hf auth login`, or "
            "pass --token-file FILE (a token with write access)")
        done = run_cli("export", str(runs["images"]), "--push-to-hub", "lab/m",
                       env=_hub_env(hub, tmp_path / "hf", "hf_wrong"))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().startswith("error: the Hub refused the push to 'lab/m' (")
    assert done.stderr.strip().endswith("-- set HF_TOKEN, run `hf auth login`, or pass --token-file FILE (a token "
                                        "with write access)")


def test_a_hub_that_cannot_be_reached_is_one_clear_error_and_the_local_export_stays(runs, tmp_path):
    with socket.socket() as closed:  # a port that nothing listens on once it is closed
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    env = {"HF_ENDPOINT": f"http://127.0.0.1:{port}", "HF_HOME": str(tmp_path / "hf"), "HF_TOKEN": "hf_x"}
    out = tmp_path / "local"
    done = run_cli("export", str(runs["fields"]), "--diffusers", str(out), "--push-to-hub", "lab/m", env=env)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().startswith("error: the Hub could not be reached to push to 'lab/m' (")
    assert done.stderr.strip().endswith(f"; the export in '{out}' is complete -- check the network (or HF_ENDPOINT), "
                                        "then export again")
    assert (out / "README.md").is_file() and (out / "model.safetensors").is_file()
