"""`diffscale bench` end to end on the CPU (processes instead of GPUs), and the fast path's
numerics against the plain path's. No timings are asserted."""

import json

import pytest
import torch

from diffscale.bench.cli import add_derived
from diffscale.cli import main
from diffscale.config import merge
from diffscale.config.presets import get_preset
from diffscale.tasks.images.task import ImageTask

from helpers import MICRO

# tiny's UNet cut to the micro size (MICRO's network settings), convolutions and an attention block
# kept: what a bench run reports does not depend on the network's size, and its steps are cheaper.
MICRO_NET = [arg for item in MICRO if item.startswith("model.") for arg in ("--set", item)]


def test_bench_runs_fast_and_plain_and_reports(tmp_path, capsys):
    out = tmp_path / "bench"
    code = main(["bench", "--preset", "tiny", "--gpus", "1,2", "--recipe", "fast,plain", "--steps", "2",
                 "--warmup", "1", "--plain-workers", "1", "--out", str(out), "--set", "train.batch_per_gpu=8",
                 *MICRO_NET, "--profile", "1", "--trace", "--concurrent", "2"])
    assert code == 0, "\n".join(p.read_text() for p in (out / "logs").glob("*.log"))
    records = json.loads((out / "bench.json").read_text())
    assert {(r["recipe"], r["world_size"]) for r in records} == {("fast", 1), ("fast", 2), ("plain", 1), ("plain", 2)}
    for r in records:
        assert r["samples_per_s"] > 0 and r["flops_per_step_per_gpu"] > 0 and r["startup_s"] > 0
        assert 0 <= r["data_wait_share"] <= 1
        assert r["reserved_gib"] == 0 and r["compile_mode"] is None  # CPU: no CUDA memory, eager
        assert r["attention"] == "auto" and r["flex_min_rows"] is None  # FlexAttention: compiled CUDA only
    fast2 = next(r for r in records if r["recipe"] == "fast" and r["world_size"] == 2)
    # --concurrent 2: a one-process run and a two-rank torchrun group start together, then take
    # turns: their measured windows never overlap
    fast1 = next(r for r in records if r["recipe"] == "fast" and r["world_size"] == 1)
    (a0, a1), (b0, b1) = sorted([fast1["measured_window"], fast2["measured_window"]])
    assert a0 < a1 <= b0 < b1, (fast1["measured_window"], fast2["measured_window"])
    assert fast2["scaling_efficiency"] is not None and fast2["fast_over_plain"] is not None
    assert (out / "bench.png").stat().st_size > 1000
    printed = capsys.readouterr().out
    assert "fast/plain" in printed and "reserved GiB" in printed
    # --profile: where the step's time goes, per kind and per operator (CPU operators here).
    prof = records[0]["profile"]
    assert prof["top"] and prof["kinds"]["convolution"]["ms"] > 0
    assert abs(sum(k["share"] for k in prof["kinds"].values()) - 1) < 1e-6
    assert "convolution" in printed and "top entries" in printed
    # DDP runs also say each rank's communication and other kernel time (waiting vs moving data)
    per_rank = fast2["profile"]["per_rank"]
    assert [r["rank"] for r in per_rank] == [0, 1] and all(r["other_ms"] > 0 for r in per_rank)
    assert per_rank[0]["communication_ms"] == fast2["profile"]["kinds"].get("communication", {}).get("ms", 0.0)
    assert "rank 1:" in printed
    traces = sorted(p.relative_to(out / "traces").as_posix() for p in (out / "traces").rglob("*.json"))
    assert len(traces) == 6 and sum(t.endswith("/rank1.json") for t in traces) == 2  # one per rank of every run

    # --collect rebuilds the report from the worker records alone.
    (out / "bench.json").unlink()
    (out / "bench.png").unlink()
    assert main(["bench", "--collect", "--out", str(out)]) == 0
    again = json.loads((out / "bench.json").read_text())
    assert sorted((r["recipe"], r["world_size"]) for r in again) == \
        sorted((r["recipe"], r["world_size"]) for r in records)
    assert (out / "bench.png").is_file()
    assert main(["bench", "--collect", "--out", str(out / "empty")]) == 2
    assert "no worker records" in capsys.readouterr().err


