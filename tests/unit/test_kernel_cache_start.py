"""Where compiled kernels live (one folder per GPU kind, torch release and graph), which runs train
while their step compiles (``runtime.compile_while_training``), and what ``diffscale plan`` says of
a job's start: warm where the kernel cache holds its network's kernels, cold otherwise. The runs
themselves: tests/integration/test_compile_while_training.py."""

from __future__ import annotations

import dataclasses
import shlex

import pytest
import torch

from diffscale.config import ConfigSources, resolve_config
from diffscale.io.kernels import STEP_BUILT, KernelCache, build_name, mark_step_built, step_built, torch_part
from diffscale.runtime.device import resolve_policy


def test_kernel_folders_are_named_by_gpu_kind_and_torch_release_and_listed_without_torch(tmp_path):
    assert build_name("NVIDIA H200", "2.11.0+cu130") == "nvidia-h200-torch-2.11.0-cu130"
    assert build_name("NVIDIA A100-SXM4-80GB", "2.11.0+cu130").startswith("nvidia-a100-sxm4-80gb-torch-")
    assert build_name("CPU", "2.13.0+cpu") == "cpu-torch-2.13.0-cpu"
    assert build_name("NVIDIA H200", "2.11.0+cu130").endswith(torch_part("2.11.0+cu130"))
    root = tmp_path / "kernels"
    for build, graph, filled in (("nvidia-h200-torch-2.11.0-cu130", "aaaa", True),
                                 ("nvidia-a100-sxm4-80gb-torch-2.11.0-cu130", "aaaa", True),
                                 ("nvidia-h200-torch-2.11.0-cu130", "bbbb", False),  # a killed compile's part: cold
                                 ("nvidia-l40s-torch-2.11.0-cu130", "cccc", True)):
        (root / build / graph / "fxgraph").mkdir(parents=True)
        if filled:
            mark_step_built(root / build / graph)
    assert step_built(root / "nvidia-l40s-torch-2.11.0-cu130" / "cccc")
    assert not step_built(root / "nvidia-h200-torch-2.11.0-cu130" / "bbbb") and not step_built(tmp_path / "none")
    cache = KernelCache.read(root)
    assert cache.root == str(root) and cache.torch_version  # read from the installed package's metadata
    assert set(cache.compiled) == {("nvidia-h200-torch-2.11.0-cu130", "aaaa"),
                                   ("nvidia-a100-sxm4-80gb-torch-2.11.0-cu130", "aaaa"),
                                   ("nvidia-l40s-torch-2.11.0-cu130", "cccc")}
    # a partition's GPU type (as the cluster profiles write it) picks its GPU kind's folders
    assert cache.builds_of("aaaa", "H200") == ["nvidia-h200-torch-2.11.0-cu130"]
    assert cache.builds_of("aaaa", "A100-80GB") == ["nvidia-a100-sxm4-80gb-torch-2.11.0-cu130"]
    assert cache.builds_of("aaaa", "L40S") == [] and cache.builds_of("bbbb", "H200") == []
    assert cache.builds_of("cccc", "L40") == []  # another model of GPU
    assert len(cache.builds_of("aaaa", "any (compute capability >= 7.0)")) == 2  # kind unknown: any
    assert KernelCache.read(tmp_path / "none").compiled == ()


def test_a_whole_build_counts_for_the_data_it_was_built_for(tmp_path):
    """One config's folder holds the step of grayscale and of colour images (the channels follow the
    data): a build made for one data source is not whole for another; one marked before the marker
    named its data counts for none that names one."""
    folder = tmp_path / "nvidia-h200-torch-2.11.0-cu130" / "aaaa"
    folder.mkdir(parents=True)
    mark_step_built(folder, "npz:/data/grey.npz")
    assert step_built(folder, "npz:/data/grey.npz") and step_built(folder)
    assert not step_built(folder, "npz:/data/colour.npz")
    mark_step_built(folder, "npz:/data/grey.npz")  # once per data source
    mark_step_built(folder, "npz:/data/colour.npz")
    assert step_built(folder, "npz:/data/colour.npz")
    assert (folder / STEP_BUILT).read_text().count("built for: npz:/data/grey.npz\n") == 1
    cache = KernelCache.read(tmp_path)
    assert cache.builds_of("aaaa", "H200", "npz:/data/colour.npz") == [folder.parent.name]
    assert cache.builds_of("aaaa", "H200", "imagefolder:/data/other") == []
    assert cache.builds_of("aaaa", "H200") == [folder.parent.name]  # sizes fixed by the config: any data
    (folder / STEP_BUILT).write_text("a training step compiled through this folder ran\n")  # marked before
    assert step_built(folder) and not step_built(folder, "npz:/data/grey.npz")
    mark_step_built(folder, "npz:/data/grey.npz")
    assert step_built(folder, "npz:/data/grey.npz")
    mark_step_built(folder, "imagefolder:/data/two\nlines")  # the file keeps one line a build
    assert step_built(folder, "imagefolder:/data/two\nlines") and not step_built(folder, "imagefolder:/data/two")


