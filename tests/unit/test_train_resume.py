"""Training end to end on the CPU: exact resume, refusal, signatures, corrupt checkpoints."""

import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
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
    assert "resumed from step 6" in capsys.readouterr().err
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
    assert (f"error: checkpoint '{run / 'checkpoints' / 'step_00000004'}' was written for a different model "
            "(block_out_channels: checkpoint [8, 16] vs config [16, 32]) -- resume with the config it was written "
            f"with, without --data or --set that change the model: diffscale train --out {run} --resume auto (it "
            f"reads {run / 'config.yaml'}); or start a new run with another --out") in err


def test_another_runs_checkpoint_of_a_different_model_is_named_with_its_own_folder(tmp_path, capsys):
    other, new = tmp_path / "other", tmp_path / "new"
    assert main(["train", "--out", str(other), *micro_args(steps=4)]) == 0
    step = ckpt.list_checkpoints(other)[-1]
    assert main(["train", "--out", str(new), "--resume", str(step),
                 *micro_args("model.block_out_channels=[16,32]", steps=8)]) == 2
    err = capsys.readouterr().err
    assert f"error: checkpoint '{step}' was written for a different model" in err
    assert f"diffscale train {other / 'config.yaml'} --out {new} --resume {step};" in err
    # the command the hint gives works
    assert main(["train", str(other / "config.yaml"), "--out", str(new), "--resume", str(step),
                 *micro_args(steps=8)]) == 0
    assert f"resumed from step {ckpt.step_of(step)}" in capsys.readouterr().err


