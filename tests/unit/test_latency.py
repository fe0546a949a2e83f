"""bench.latency times any task's generation through the protocol (here on the CPU)."""

import json

from diffscale.bench import latency


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