def test_the_data_source_decides_a_build_only_where_a_size_follows_the_data():
    cfg = resolve_config(ConfigSources(preset="large", overrides=["data.source=npz:/data/colour.npz"]))
    assert cfg.model.channels == 0 and cfg.kernels_built_for() == "npz:/data/colour.npz"
    cfg.model.channels = 3
    assert cfg.kernels_built_for() == ""
    policy = resolve_config(ConfigSources(preset="policy-tiny"))
    assert policy.model.obs_dim and policy.kernels_built_for() == ""  # the preset sizes its network itself


def _policy(device: str, **runtime: str):
    cfg = resolve_config(ConfigSources(preset="tiny", overrides=[f"runtime.{k}={v}" for k, v in runtime.items()]))
    # the policy of a CUDA run without a GPU: resolve it on the CPU, then name the device
    cpu = resolve_policy(cfg.runtime, torch.device("cpu"))
    compiled = cpu.compile if device == "cpu" else runtime.get("compile", "auto") != "off"
    return cfg, dataclasses.replace(cpu, device=torch.device(device), compile=compiled)


@pytest.mark.parametrize("device, runtime, expected", [
    ("cuda", {}, True),  # auto: compiled CUDA training
    ("cuda", {"compile_while_training": "off"}, False),
    ("cuda", {"compile": "off", "compile_while_training": "on"}, False),  # nothing compiles: eager throughout
    ("cpu", {}, False),  # the CPU does not compile unless asked
    ("cpu", {"compile": "on"}, False),  # auto: CUDA only
    ("cpu", {"compile": "on", "compile_while_training": "on"}, True),
    ("cpu", {"compile": "off", "compile_while_training": "on"}, False),
])
def test_which_runs_train_while_their_step_compiles(device, runtime, expected):
    from diffscale.training.background_compile import compiles_while_training

    cfg, policy = _policy(device, **runtime)
    assert compiles_while_training(cfg, policy) is expected


def test_a_run_following_a_spool_compiles_before_its_first_step_unless_asked():
    """A spool's data arrives over time: a background process would wait for it as the run does."""
    from diffscale.training.background_compile import compiles_while_training

    cfg, policy = _policy("cuda")
    cfg.data.source = "spool:/scratch/run/spool:3840"
    assert not compiles_while_training(cfg, policy)
    cfg.runtime.compile_while_training = cfg.runtime.compile_while_training.ON
    assert compiles_while_training(cfg, policy)


@pytest.mark.parametrize("setting, built, trains_beside", [
    ("auto", False, True), ("auto", True, False), ("on", True, True), ("off", False, False)])