def test_a_run_dirs_config_resumes_that_run(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where runs/PRESET would go if the run dir were not taken from the config
    run = tmp_path / "run"
    assert main(["train", "--out", str(run), "--max-steps", "4", *micro_args(steps=8)]) == 0
    capsys.readouterr()
    assert main(["train", str(run / "config.yaml"), "--resume", "auto"]) == 0
    out = capsys.readouterr().err
    assert f"resuming the run in {run}, the folder of {run / 'config.yaml'}" in out and "resumed from step 4" in out
    assert ckpt.step_of(ckpt.list_checkpoints(run)[-1]) == 8 and not (tmp_path / "runs").exists()


def test_resume_auto_without_a_checkpoint_says_it_starts_a_new_run(tmp_path, capsys):
    run = tmp_path / "fresh"
    assert main(["train", "--out", str(run), "--resume", "auto", *micro_args(steps=2)]) == 0
    assert f"--resume auto: no checkpoint in '{run}', starting a new run there" in capsys.readouterr().err


def test_corrupt_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--out", str(run), *micro_args("train.keep_checkpoints=3", steps=8)]) == 0
    newest = ckpt.list_checkpoints(run)[-1]
    weights = newest / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # truncated, as by a full disk
    capsys.readouterr()
    assert main(["train", "--out", str(run), "--resume", "auto", *micro_args(steps=10)]) == 0
    out = capsys.readouterr().err
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
    assert f"resumed from step {ckpt.step_of(first)}" in capsys.readouterr().err
    assert main(["train", "--out", str(run), "--resume", str(tmp_path / "nope"), *micro_args(steps=8)]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_the_wait_for_compilation_is_announced_first_time_or_cached(tmp_path):
    from diffscale.training.build import compile_note

    cache = tmp_path / "cache" / "inductor"
    assert compile_note(cache).startswith("compiling the network before the first step (the first time takes")
    cache.mkdir(parents=True)
    assert "first time" in compile_note(cache)  # an empty cache folder holds nothing to reuse
    (cache / "fxgraph").mkdir()
    assert compile_note(cache) == f"compiling the network: kernels cached by an earlier job in {cache} are reused"


def test_runs_of_one_network_share_its_compiled_kernels_unless_the_user_chose_a_cache(tmp_path, monkeypatch):
    from diffscale import config as C
    from diffscale.io.kernels import build_name
    from diffscale.runtime import user_env
    from diffscale.training.build import run_compile_cache

    def config(*overrides: str) -> C.RunConfig:
        return C.resolve_config(C.ConfigSources(preset="tiny", overrides=list(overrides)))

    def kernels_of(run: str, cfg: C.RunConfig, world_size: int = 1, device: str = "NVIDIA H200") -> Path:
        return run_compile_cache(tmp_path / run, cfg, world_size, device)

    monkeypatch.setenv("DIFFSCALE_CACHE_DIR", str(tmp_path / "cache"))
    # torch writes its node-local default into the variable once anything asks for its cache
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/tmp/torchinductor_someone")
    monkeypatch.setattr(user_env, "USER_COMPILE_CACHE", None)
    kernels = kernels_of("first", config())
    # one folder per GPU kind and torch release, then per compiled graph
    assert kernels.parent.parent == (tmp_path / "cache" / "kernels").resolve()
    assert kernels.parent.name == build_name("NVIDIA H200", torch.__version__)
    assert kernels.name == config().graph_key(1)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(kernels)
    # another run of the same network (another learning rate and seed): the same kernels
    assert kernels_of("second", config("optim.lr=5e-4", "train.seed=3")) == kernels
    # cuDNN's algorithm search is chosen at run time, outside the graph; so is training while compiling
    assert kernels_of("second", config("runtime.cudnn_benchmark=off")) == kernels
    assert kernels_of("second", config("runtime.compile_while_training=off")) == kernels
    # what changes the compiled graph gets a folder of its own, and so does another GPU kind
    assert kernels_of("second", config("train.batch_per_gpu=32")) != kernels
    assert kernels_of("second", config("runtime.layout_opt=off")) != kernels
    assert kernels_of("second", config(), 2) != kernels
    a100 = kernels_of("second", config(), device="NVIDIA A100-SXM4-80GB")
    assert a100.name == kernels.name and a100.parent.name.startswith("nvidia-a100-sxm4-80gb-torch-")
    # a run that kept kernels of its own keeps using them when it resumes
    own = tmp_path / "older" / "cache" / "inductor"
    (own / "fxgraph").mkdir(parents=True)
    assert kernels_of("older", config()) == own.resolve()
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/scratch/me/inductor")
    monkeypatch.setattr(user_env, "USER_COMPILE_CACHE", "/scratch/me/inductor")  # set before diffscale started
    assert kernels_of("first", config()) == Path("/scratch/me/inductor")


# A job in a process of its own (dynamo's state is per process), printing dynamo's counters at the end.
_JOB = """
import json, sys
from diffscale.cli import main
code = main(sys.argv[1:])
from torch._dynamo.utils import counters
print("COUNTERS " + json.dumps({k: dict(counters[k]) for k in ("frames", "dynamo_cache")}))
sys.exit(code)
"""


def _compiled_job(run_dir: Path, *args: str) -> tuple[str, dict]:
    import subprocess
    import sys

    # PYTHONDONTWRITEBYTECODE off, as on most users' machines: the generated code's bytecode is kept
    env = {k: v for k, v in os.environ.items()
           if k not in ("TORCHINDUCTOR_CACHE_DIR", "RANK", "WORLD_SIZE", "PYTHONDONTWRITEBYTECODE")}
    env["DIFFSCALE_CACHE_DIR"] = str(run_dir.parent / "cache")  # the kernels of this test's runs only
    # Inductor first dry-compiles and loads a probe program per vector ISA the CPU reports, into the
    # (here always empty) kernel cache: a quarter of the first job's time. Trusting the CPU's flags
    # skips the probes; where they would pass, inductor picks the same ISA and writes the same kernels.
    env["TORCHINDUCTOR_VEC_ISA_OK"] = "1"
    cmd = [sys.executable, "-c", _JOB, "train", "--device", "cpu", "--out", str(run_dir), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**env, "COLUMNS": "250"}, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    counters = json.loads(done.stdout.split("COUNTERS ", 1)[1])
    return done.stdout + done.stderr, counters


def test_a_resumed_job_installs_the_traced_network_instead_of_tracing_it(tmp_path):
    """runtime.compile_cache: the first job saves dynamo's traced network after its first step; a
    resumed job (a new process) installs it, traces nothing, and trains bit for bit as the first
    job did past the checkpoint it resumes from. The resumed job's run dir is a copy: it finds the
    traced network and kernels in the user's kernel cache, as a new run of the network would. (The
    network is the micro UNet cut to one level:
    its first compile on a CPU is most of this test's time.)"""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    one_level = micro_args("model.block_out_channels=[8]", "model.attention=[false]", "runtime.compile=on",
                           "runtime.compile_cache=on", "train.checkpoint_every=2", "train.log_every=1", steps=4)
    _, first = _compiled_job(straight, *one_level)
    assert first["frames"]["ok"] == 1 and first["dynamo_cache"] == {"dynamo_cache_miss": 1}
    entries = list((tmp_path / "cache" / "kernels").glob("*/*/dynamo/*/entry"))
    assert len(entries) == 1 and entries[0].stat().st_size > 0
    # runtime.generated_bytecode: the output code's bytecode beside the kernels, read (not written
    # again) by the resumed job
    kept = {p: p.stat().st_mtime_ns for p in (tmp_path / "cache" / "kernels").rglob("__pycache__/*.pyc")}
    assert kept

    shutil.copytree(straight, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step_00000004")
    out, second = _compiled_job(resumed, "--resume", "auto")  # the run's config.yaml: compile_cache on
    assert "resumed from step 2" in out
    assert "the traced network and kernels cached by an earlier job" in out
    waited = re.search(r"^first step of this job \(step 3\) ([\d.]+) s after it started: compiled$", out, re.M)
    events = [json.loads(line) for line in (resumed / "metrics.jsonl").read_text().splitlines() if '"kind"' in line]
    assert waited and [(e["step"], e["since_start_s"]) for e in events if e["kind"] == "first_step"][-1] == \
        (3, pytest.approx(float(waited[1]), abs=0.051))
    assert second["dynamo_cache"] == {"dynamo_cache_hit": 1}
    assert second["frames"] == {}  # dynamo traced no frame
    assert "is dropped with caching_precompile" not in out and "could not be used" not in out
    assert {p: p.stat().st_mtime_ns for p in kept} == kept
    name_a, a = _final_tensors(straight)
    name_b, b = _final_tensors(resumed)
    assert name_a == name_b == "step_00000004"
    for key in a:
        assert torch.equal(a[key], b[key]), key
    last = [[json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()][-1]
            for run in (straight, resumed)]
    assert last[0]["step"] == last[1]["step"] == 4 and last[0]["loss"] == last[1]["loss"]


def test_a_cached_traced_network_that_cannot_be_used_is_discarded_with_one_warning(tmp_path, monkeypatch):
    from torch._dynamo.package import CompilePackage

    from diffscale.config import Toggle
    from diffscale.config.presets import tiny
    from diffscale.runtime.compile_cache import DISCARDED, STAMP, fingerprint, open_compile_cache
    from diffscale.tasks.images.network import Denoiser, build_unet

    cfg = tiny()
    cfg.runtime.compile_cache = Toggle.ON
    net = Denoiser(build_unet(cfg.model, 1))
    cache_dir = tmp_path / "inductor"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache_dir))  # where torch's DynamoCache looks
    said: list[str] = []

    def cache_with(entry_bytes: bytes, stamp: str, world_size: int = 1, built_for: str | None = None):
        dynamo = cache_dir / "dynamo"
        entry = dynamo / CompilePackage.source_id_from_fn(net.forward) / "entry"
        entry.parent.mkdir(parents=True, exist_ok=True)
        entry.write_bytes(entry_bytes)
        written = {"fingerprint": stamp, "built_for": cfg.kernels_built_for() if built_for is None else built_for}
        (dynamo / STAMP).write_text(json.dumps(written))
        said.clear()
        return open_compile_cache(cfg, cache_dir, world_size=world_size, own_cache=True, net=net, say=said.append)

    dynamo = cache_dir / "dynamo"
    cache = cache_with(b"not a pickle", fingerprint(cfg, 1))  # as by a full disk
    assert cache.active and not cache.found and not dynamo.exists()
    assert len(said) == 1 and said[0].startswith(f"[yellow]warning: the cached traced network in {dynamo} "
                                                 "could not be used (UnpicklingError")
    kept = cache_dir / DISCARDED  # the whole traceback, for a report against torch
    assert said[0].endswith(f"; tracing it again; the traceback is in {kept} (--set runtime.compile_cache=off "
                            "stops trying)[/]")
    assert "Traceback (most recent call last)" in kept.read_text() and "UnpicklingError" in kept.read_text()
    cache = cache_with(b"x", "another config")
    assert cache.active and not cache.found and not dynamo.exists()
    assert len(said) == 1 and "(it was traced for another config or torch)" in said[0]
    # traced for other data (the image channels follow it): traced anew for this data, without a warning
    cache = cache_with(b"x", fingerprint(cfg, 1), built_for="npz:/data/colour.npz")
    assert cache.active and not cache.found and not dynamo.exists() and not said
    cache = cache_with(b"x", fingerprint(cfg, 2), world_size=2)
    assert not cache.active and cache.why_not.startswith("runtime.compile_cache is for one process")
    assert not said and dynamo.exists()  # a distributed run leaves the cache alone
    cfg.runtime.compile_cache = Toggle.AUTO  # auto: on for CUDA training, where it was measured
    assert not open_compile_cache(cfg, cache_dir, world_size=1, own_cache=True, net=net, say=said.append).active
    assert open_compile_cache(cfg, cache_dir, world_size=1, own_cache=True, net=net, say=said.append,
                              on_cuda=True).active
    for world_size, own in ((2, True), (1, False)):  # where it cannot be used, auto stays quiet
        cache = open_compile_cache(cfg, cache_dir, world_size=world_size, own_cache=own, net=net, say=said.append,
                                   on_cuda=True)
        assert not cache.active and cache.why_not == ""


def test_a_traced_network_whose_guards_name_an_import_is_read_back():
    """On CUDA the traced step's guards name ``__import__('torch')`` (an ImportSource): building one
    installs a guard, so torch's reader failed outside a trace ("TracingContext.get() must be called
    within an ongoing trace", H100, torch 2.11) and every resumed job traced the network again.
    The cache reads guards inside a throwaway tracing context, in its check and while torch installs."""
    import pickle

    from torch._dynamo import package
    from torch._dynamo.source import AttrSource, CallFunctionNoArgsSource, ImportSource
    from torch._guards import TracingContext, tracing

    from diffscale.runtime.compile_cache import _loading_as_compiled, read_guards_state

    with tracing(TracingContext(None)):  # as dynamo builds them while tracing
        current_device = CallFunctionNoArgsSource(
            AttrSource(AttrSource(ImportSource("torch"), "cuda"), "current_device"))
        written = pickle.dumps(current_device)
    with pytest.raises(RuntimeError, match="within an ongoing trace"):
        package.load_guards_state(written)  # what loading the entry met
    assert read_guards_state(written) == current_device
    torch_reader = package.load_guards_state
    with _loading_as_compiled({"triton.cudagraphs": False}):
        assert package.load_guards_state(written) == current_device  # torch's install reads it so
    assert package.load_guards_state is torch_reader


_PRECOMPILED = """
import contextlib
import sys
from pathlib import Path
import torch
from torch._dynamo.utils import counters
from diffscale.runtime.compile_cache import CompileCache

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
    def forward(self, x):
        return self.linear(x).relu() * 2

def under():  # bf16 autocast (a GPU run's step) where asked
    return torch.autocast("cpu", dtype=torch.bfloat16) if sys.argv[3:] == ["autocast"] else contextlib.nullcontext()

torch.manual_seed(0)
net = Net()
cache = CompileCache(directory=Path(sys.argv[2]), stamp="test", say=print)
with cache:
    if sys.argv[1] != "save":
        cache.check(net)
    model = cache.compile(net, {}, calls_under=under)
    for rows in {"save": [4], "load": [4, 6], "new shape first": [6]}[sys.argv[1]]:  # 6: not in the entry
        with under():
            loss = model(torch.ones(rows, 8)).float().sum()
        loss.backward()
        print("rows", rows, "loss", round(loss.item(), 3), "traced", counters["stats"]["unique_graphs"], flush=True)
        cache.save_once()
"""


def _precompiled_job(tmp_path: Path) -> Callable[..., str]:
    """Runs ``_PRECOMPILED`` in a fresh process (its own module: the entry is keyed by the
    function's file) with its kernels and entry under ``tmp_path``; returns what it printed."""
    import subprocess
    import sys

    script = tmp_path / "precompiled.py"
    script.write_text(_PRECOMPILED)
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "TORCHINDUCTOR_VEC_ISA_OK": "1"}

    def job(mode: str, *under: str) -> str:
        done = subprocess.run([sys.executable, str(script), mode, str(tmp_path / "inductor" / "dynamo"), *under],
                              capture_output=True, text=True, env=env, timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    return job


def test_a_job_that_installed_the_traced_network_can_still_trace(tmp_path):
    """A job that installed an entry traces again where a guard fails or a shape is new. Torch drew
    the new trace's global names from a fresh counter, the same names the entry had installed, and
    stopped ("AssertionError: Name '__builtins_dict___0' already exists in scope"; an H100 resumed
    job at its first step, and here at a second shape)."""
    job = _precompiled_job(tmp_path)
    assert "rows 4 loss 8.0 traced 1" in job("save")
    out = job("load")
    assert "rows 4 loss 8.0 traced 0" in out  # installed, not traced
    assert "rows 6 loss 12.0 traced 1" in out  # traced beside it
    assert "traced again at the first step" not in out
    out = job("new shape first")  # the job's first step is not what the entry covers: said once
    assert "rows 6 loss 12.0 traced 1" in out
    assert out.count("warning: the cached traced network was installed, yet dynamo traced the network again at "
                     "the first step (a guard of the entry failed: tensor 'L['x']' size mismatch at index 0. "
                     "expected 4, actual 6; all in ") == 1  # the entry's own guards, checked on the traced call
    report = (tmp_path / "inductor" / "traced-network-retraced.txt").read_text()
    assert report.startswith("forward at precompiled.py:") and "expected 4, actual 6" in report


def test_an_entry_traced_under_autocast_holds_in_a_job_that_trains_under_it(tmp_path):
    """Torch builds an installed entry's guards under the context of the install, and a tensor's
    guarded dispatch keys depend on autocast: installed outside the step's autocast, the entry failed
    every call and the network was traced again (an H100 job in bf16; here bf16 on the CPU)."""
    job = _precompiled_job(tmp_path)
    assert "rows 4 loss 7.992 traced 1" in job("save", "autocast")
    out = job("load", "autocast")
    assert "rows 4 loss 7.992 traced 0" in out, out  # installed and used
    assert "traced again" not in out


def test_the_stamp_is_in_place_before_the_traced_network_is_written(tmp_path, monkeypatch):
    """Runs of one network share the entry's folder and may run at once: a job that starts while
    another writes must find the stamp with (or before) the entry, never an entry without it,
    which it would discard. (The real write: the precompiled jobs above.)"""
    from diffscale.runtime import compile_cache as cc

    dynamo = tmp_path / "dynamo"
    stamps_when_written: list[dict] = []
    monkeypatch.setattr(torch.compiler, "save_cache_artifacts",
                        lambda: stamps_when_written.append(json.loads((dynamo / cc.STAMP).read_text())))
    monkeypatch.setattr(cc, "_graphs_traced", lambda: 1)  # this job traced the network
    said: list[str] = []
    cc.CompileCache(directory=dynamo, stamp="abc", built_for="npz:/data/grey.npz", say=said.append).save_once()
    assert stamps_when_written == [{"fingerprint": "abc", "built_for": "npz:/data/grey.npz"}] and not said



def test_a_process_knows_how_long_it_has_run_to_a_tenth_of_a_second(tmp_path):
    """The first-step line's seconds: a process that slept 1 s says at least 1 s and no more than its
    parent timed from before starting it (psutil's create_time counts the boot time in whole seconds
    and was 1.0 s over)."""
    import subprocess
    import sys
    import time

    code = "import time; time.sleep(1.0); from diffscale.training.telemetry import seconds_since_process_start as s; " \
           "print(s())"
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    timed = time.perf_counter() - started
    assert done.returncode == 0, done.stderr
    assert 1.0 <= float(done.stdout) <= timed
