"""benchmarks.latency times any task's generation through the protocol (here on the CPU)."""

import json

from benchmarks import latency


def test_latency_records_percentiles_of_each_call(tmp_path, capsys):
    out = tmp_path / "latency.json"
    args = ["--preset", "tiny", "--count", "2", "--steps", "2", "--repeats", "3", "--warmup", "1",
            "--device", "cpu", "--set", "model.sample_size=8", "--set", "model.block_out_channels=[8,16]",
            "--set", "model.attention=[false,true]", "--set", "model.norm_num_groups=8", "--json", str(out)]
    assert latency.main(args) == 0
    record = json.loads(out.read_text())
    assert record == json.loads(capsys.readouterr().out)
    assert record["task"] == "images" and record["count"] == 2 and record["repeats"] == 3
    assert 0 < record["p50_ms"] <= record["p99_ms"] and record["device"] == "CPU" and not record["compiled"]


def test_online_bench_times_a_round_sampling_and_pushes_during_training(tmp_path):
    from benchmarks import online

    out = tmp_path / "online.json"
    assert online.main(["--device", "cpu", "--outputs", "2", "--round-steps", "3", "--warmup", "1", "--repeats", "2",
                        "--pushes", "3", "--push-gap-ms", "1", "--sample-steps", "2", "--members", "2",
                        "--set", "model.hidden=32", "--set", "model.depth=1", "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["round_steps"] == 3 and record["round_s"] > 0 and record["device"] == "CPU"
    assert record["sampling"]["cells"] == 80 and record["sampling"]["p50_ms"] > 0
    assert record["sampling"]["start_noise"] == {"ahead": 2}  # each drawn during the call before
    assert record["sampling"]["unforeseen_seeds"]["p50_ms"] > 0
    assert record["push"]["count"] == 3 and 0 < record["push"]["p50_ms"] <= record["push"]["p99_ms"]


def test_compare_loop_times_per_call_graphs_beside_and_both_give_the_same_samples(tmp_path):
    out = tmp_path / "latency.json"
    assert latency.main(["--preset", "policy-tiny", "--count", "1", "--steps", "3", "--repeats", "2", "--warmup", "1",
                         "--device", "cpu", "--compare-loop", "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["loop_graph"] is False  # recorded loops are a CUDA feature: the CPU samples step by step
    assert record["per_call_graphs"]["p50_ms"] > 0 and record["max_abs_diff"] == 0.0


def test_controller_mode_times_replanning_and_pop_only_steps_apart(tmp_path):
    out = tmp_path / "controller.json"
    # compile off: the controller's network stays eager instead of compiling on the CPU (most of this
    # test's time otherwise); the compiled controller is checked in tests/unit/test_controller.py
    assert latency.main(["--preset", "policy-tiny", "--controller", "--count", "3", "--steps", "2", "--repeats", "3",
                         "--warmup", "1", "--sampler", "ddpm", "--device", "cpu", "--set", "runtime.compile=off",
                         "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["mode"] == "controller" and record["batch"] == 3 and record["action_horizon"] == 8
    assert record["replans"] == 3 and 0 < record["replan"]["p50_ms"] <= record["replan"]["p99_ms"]
    assert 0 < record["pop"]["p50_ms"] < record["replan"]["p50_ms"] and record["loop_graph"] is False


def test_sampling_graph_on_without_a_gpu_is_one_clear_error():
    import pytest
    import torch

    from diffscale import config as C
    from diffscale.diffusion.inference import sampling_network
    from diffscale.errors import UserError

    cfg = C.resolve_config(C.ConfigSources(preset="policy-tiny", device="cpu",
                                           overrides=["runtime.sampling_graph=on"]))
    with pytest.raises(UserError) as err:
        sampling_network(torch.nn.Linear(2, 2), cfg.runtime)
    assert err.value.cause == "runtime.sampling_graph on needs a CUDA GPU (this run samples on cpu)"
    assert err.value.fix == "set runtime.sampling_graph to auto or off"