def test_a_cuda_run_compiles_first_where_its_kernel_folder_holds_a_whole_build(tmp_path, monkeypatch, setting, built,
                                                                               trains_beside):
    """Under ``auto`` a warm start compiles before its first step (seconds), as its compiled speed then
    comes soonest; a cold one, or a folder a killed compile left, trains eager beside the background
    compile; ``on`` always does, ``off`` never."""
    from diffscale.runtime.distributed import DistContext, LaunchInfo
    from diffscale.training.loop import _trains_beside

    monkeypatch.setenv("DIFFSCALE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "set here so that the test's end restores it")
    cfg, policy = _policy("cuda", compile_while_training=setting)
    ctx = DistContext(info=LaunchInfo(launcher="single"), device=torch.device("cpu"))
    kernels = tmp_path / "cache" / "kernels" / build_name(policy.name, torch.__version__) / cfg.graph_key(1)
    (kernels / "fxgraph").mkdir(parents=True)
    if built:
        mark_step_built(kernels, cfg.kernels_built_for())
    assert _trains_beside(cfg, tmp_path / "run", ctx, policy) == (kernels.resolve() if trains_beside else None)


def test_a_run_of_other_data_trains_eager_beside_the_compile_of_its_own_step(tmp_path, monkeypatch):
    """The folder holds a whole build for grayscale glyphs; the same preset on other data (colour
    images, the same graph key) would compile before its first step from a build that is not its
    own: it trains eager beside the background compile instead."""
    from diffscale.runtime.distributed import DistContext, LaunchInfo
    from diffscale.training.loop import _trains_beside

    monkeypatch.setenv("DIFFSCALE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "set here so that the test's end restores it")
    cfg, policy = _policy("cuda")
    ctx = DistContext(info=LaunchInfo(launcher="single"), device=torch.device("cpu"))
    kernels = tmp_path / "cache" / "kernels" / build_name(policy.name, torch.__version__) / cfg.graph_key(1)
    (kernels / "fxgraph").mkdir(parents=True)
    mark_step_built(kernels, cfg.kernels_built_for())
    other = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, source="npz:/data/colour.npz"))
    assert other.graph_key(1) == cfg.graph_key(1)
    assert _trains_beside(cfg, tmp_path / "run", ctx, policy) is None
    assert _trains_beside(other, tmp_path / "run2", ctx, policy) == kernels.resolve()


def test_plan_says_whether_a_job_starts_warm_or_cold_and_tells_the_job_where_the_cache_is(tmp_path, cli):
    """`diffscale plan` (no torch) on a cluster whose home holds the user's cache: cold until the cache
    holds this network's kernels for the partition's GPU kind and this torch release; the script
    exports the cache it looked in."""
    from importlib import metadata

    cache = tmp_path / "it's cache"
    env = {"DIFFSCALE_CACHE_DIR": str(cache)}

    def plan(*extra: str) -> str:
        done = cli("plan", "--cluster", "nyu-torch", "--partition", "h200", "--gpus-per-node", "1", "--preset", "small",
                   "--account", "lab", "--out", str(tmp_path / "run"), *extra, env={**env, "COLUMNS": "400"})
        assert done.returncode == 0, done.stdout + done.stderr
        return " ".join(done.stdout.split())  # the notes wrap

    out = plan()
    assert f"export DIFFSCALE_CACHE_DIR={shlex.quote(str(cache))}" in out and "Compiled kernels live in its" in out
    key = resolve_config(ConfigSources(preset="small")).graph_key(1)
    assert (f"kernel cache: cold -- no kernels of this network (graph {key}) for H200 and torch "
            f"{metadata.version('torch')} in {cache / 'kernels'}: the job trains eager while a background process "
            "compiles them, then switches (runtime.compile_while_training)") in out
    assert "compiles them before its first step (minutes)" in plan("--set", "runtime.compile_while_training=off")
    h200 = cache / "kernels" / build_name("NVIDIA H200", metadata.version("torch")) / key
    (h200 / "fxgraph").mkdir(parents=True)
    assert "kernel cache: cold" in plan()  # kernels, but not a whole step's build (a killed compile's)
    mark_step_built(h200, "npz:/data/colour.npz")
    assert "kernel cache: cold" in plan()  # a whole build, but for other data than the preset's
    mark_step_built(h200, resolve_config(ConfigSources(preset="small")).kernels_built_for())
    warm, version = plan(), metadata.version("torch")
    assert (f"kernel cache: warm -- {cache / 'kernels'}/{h200.parent.name}/{key} holds this network's kernels for "
            f"H200 and torch {version}: it compiles from them in seconds, before its first step") in warm
    assert "it trains eager while a background process loads them" in plan("--set", "runtime.compile_while_training=on")
    # the L40S partition's GPUs have none yet
    done = cli("plan", "--cluster", "nyu-torch", "--partition", "l40s", "--gpus-per-node", "1", "--preset", "small",
               "--account", "lab", "--out", str(tmp_path / "run"), env={**env, "COLUMNS": "400"})
    assert f"kernel cache: cold -- no kernels of this network (graph {key}) for L40S" in " ".join(done.stdout.split())
    assert "kernel cache:" not in plan("--set", "runtime.compile=off")
