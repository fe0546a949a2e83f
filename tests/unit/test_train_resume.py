"""Training end to end on the CPU: exact resume, refusal, signatures, corrupt checkpoints."""

import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file

from diffscale.cli import main
from diffscale.runtime import checkpoint as ckpt

from helpers import micro_args


def _final_tensors(run_dir):
    last = ckpt.list_checkpoints(run_dir)[-1]
    out = {}
    for name in ("model", "ema", "optimizer"):
        out.update({f"{name}/{k}": v for k, v in load_file(str(last / f"{name}.safetensors")).items()})
    return last.name, out


def test_stop_and_resume_is_bit_for_bit_equal_to_an_uninterrupted_run(tmp_path, capsys):
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert main(["train", "--out", str(straight), *micro_args(steps=10)]) == 0
    assert main(["train", "--out", str(split), "--max-steps", "6", *micro_args(steps=10)]) == 0
    assert ckpt.step_of(ckpt.list_checkpoints(split)[-1]) == 6
    assert main(["train", "--out", str(split), "--resume", "auto", *micro_args(steps=10)]) == 0
    assert "resumed from step 6" in capsys.readouterr().out
    name_a, a = _final_tensors(straight)
    name_b, b = _final_tensors(split)
    assert name_a == name_b == "step_00000010"
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    metrics = [json.loads(line) for line in (split / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics][-1] == 10
    assert {"loss", "lr", "grad_norm", "samples_per_s", "peak_mem_mb"} <= metrics[0].keys()
    assert (split / "samples" / "latest.png").is_file()
    assert (split / "config.yaml").is_file() and list((split / "tb").iterdir())


def test_a_new_run_into_a_used_run_dir_is_refused(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--out", str(run), *micro_args(steps=4)]) == 0
    before = sorted(p.name for p in ckpt.list_checkpoints(run))
    assert main(["train", "--out", str(run), *micro_args(steps=4)]) == 2
    err = capsys.readouterr().err
    assert (f"error: run dir '{run}' already holds checkpoints (newest: step_00000004) -- "
            "continue that run with --resume auto") in err
    assert sorted(p.name for p in ckpt.list_checkpoints(run)) == before


def test_resume_with_a_different_model_is_refused(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--out", str(run), *micro_args(steps=4)]) == 0
    code = main(["train", "--out", str(run), "--resume", "auto", *micro_args("model.block_out_channels=[16,32]",
                                                                            "model.norm_num_groups=8", steps=8)])
    assert code == 2
    err = capsys.readouterr().err
    assert "was written for a different model (block_out_channels: checkpoint [8, 16] vs config [16, 32])" in err


def test_corrupt_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--out", str(run), *micro_args("train.keep_checkpoints=3", steps=8)]) == 0
    newest = ckpt.list_checkpoints(run)[-1]
    weights = newest / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # truncated, as by a full disk
    capsys.readouterr()
    assert main(["train", "--out", str(run), "--resume", "auto", *micro_args(steps=10)]) == 0
    out = capsys.readouterr().out
    assert "warning: checkpoint step_00000008: model.safetensors has 100 bytes" in out
    assert "resumed from step 4" in out


def test_every_checkpoint_damaged_is_a_clear_error(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--out", str(run), *micro_args(steps=4)]) == 0
    for path in ckpt.list_checkpoints(run):
        (path / "manifest.json").write_text("{not json")
    assert main(["train", "--out", str(run), "--resume", "auto", *micro_args(steps=8)]) == 2
    assert "every checkpoint in" in capsys.readouterr().err


def test_checkpoints_hold_no_pickles_and_keep_the_newest(tmp_path):
    run = tmp_path / "run"
    assert main(["train", "--out", str(run), *micro_args("train.keep_checkpoints=2", "train.checkpoint_every=2",
                                                         steps=8)]) == 0
    names = [p.name for p in ckpt.list_checkpoints(run)]
    assert names == ["step_00000006", "step_00000008"]
    files = sorted(p.name for p in ckpt.list_checkpoints(run)[-1].iterdir())
    assert files == ["ema.safetensors", "manifest.json", "model.safetensors", "optimizer.safetensors",
                     "rng.safetensors", "state.json", "task.safetensors"]
    state = ckpt.load_checkpoint(ckpt.list_checkpoints(run)[-1])
    assert state.meta.data_position["offset"] > 0 and state.meta.signature["task"] == "images"


def test_resume_from_an_explicit_checkpoint_path(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--out", str(run), *micro_args(steps=8)]) == 0
    first = ckpt.list_checkpoints(run)[0]
    assert main(["train", "--out", str(run), "--resume", str(first), *micro_args(steps=8)]) == 0
    assert f"resumed from step {ckpt.step_of(first)}" in capsys.readouterr().out
    assert main(["train", "--out", str(run), "--resume", str(tmp_path / "nope"), *micro_args(steps=8)]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_the_wait_for_compilation_is_announced_first_time_or_cached(tmp_path):
    from diffscale.train import compile_note

    cache = tmp_path / "cache" / "inductor"
    assert compile_note(cache).startswith("compiling the network before the first step (the first time takes")
    cache.mkdir(parents=True)
    assert "first time" in compile_note(cache)  # an empty cache folder holds nothing to reuse
    (cache / "fxgraph").mkdir()
    assert compile_note(cache) == f"compiling the network: kernels cached by an earlier job in {cache} are reused"


def test_compiled_kernels_go_to_the_run_dir_unless_the_user_chose_a_cache(tmp_path, monkeypatch):
    import diffscale
    from diffscale.train import run_compile_cache

    # torch writes its node-local default into the variable once anything asks for its cache
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/tmp/torchinductor_someone")
    monkeypatch.setattr(diffscale, "USER_COMPILE_CACHE", None)
    assert run_compile_cache(tmp_path / "run") == (tmp_path / "run" / "cache" / "inductor").resolve()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str((tmp_path / "run" / "cache" / "inductor").resolve())
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/scratch/me/inductor")
    monkeypatch.setattr(diffscale, "USER_COMPILE_CACHE", "/scratch/me/inductor")  # set before diffscale started
    assert run_compile_cache(tmp_path / "run") == Path("/scratch/me/inductor")