def test_bench_variants_side_by_side_then_sampling(tmp_path, capsys):
    """--variant runs the fast recipe again with its overrides (after --set, so they win),
    --concurrent starts the runs together but times them one at a time, --sampling times DDIM
    against DDIMPipeline for the defaults and each variant; every call records its command."""
    out = tmp_path / "bench"
    code = main(["bench", "--preset", "tiny", "--recipe", "fast", "--steps", "2", "--warmup", "1", "--out", str(out),
                 "--set", "train.batch_per_gpu=8", *MICRO_NET,
                 "--variant", "b4", "train.batch_per_gpu=4", "--concurrent", "2",
                 "--sampling", "--sampling-batch", "2", "--sampling-steps", "2", "--sampling-repeats", "1"])
    assert code == 0, "\n".join(p.read_text() for p in (out / "logs").glob("*.log"))
    records = {r.get("label"): r for r in json.loads((out / "bench.json").read_text())}
    assert set(records) == {None, "b4"}
    assert records[None]["batch_per_gpu"] == 8 and records["b4"]["batch_per_gpu"] == 4
    (a0, a1), (b0, b1) = sorted(r["measured_window"] for r in records.values())
    assert a0 < a1 <= b0 < b1  # compiled side by side, timed one after the other
    assert sorted(p.name for p in (out / "logs").glob("*.log")) == [
        "sampling-tiny-b4.log", "sampling-tiny.log", "tiny-fast-1gpu.log", "tiny-fast-b4-1gpu.log"]
    sampled = {r["label"]: r for r in json.loads((out / "sampling.json").read_text())}
    assert set(sampled) == {None, "b4"} and all(r["batch"] == 2 and r["ddim_steps"] == 2 for r in sampled.values())
    assert sampled["b4"]["overrides"][-1] == "train.batch_per_gpu=4" and sampled["b4"]["speedup"] > 0
    info = [json.loads(line) for line in (out / "provenance.jsonl").read_text().splitlines()]
    assert len(info) == 1 and info[0]["date_utc"] and info[0]["devices"] == ["CPU"]
    assert "--variant b4 train.batch_per_gpu=4" in info[0]["command"] and "--concurrent 2" in info[0]["command"]
    printed = capsys.readouterr().out
    assert "DDIM sampling" in printed and "measured " in printed and "fast (b4)" in printed

    # --collect rebuilds both tables, and says when and how the records were made
    (out / "sampling.json").unlink()
    assert main(["bench", "--collect", "--out", str(out)]) == 0
    assert len(json.loads((out / "sampling.json").read_text())) == 2
    printed = capsys.readouterr().out
    assert "DDIM sampling" in printed and info[0]["command"] in printed


