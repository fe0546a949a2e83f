"""How ``auto`` settings resolve per device. CUDA cannot run on CI, so its branch is fed a
recorded device description (H100 properties); the CPU branch runs for real."""

import io
import re
import types

import pytest
import torch

from diffscale import config as C
from diffscale.runtime.device import inference_policy, resolve_policy


@pytest.fixture
def fake_h100(monkeypatch):
    props = types.SimpleNamespace(name="NVIDIA H100 80GB HBM3", total_memory=85_520_809_984, major=9, minor=0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    return torch.device("cuda", 0)


def test_cpu_runs_fp32_eager_contiguous():
    policy = resolve_policy(C.RuntimeConfig(), torch.device("cpu"))
    assert policy.precision == C.Precision.FP32 and not policy.compile and not policy.channels_last
    assert inference_policy(C.RuntimeConfig(), torch.device("cpu")) == policy


def test_cuda_fast_recipe_trains_compiled_nchw_and_samples_channels_last(fake_h100):
    train = resolve_policy(C.RuntimeConfig(), fake_h100)
    assert train.precision == C.Precision.BF16 and train.compile
    assert not train.channels_last  # measured faster compiled (docs/benchmarks.md)
    assert inference_policy(C.RuntimeConfig(), fake_h100).channels_last
    eager = resolve_policy(C.RuntimeConfig(compile=C.Toggle.OFF), fake_h100)
    assert eager.channels_last and not eager.compile  # cuDNN prefers NHWC when not compiled
    forced = C.RuntimeConfig(channels_last=C.Toggle.OFF)
    assert not inference_policy(forced, fake_h100).channels_last  # an explicit choice is kept


def test_cuda_plain_recipe_is_fp16_with_scaler(fake_h100):
    plain = resolve_policy(C.RuntimeConfig(recipe=C.Recipe.PLAIN), fake_h100)
    assert plain.precision == C.Precision.FP16 and plain.use_grad_scaler
    assert not plain.compile and not plain.channels_last


def test_layout_optimisation_is_forced_for_compiled_cuda_training_only(fake_h100):
    assert resolve_policy(C.RuntimeConfig(), fake_h100).layout_opt
    assert not inference_policy(C.RuntimeConfig(), fake_h100).layout_opt  # measured on training
    assert not resolve_policy(C.RuntimeConfig(layout_opt=C.Toggle.OFF), fake_h100).layout_opt
    assert not resolve_policy(C.RuntimeConfig(compile=C.Toggle.OFF), fake_h100).layout_opt  # nothing to lay out
    assert not resolve_policy(C.RuntimeConfig(recipe=C.Recipe.PLAIN), fake_h100).layout_opt
    assert not resolve_policy(C.RuntimeConfig(), torch.device("cpu")).layout_opt


def test_compile_options_keep_the_mode_and_add_the_layout_optimisation():
    from diffscale.runtime.parallelize import compile_options

    assert compile_options("default", False) == {}
    assert compile_options("default", True) == {"force_layout_optimization": True}
    tuned = compile_options("max-autotune-no-cudagraphs", True)
    assert tuned["max_autotune"] and tuned["force_layout_optimization"]
    assert compile_options("reduce-overhead", False, True) == {"triton.cudagraphs": True,
                                                                "coordinate_descent_tuning": True}
    # torch.compile accepts them as they are (it rejects unknown inductor options at once)
    torch.compile(torch.nn.Linear(2, 2), options=tuned)
    torch.compile(torch.nn.Linear(2, 2), options=compile_options("reduce-overhead", True, True))


class _Denoiser(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return self.lin(x) + t[:, None]


@pytest.mark.parametrize("live", [False, True])
def test_compiled_sampling_freezes_weights_unless_live(live):
    """Frozen weights are constants of the compiled graph: a change after the first call is not
    seen (a live network, an EMA updated in place, sees it). Freezing given only as a
    torch.compile option left the weights graph inputs, so this failed for live=False."""
    from diffscale.diffusion.inference import InferenceNetwork
    from diffscale.runtime.device import DevicePolicy

    policy = DevicePolicy(device=torch.device("cpu"), name="CPU", memory_bytes=0, precision=C.Precision.FP32,
                          use_grad_scaler=False, compile=True, channels_last=False)
    torch.manual_seed(0)
    net = _Denoiser()
    sampler = InferenceNetwork(net, policy, live=live)
    x, t = torch.randn(2, 4), torch.tensor([1.0, 2.0])
    with torch.no_grad():
        before = sampler(x, t)
        net.lin.weight.mul_(2.0)
        after = sampler(x, t)
    assert torch.equal(before, after) != live


def test_one_sampling_job_runs_eager_until_its_eager_seconds_pass_then_compiles():
    """``eager_first_s`` (one ``sample`` or ``eval`` job under ``runtime.compile auto``): the first
    calls run eager (they see a weight change, as a frozen compiled graph would not); the first
    call after the seconds have passed says so, compiles and runs frozen; outputs agree."""
    import time

    from diffscale.diffusion.inference import InferenceNetwork
    from diffscale.io.stages import saying
    from diffscale.runtime.device import DevicePolicy

    policy = DevicePolicy(device=torch.device("cpu"), name="CPU", memory_bytes=0, precision=C.Precision.FP32,
                          use_grad_scaler=False, compile=True, channels_last=False)
    torch._dynamo.reset()  # dynamo keeps compiled code per function: not the earlier tests' unfrozen graph
    torch.manual_seed(0)
    net = _Denoiser()
    sampler = InferenceNetwork(net, policy, eager_first_s=0.2)
    x, t = torch.randn(2, 4), torch.tensor([1.0, 2.0])
    said: list[str] = []
    with torch.no_grad(), saying(said.append):
        first = sampler(x, t)  # the job's first call starts its clock: eager whatever the machine's load
        net.lin.weight.mul_(2.0)
        assert not torch.equal(sampler(x, t), first) or said, said  # eager unless 0.2 s passed already
        time.sleep(0.3)
        compiled = sampler(x, t)
        net.lin.weight.mul_(0.5)
        assert torch.equal(sampler(x, t), compiled)  # frozen from the compile on
    assert torch.allclose(compiled, net.lin(x) * 2 - net.lin.bias + t[:, None], atol=1e-5)
    assert re.fullmatch(r"sampling network: this job has sampled eagerly for \d+ s; it compiles for the rest "
                        r"\(a shorter job ends before a compile pays\)", said[0]), said
    assert said[1].startswith("sampling network: compiling for cpu (the network;"), said
    assert len(said) == 3 and said[2].startswith("sampling network: compiled in "), said


def test_a_job_replays_recorded_loops_once_compiled_unless_its_calls_compiled_first(fake_h100):
    """On a GPU (a recorded device description: nothing runs), ``loops`` is what ``sampler.sample``
    reads at each batch: None while the job runs eager, the loop cache once its eager seconds have
    passed, and None again for good where the per-call network compiled first (a job that turned
    compiled in the middle of a batch compiles once, not the recorded loop too)."""
    import time

    from diffscale.diffusion.graphed import LoopCache
    from diffscale.diffusion.inference import InferenceNetwork

    policy = inference_policy(C.RuntimeConfig(), fake_h100)
    eager_first = InferenceNetwork(_Denoiser(), policy, loop_graphs=True, eager_first_s=0.2)
    assert eager_first.loops is None  # the first batch starts the job's clock: eager
    time.sleep(0.3)
    assert isinstance(eager_first.loops, LoopCache)
    compiled_first = InferenceNetwork(_Denoiser(), policy, loop_graphs=True)
    assert isinstance(compiled_first.loops, LoopCache)
    compiled_first._compiled_calls.add("the network")  # as a per-call compile records itself
    assert compiled_first.loops is None


@pytest.mark.parametrize("toggle", [C.Toggle.AUTO, C.Toggle.ON])
def test_one_job_waits_before_compiling_only_under_auto(toggle, fake_h100, monkeypatch):
    """``sampling_network(..., one_job=True)``: on a GPU under ``auto`` the job runs eager for
    ``ONE_JOB_EAGER_S``; ``runtime.compile on`` compiles from the first call; other callers (the
    controller, the online trainer, bench) compile from the first call under ``auto`` too."""
    from diffscale.diffusion import inference
    from diffscale.diffusion.inference import ONE_JOB_EAGER_S, sampling_network

    monkeypatch.setattr(inference, "inference_policy", lambda runtime, device: inference_policy(runtime, fake_h100))
    monkeypatch.setattr(inference, "configure_backends", lambda policy: None)  # no GPU's settings on CI
    net = _Denoiser()
    runtime = C.RuntimeConfig(compile=toggle)
    one_job = sampling_network(net, runtime, one_job=True)
    assert one_job.policy.compile
    assert one_job._eager_until == (ONE_JOB_EAGER_S if toggle == C.Toggle.AUTO else None)
    assert sampling_network(net, runtime)._eager_until is None


def test_sampling_compiles_with_cuda_graphs(fake_h100):
    from diffscale.diffusion.inference import sampling_compile_options

    runtime = C.RuntimeConfig()
    policy = inference_policy(runtime, torch.device("cuda", 0))
    options = sampling_compile_options(policy)
    assert options["triton.cudagraphs"]
    assert "force_layout_optimization" not in options and "coordinate_descent_tuning" not in options
    forced = inference_policy(C.RuntimeConfig(layout_opt=C.Toggle.ON), torch.device("cuda", 0))
    assert sampling_compile_options(forced, tune_kernels=True)["coordinate_descent_tuning"]
    assert sampling_compile_options(forced)["force_layout_optimization"]


def test_training_replays_cuda_graphs_by_default_where_a_step_can_replay(fake_h100):
    from diffscale.config.presets import get_preset
    from diffscale.runtime.parallelize import training_compile_mode, trains_in_cuda_graphs

    def cfg_for(accum: int, mode: str | None):
        runtime = {"compile_mode": mode} if mode else {}
        return C.merge(get_preset("small"), {"runtime": runtime, "train": {"grad_accum": accum}})

    def mode(accum: int, asked: str | None = None, device=fake_h100) -> str:
        cfg = cfg_for(accum, asked)
        return training_compile_mode(cfg, resolve_policy(cfg.runtime, device)).value

    assert mode(1) == "reduce-overhead"  # the default (auto) on CUDA
    assert mode(1, "reduce-overhead") == "reduce-overhead"
    assert mode(2) == "default"  # a second micro-step's replay would overwrite the first one's gradients
    assert mode(2, "reduce-overhead") == "default"
    assert mode(1, "default") == "default"
    assert mode(1, "max-autotune-no-cudagraphs") == "max-autotune-no-cudagraphs"
    assert mode(1, device=torch.device("cpu")) == "default"  # not compiled on the CPU: mode unused
    cfg = cfg_for(1, None)
    assert trains_in_cuda_graphs(cfg, resolve_policy(cfg.runtime, fake_h100))
    assert not trains_in_cuda_graphs(cfg, resolve_policy(cfg.runtime, torch.device("cpu")))  # not compiled on the CPU


def test_a_forced_attention_kernel_gets_its_own_compile_cache_entries_and_cudnn_search_follows_its_toggle(
        fake_h100):
    """Inductor's cache key leaves out the SDPA kernel flags: without a tag of its own, code
    compiled under ``auto`` (cuDNN attention) was reused by a ``math`` run on a warm cache."""
    from diffscale.runtime.device import configure_backends

    b = torch.backends.cuda
    saved = (b.flash_sdp_enabled(), b.mem_efficient_sdp_enabled(), b.cudnn_sdp_enabled(), b.math_sdp_enabled(),
             torch.compiler.config.cache_key_tag, b.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch.backends.cudnn.benchmark)
    try:
        configure_backends(resolve_policy(C.RuntimeConfig(attention=C.Attention.MATH), fake_h100))
        assert torch.compiler.config.cache_key_tag == "sdpa=math"
        assert b.math_sdp_enabled() and not (b.flash_sdp_enabled() or b.cudnn_sdp_enabled())
        configure_backends(resolve_policy(C.RuntimeConfig(attention=C.Attention.FLASH), fake_h100))
        assert torch.compiler.config.cache_key_tag == "sdpa=flash"
        torch.compiler.config.cache_key_tag = "lab-A"  # a user's own tag stays, once
        configure_backends(resolve_policy(C.RuntimeConfig(attention=C.Attention.FLASH), fake_h100))
        configure_backends(resolve_policy(C.RuntimeConfig(attention=C.Attention.FLASH), fake_h100))
        assert torch.compiler.config.cache_key_tag == "lab-A|sdpa=flash"
        assert torch.backends.cudnn.benchmark  # auto: cuDNN times its algorithms on CUDA
        configure_backends(resolve_policy(C.RuntimeConfig(cudnn_benchmark=C.Toggle.OFF), fake_h100))
        assert not torch.backends.cudnn.benchmark
    finally:
        b.enable_flash_sdp(saved[0]), b.enable_mem_efficient_sdp(saved[1])
        b.enable_cudnn_sdp(saved[2]), b.enable_math_sdp(saved[3])
        torch.compiler.config.cache_key_tag = saved[4]
        b.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark = saved[5:]


def test_flexattention_where_it_measured_faster_and_sdpa_elsewhere(fake_h100, monkeypatch):
    """``auto``: FlexAttention for compiled CUDA training (calls of many narrow-head rows, the
    processor decides per call); never for the eager plain recipe, the CPU, sampling, or cards
    before Ampere, where it was not measured."""
    from diffscale.runtime.device import FLEX_AUTO_MIN_ROWS

    def rows(device=fake_h100, inference=False, **runtime):
        cfg = C.RuntimeConfig(**runtime)
        return (inference_policy if inference else resolve_policy)(cfg, device).flex_min_rows

    assert rows() == FLEX_AUTO_MIN_ROWS == 8192
    assert rows(recipe=C.Recipe.PLAIN) is None  # the common recipe keeps PyTorch's SDPA choice
    assert rows(compile=C.Toggle.OFF) is None
    assert rows(torch.device("cpu")) is None
    assert rows(inference=True) is None  # sampling was measured with SDPA
    assert rows(attention=C.Attention.SDPA) is None and rows(attention=C.Attention.CUDNN) is None
    assert rows(attention=C.Attention.FLEX) == 0 and rows(attention=C.Attention.FLEX, inference=True) == 0
    old = types.SimpleNamespace(name="Tesla V100-SXM2-32GB", total_memory=34_089_730_048, major=7, minor=0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: old)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert rows() is None


def test_forced_flexattention_needs_a_compiled_cuda_run(fake_h100):
    from diffscale.errors import UserError

    with pytest.raises(UserError, match=r"this run is on cpu\): FlexAttention is a kernel torch.compile"):
        resolve_policy(C.RuntimeConfig(attention=C.Attention.FLEX), torch.device("cpu"))
    with pytest.raises(UserError, match=r"this run is not compiled") as err:
        resolve_policy(C.RuntimeConfig(attention=C.Attention.FLEX, compile=C.Toggle.OFF), fake_h100)
    assert "runtime.compile=on" in err.value.fix


def test_bf16_gradient_compression_is_off_unless_asked_and_needs_nccl():
    from diffscale.config import Toggle
    from diffscale.errors import UserError
    from diffscale.runtime.parallelize import bf16_gradient_compression

    assert bf16_gradient_compression(Toggle.AUTO, "nccl") is False  # measured slower on NVLink
    assert bf16_gradient_compression(Toggle.OFF, "nccl") is False
    assert bf16_gradient_compression(Toggle.ON, "nccl") is True
    with pytest.raises(UserError) as err:
        bf16_gradient_compression(Toggle.ON, "gloo")
    assert "runtime.ddp_bf16_compress on needs CUDA GPUs with NCCL" in str(err.value)
    assert "auto or off" in err.value.fix


def test_an_operation_mps_lacks_is_one_message_with_the_fix():
    from diffscale.runtime.device import mps_gap

    lacking = NotImplementedError("The operator 'aten::_fft_r2c' is not currently implemented for the MPS device. "
                                  "If you want this op to be added in priority ...\nmore lines")
    gap = mps_gap(lacking, torch.device("mps"))
    assert gap is not None and "not implemented on Apple MPS (The operator 'aten::_fft_r2c'" in str(gap)
    assert "PYTORCH_ENABLE_MPS_FALLBACK=1" in gap.fix and "--device cpu" in gap.fix
    assert mps_gap(lacking, torch.device("cpu")) is None  # the same text on another device is another error
    assert mps_gap(NotImplementedError("abstract method"), torch.device("mps")) is None


def test_importing_diffscale_on_macos_turns_on_the_cpu_fallback_before_torch_loads():
    import subprocess
    import sys

    code = ("import os, sys; os.environ.pop('PYTORCH_ENABLE_MPS_FALLBACK', None); sys.platform = '{}'; "
            "import diffscale; print(os.environ.get('PYTORCH_ENABLE_MPS_FALLBACK'), 'torch' in sys.modules)")
    for platform, expected in (("darwin", "1 False"), ("linux", "None False")):
        out = subprocess.run([sys.executable, "-c", code.format(platform)], capture_output=True, text=True, check=True)
        assert out.stdout.split() == expected.split(), out


def test_ddp_graph_split_follows_recorded_steps_unless_set():
    from diffscale.config import Toggle
    from diffscale.runtime.parallelize import ddp_graph_split

    # recorded steps leave the overlap of all-reduces as the gain; eager ones lose more to the split
    assert ddp_graph_split(Toggle.AUTO, whole_steps=True) is True
    assert ddp_graph_split(Toggle.AUTO, whole_steps=False) is False
    assert ddp_graph_split(Toggle.OFF, whole_steps=True) is False
    assert ddp_graph_split(Toggle.ON, whole_steps=False) is True


def test_shutdown_releases_recordings_before_the_process_group_goes_once():
    from diffscale.runtime.distributed import DistContext, LaunchInfo

    ctx = DistContext(info=LaunchInfo(launcher="single"), device=torch.device("cpu"))
    released: list[str] = []
    ctx.before_shutdown(lambda: released.append("first"))
    ctx.before_shutdown(lambda: released.append("second"))
    ctx.shutdown()
    ctx.shutdown()
    assert released == ["second", "first"]


def test_dynamos_warning_on_diffusers_version_checks_is_filtered():
    """diffusers' upsampling calls its cached ``is_torch_version`` under bf16; dynamo warns about
    every such call it traces. The warning appears without diffscale's filter and not with it."""
    import re
    import warnings

    from diffusers.models.upsampling import Upsample2D
    from torch._dynamo.utils import warn_once_cache

    from diffscale.runtime.parallelize import DIFFUSERS_VERSION_CHECKS

    def dynamo_warnings(filtered: bool) -> list[str]:
        torch._dynamo.reset()
        warn_once_cache.clear()  # dynamo warns once per process and message
        up = Upsample2D(4, use_conv=True).to(torch.bfloat16)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            if filtered:
                warnings.filterwarnings("ignore", message=DIFFUSERS_VERSION_CHECKS, category=UserWarning)
            torch.compile(up, backend="eager")(torch.randn(1, 4, 4, 4, dtype=torch.bfloat16))
        return [str(w.message) for w in seen if "lru_cache" in str(w.message)]

    unfiltered = dynamo_warnings(filtered=False)
    assert unfiltered and re.match(DIFFUSERS_VERSION_CHECKS, unfiltered[0])
    assert dynamo_warnings(filtered=True) == []


@pytest.mark.parametrize("eager_search", ["on", "off"])
def test_the_eager_steps_while_compiling_search_cudnn_as_runtime_cudnn_benchmark_eager_says(
        eager_search, tmp_path, monkeypatch):
    """A run built to step eager until it compiles holds cuDNN's algorithm search under ``off`` and
    gives it back (process-wide) once its eager stand-ins end (``Run.compile`` and ``Run.close``
    end them the same way)."""
    from rich.console import Console

    from diffscale.config import ConfigSources, resolve_config
    from diffscale.training.build import build_run, join

    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)  # as configure_backends leaves a CUDA run
    cfg = resolve_config(ConfigSources(preset="tiny", overrides=[
        "runtime.compile=on", "runtime.compile_while_training=on", "runtime.cudnn_benchmark=on",
        f"runtime.cudnn_benchmark_eager={eager_search}", "model.block_out_channels=[8]", "model.attention=[false]",
        "model.norm_num_groups=8"]))
    console = Console(file=io.StringIO())
    ctx, policy = join(cfg, console, one_process=True)
    run = build_run(cfg, tmp_path / "run", ctx, policy, console=console, eager_first=True)
    try:
        assert run.eager
        assert torch.backends.cudnn.benchmark is (eager_search == "on")
    finally:
        run.close()
    assert torch.backends.cudnn.benchmark is True
