"""The attention benchmark's shapes and its refusal without a GPU (its GPU figures:
docs/benchmarks.md, "Attention kernels")."""

from collections import Counter


def test_the_attention_benchmark_times_the_presets_own_calls():
    from benchmarks.attention import attention_calls

    # (heads, tokens, head channels) per forward: 2 down + 3 up layers per level, 1 in the middle
    assert attention_calls("small") == Counter({(8, 196, 8): 5, (16, 49, 8): 6})
    assert attention_calls("medium") == Counter({(32, 256, 8): 5, (32, 64, 8): 1})
    assert attention_calls("xl") == Counter({(64, 64, 8): 5, (64, 16, 8): 1})


def test_the_attention_benchmark_says_it_needs_a_gpu(capsys):
    from benchmarks.attention import main as bench_attention

    assert bench_attention(["--preset", "small"]) == 2
    assert "no CUDA GPU is visible" in capsys.readouterr().out