def test_bench_dry_run_plans_groups_gpus_and_sampling(tmp_path, capsys):
    out = tmp_path / "plan"
    assert main(["bench", "--preset", "small", "xl", "--gpus", "1,4", "--recipe", "fast,plain", "--dry-run",
                 "--variant", "nocompress", "runtime.ddp_bf16_compress=off", "--concurrent", "4", "--sampling",
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert not out.exists()  # nothing started, nothing written
    # 2 presets x (fast, fast nocompress, plain) x (1, 4 GPUs), one-GPU runs first, four at a time
    assert "12 runs in 3 group(s) of at most 4" in printed
    first, second = printed.split("group 1:")[1].split("group 2:")
    assert "small-fast-1gpu" in first and "xl-plain-1gpu" not in first and "-4gpu" not in first
    gpus = [line.split()[0] for line in first.splitlines() if "CUDA_VISIBLE_DEVICES" in line]
    assert gpus == [f"CUDA_VISIBLE_DEVICES={i}" for i in range(4)]  # round robin over the GPUs
    assert first.count("--turns") == 4 and first.count("turns/PID-0:4") == 4
    assert "--label nocompress" in printed and "--set runtime.ddp_bf16_compress=off" in printed
    assert "--nproc_per_node=4" in printed.split("group 3:")[1]
    assert "sampling-xl-nocompress: " in printed and "--batch 16 --steps 50 --repeats 3" in printed


def test_bench_rejects_bad_variants_before_starting(capsys):
    assert main(["bench", "--dry-run", "--variant", "x", "runtime.nope=1"]) == 2
    err = capsys.readouterr().err
    assert "unknown config key 'runtime.nope'" in err and "(variant x)" in err
    assert main(["bench", "--dry-run", "--variant", "runtime.attention=sdpa"]) == 2
    assert "is not a name" in capsys.readouterr().err
    assert main(["bench", "--dry-run", "--variant", "a", "--variant", "a"]) == 2
    assert "given twice" in capsys.readouterr().err
    assert main(["bench", "--dry-run", "--recipe", "plain", "--variant", "a"]) == 2
    assert "--recipe has no fast" in capsys.readouterr().err


def test_gpu_reproduction_script_dry_runs_on_the_cpu(tmp_path):
    """scripts/gpu/reproduce.sh: the diffscale bench calls behind docs/benchmarks.md's current
    figures; --dry-run prints them without a GPU."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(["bash", str(root / "scripts" / "gpu" / "reproduce.sh"), str(tmp_path / "out"), "--dry-run"],
                          cwd=root, env=dict(os.environ, PYTHON=sys.executable), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "group 1:" in done.stdout and "sampling-xl: " in done.stdout and "--nproc_per_node=4" in done.stdout
    assert "CUDA_VISIBLE_DEVICES=3 " in done.stdout  # planned as on a 4-GPU host: one-GPU runs spread
    assert not (tmp_path / "out").exists()


def test_profile_kinds_classify_kernel_names():
    from diffscale.bench.profile import kind_of

    assert kind_of("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc") == "convolution"
    assert kind_of("triton_per_fused_native_group_norm_silu_3") == "fused (Triton)"
    assert kind_of("triton_poi_fused__to_copy_convolution_1") == "fused (Triton)"
    assert kind_of("pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits>") == "attention"
    assert kind_of("ncclDevKernel_AllReduce_Sum_bf16_RING_LL") == "communication"
    assert kind_of("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>") \
        == "optimizer/EMA"
    assert kind_of("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64") == "matmul"


def test_derived_columns():
    rows = [
        {"preset": "s", "recipe": "fast", "world_size": 1, "samples_per_s": 100.0},
        {"preset": "s", "recipe": "fast", "world_size": 4, "samples_per_s": 380.0},
        {"preset": "s", "recipe": "plain", "world_size": 1, "samples_per_s": 40.0},
        {"preset": "s", "recipe": "fast", "world_size": 1, "samples_per_s": 110.0, "label": "cl"},
        {"preset": "s", "recipe": "fast", "world_size": 4, "samples_per_s": 418.0, "label": "cl"},
        {"preset": "s", "recipe": "fast", "world_size": 4, "samples_per_s": 360.0, "label": "b25"},
    ]
    add_derived(rows)
    assert rows[1]["scaling_efficiency"] == pytest.approx(0.95)
    assert rows[0]["fast_over_plain"] == pytest.approx(2.5)
    assert rows[1]["fast_over_plain"] is None  # no plain run on 4 GPUs to compare with
    assert rows[4]["scaling_efficiency"] == pytest.approx(0.95)  # against its own 1-GPU run
    assert rows[5]["scaling_efficiency"] == pytest.approx(0.90)  # none of its own: the unlabelled one


def test_bench_rejects_bad_arguments(capsys):
    assert main(["bench", "--preset", "huge"]) == 2
    assert "unknown preset 'huge'" in capsys.readouterr().err
    assert main(["bench", "--gpus", "one"]) == 2
    assert "--gpus 'one' is not a list of numbers" in capsys.readouterr().err
    assert main(["bench", "--trace"]) == 2
    assert "add --profile N" in capsys.readouterr().err


def test_fast_path_loss_matches_plain_path_within_bf16_tolerance():
    """The fast recipe's numerics (bf16 autocast, channels_last) against fp32 / contiguous,
    on the same batch, noise and timesteps."""
    cfg = merge(get_preset("tiny"), {"model": {"sample_size": 16}})
    task = ImageTask(cfg, torch.device("cpu"))
    torch.manual_seed(0)
    net = task.build_network()
    batch = task.draw(torch.arange(32), torch.Generator().manual_seed(1))
    rows = slice(0, 32)
    with torch.no_grad():
        plain = task.loss(net, batch, rows, channels_last=False)
        fast_net = net.to(memory_format=torch.channels_last)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            fast = task.loss(fast_net, batch, rows, channels_last=True)
    assert torch.isfinite(plain) and torch.isfinite(fast)
    assert fast.item() == pytest.approx(plain.item(), rel=2e-2)


def test_sampling_bench_compares_with_ddimpipeline_on_cpu(tmp_path, capsys):
    from diffscale.bench import sampling

    out = tmp_path / "sampling.json"
    assert sampling.main(["--preset", "tiny", "--batch", "2", "--steps", "3", "--repeats", "1", "--json", str(out),
                          "--set", "model.block_out_channels=[16,32,32]", "--strong-reference"]) == 0
    record = json.loads(out.read_text())
    # beside the pipeline as shipped, the pipeline with fp16 weights (compiled only on CUDA)
    assert record["pipeline_strong_s"] > 0 and record["speedup_vs_strong"] > 0
    setup = record["pipeline_strong_setup"]
    assert setup.startswith("fp16 weights, channels_last, torch.compile(mode='reduce-overhead'")
    assert record["ddim_steps"] == 3 and record["batch"] == 2
    assert record["ddimpipeline_s"] > 0 and record["diffscale_s"] > 0 and record["speedup"] > 0
    assert record["precision"] == "fp32" and record["compiled"] is False  # CPU: eager fp32, like the CLI
    assert record["overrides"] == ["model.block_out_channels=[16,32,32]"]


def test_profile_counts_operators_not_annotation_ranges(tmp_path):
    from torch.profiler import record_function

    from diffscale.bench.profile import STEP_RANGE, profile_steps

    def step():
        with record_function("nccl:all_reduce"):  # a range around work that is counted itself
            torch.ones(64, 64) @ torch.ones(64, 64)

    trace = tmp_path / "traces" / "rank0.json"
    prof = profile_steps(step, 2, torch.device("cpu"), trace=trace)
    names = [row["name"] for row in prof["top"]]
    assert "aten::mm" in names and "nccl:all_reduce" not in names
    assert not any(name.startswith(STEP_RANGE) for name in names)  # the profiled steps' own ranges
    assert prof["kinds"]["matmul"]["ms"] > 0
    assert "idle_ms_per_step" not in prof  # GPU idle time only where there is a GPU timeline
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("name") == "aten::mm" for e in events)


def test_gpu_idle_is_span_minus_the_union_of_kernels():
    from diffscale.bench.profile import gpu_timeline_us

    # two streams overlap (0-10 and 5-12: busy 12), a 3 us launch gap, 15-20, a 30 us host gap
    assert gpu_timeline_us([(15, 20), (0, 10), (5, 12), (6, 8), (50, 60)]) == (27, 60, 30)
    assert gpu_timeline_us([]) == (0.0, 0.0, 0.0)


def test_bus_bandwidth_is_nccl_tests_formula():
    from diffscale.bench.comm import bus_bandwidth_gbs

    assert bus_bandwidth_gbs(10**9, 1.0, 2) == pytest.approx(1.0)  # 2 ranks: (n-1)/n * 2 = 1
    assert bus_bandwidth_gbs(10**9, 1.0, 4) == pytest.approx(1.5)


def test_bench_comm_check_reports_each_size(tmp_path):
    from diffscale.bench.cli import comm_check

    with open(tmp_path / "log", "w") as log:
        rows = comm_check(2, tmp_path / "comm-2.json", log, mib=("1", "2"), repeats=2, timeout=120)
    assert [r["mib"] for r in rows] == [1.0, 2.0]  # a real 2-rank process group (gloo on the CPU)
    assert all(r["world_size"] == 2 and r["backend"] == "gloo" and r["bus_gbs"] > 0 for r in rows)
    assert "all-reduce     1.0 MiB x2 (gloo)" in (tmp_path / "log").read_text()


def test_gpu_profile_counts_the_steps_after_the_first():
    """On a GPU each profiled step's range is mirrored around its kernels; the first step
    (queue refilling after a synchronisation) is left out. No GPU in CI: events as the
    profiler lists them."""
    from types import SimpleNamespace as NS

    from diffscale.bench.profile import STEP_RANGE, _gpu_kernels

    cuda = torch.autograd.DeviceType.CUDA

    def event(name, start, end, annotation=False):
        return NS(name=name, device_type=cuda, is_user_annotation=annotation, time_range=NS(start=start, end=end))

    events = [event(f"{STEP_RANGE}0", 0, 90, True), event("gap_before_host_is_ahead", 0, 90),
              event(f"{STEP_RANGE}1", 100, 170, True), event("conv", 100, 160),
              event("nccl:all_reduce", 150, 170, True),
              event("ncclAllReduce", 160, 170), event(f"{STEP_RANGE}2", 170, 240, True), event("conv", 170, 240),
              NS(name="cpu op", device_type=torch.autograd.DeviceType.CPU, is_user_annotation=False,
                 time_range=NS(start=0, end=300))]
    kernels, counted = _gpu_kernels(NS(events=lambda: events), steps=2)
    assert counted == 2 and [k[0] for k in kernels] == ["conv", "ncclAllReduce", "conv"]
    # without the mirrored ranges (an older profiler): every kernel, over every step
    kernels, counted = _gpu_kernels(NS(events=lambda: [e for e in events if not e.is_user_annotation]), steps=2)
    assert counted == 3 and len(kernels) == 4
