"""Conditional field diffusion: the built-in generator, the npz reader and its messages, the
network, the task protocol and its state, export, and the quality of a model trained on CPU."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

from diffscale.cli import main
from diffscale.config import from_dict
from diffscale.config.presets import get_preset
from diffscale.errors import UserError
from diffscale.evaluation import probabilistic as P
from diffscale.inference.trained import load_trained
from diffscale.runtime import checkpoint as ckpt
from diffscale.tasks.fields.data import FieldGenerator, load_fields, read_npz
from diffscale.tasks.fields.exported import load_export
from diffscale.tasks.fields.network import FieldMLP
from diffscale.tasks.registry import build_task
from diffscale.training.loop import train

CPU = torch.device("cpu")


def _config(source: str, **sections):
    data = {"task": "fields", "data": {"source": source},
            "model": {"hidden": 32, "depth": 2, "embed_dim": 16},
            "diffusion": {"num_train_timesteps": 50, "beta_schedule": "squaredcos_cap_v2",
                          "prediction_type": "v_prediction", "clip_sample": False},
            "train": {"steps": 10, "batch_per_gpu": 8}}
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **values}
    return from_dict(data)


def _npz(tmp_path, name="pairs.npz", n=24, c=3, shape=(10,), **override):
    gen = np.random.default_rng(0)
    arrays = {"cond": gen.normal(size=(n, c)), "x": gen.normal(size=(n, *shape)).astype(np.float32), **override}
    path = tmp_path / name
    np.savez(path, **{k: v for k, v in arrays.items() if v is not None})
    return path


# -- data ------------------------------------------------------------------------------------
def test_builtin_generator_is_seeded_conserving_and_its_ideal_forecast_is_right():
    gen = FieldGenerator()
    cond, x = gen.sample(2000, seed=5)
    assert cond.shape == (2000, 7) and x.shape == (2000, 256) and x.dtype == torch.float32
    assert torch.equal(gen.sample(2000, seed=5)[1], x) and not torch.equal(gen.sample(2000, seed=6)[1], x)
    assert (x.mean(1) - cond[:, 0]).abs().max() < 1e-4  # the fine mean is the coarse value
    mean, std = gen.ideal(cond)
    z = (x - mean) / std
    assert z.mean().abs() < 0.02 and (z.std() - 1).abs() < 0.02
    # An ensemble from the ideal distribution scores the closed-form CRPS of that distribution.
    members = gen.fields_for(cond[:200], torch.Generator().manual_seed(0), members=8)
    measured = P.crps_ensemble(members, x[:200]).mean()
    assert measured.item() == pytest.approx(P.crps_gaussian(mean[:200], std[:200], x[:200]).mean().item(), rel=0.03)


def test_data_specs_and_their_messages():
    assert load_fields("builtin:fields:100").x.shape == (100, 256)
    assert load_fields("builtin:fields", max_items=10).cond.shape == (10, 7)
    for spec, message in [("builtin:glyphs", "holds images, not fields -- for task fields use builtin:fields"),
                          ("builtin:fields:ten", "'ten' is not a positive number of pairs"),
                          ("imagefolder:/data", r"not field data -- for task fields use builtin:fields\[:N\] or npz"),
                          ("npz:", "has no path -- write npz:PATH"),
                          ("spool:/scratch/spool", r"is a spool directory, which is followed while training, not "
                                                   r"read at once -- train on it with diffscale train --data spool")]:
        with pytest.raises(UserError, match=message):
            load_fields(spec)


def test_npz_reader_takes_one_or_several_fields(tmp_path):
    one = read_npz(_npz(tmp_path, "one.npz"))
    assert one.cond.shape == (24, 3) and one.x.shape == (24, 10) and one.cond.dtype == torch.float32
    several = read_npz(_npz(tmp_path, "several.npz", shape=(10, 2)))
    assert several.x.shape == (24, 10, 2)
    assert "(24 pairs, cond 3 -> x 10 x 2)" in several.describe()


@pytest.mark.parametrize("override, message", [
    ({"x": None}, r"has no array 'x' \(it holds: cond\) -- save it with numpy.savez\(PATH, cond=cond, x=x\)"),
    ({"cond": np.zeros(24)}, r"array 'cond' in '.*' has shape \(24,\)"),
    ({"x": np.zeros((24, 2, 2, 2))}, r"array 'x' in '.*' has shape \(24, 2, 2, 2\)"),
    ({"x": np.zeros((23, 10))}, "holds 24 conditions but 23 fields -- store one condition row per field"),
    ({"x": np.array([["a"] * 10] * 24)}, "array 'x' in '.*' has dtype <U1 -- store numbers"),
    ({"cond": np.zeros((0, 3)), "x": np.zeros((0, 10))}, "holds no data"),
])
def test_npz_reader_messages(tmp_path, override, message):
    with pytest.raises(UserError, match=message):
        read_npz(_npz(tmp_path, **override))


def test_npz_reader_names_the_rows_holding_nan(tmp_path):
    x = np.ones((24, 10), dtype=np.float32)
    x[5, 3] = np.nan
    x[9, 0] = np.inf
    with pytest.raises(UserError, match=r"array 'x' .* NaN or infinite values in 2 rows \(first: row 5\) -- drop"):
        read_npz(_npz(tmp_path, x=x))


def test_npz_reader_missing_and_unreadable_files(tmp_path):
    with pytest.raises(UserError, match="does not exist -- check the path given to --data npz:PATH"):
        read_npz(tmp_path / "absent.npz")
    (tmp_path / "text.npz").write_text("not an archive")
    (tmp_path / "cut.npz").write_bytes(_npz(tmp_path).read_bytes()[:200])  # a copy that stopped half-way
    for name in ("text.npz", "cut.npz"):
        with pytest.raises(UserError, match="cannot read array file"):
            read_npz(tmp_path / name)
    np.savez(tmp_path / "objects.npz", cond=np.array([{"a": 1}] * 3, dtype=object), x=np.zeros((3, 2)))
    with pytest.raises(UserError, match="cannot read array file"):  # never unpickles
        read_npz(tmp_path / "objects.npz")


# -- network and task --------------------------------------------------------------------------
def test_network_keeps_the_field_shape_and_uses_time_and_condition():
    cfg = _config("builtin:fields", model={"fields": 2}).model
    net = FieldMLP(cfg, cond_dim=3, x_dim=10)
    x, t, cond = torch.randn(4, 10, 2), torch.randint(0, 50, (4,)), torch.randn(4, 3)
    for block in net.blocks:  # blocks start as the identity, where time and condition do not act yet
        torch.nn.init.normal_(block.outer.weight)
    out = net(x, t, cond)
    assert out.shape == (4, 10, 2)
    assert not torch.allclose(out, net(x, t + 1, cond)) and not torch.allclose(out, net(x, t, cond + 1))
    out.square().mean().backward()
    assert all(p.grad is not None for p in net.parameters())


def test_task_reads_sizes_from_the_data_and_checks_the_config(tmp_path):
    path = _npz(tmp_path, shape=(10, 2))
    with pytest.raises(UserError, match="config model.fields is 1 but npz:.* has 2 -- set model.fields to 2"):
        build_task(_config(f"npz:{path}"), CPU)
    task = build_task(_config(f"npz:{path}", model={"fields": 2}), CPU)
    assert task.num_items() == 24 and task.x_shape == (10, 2)
    assert task.signature() == {"task": "fields", "cond_dim": 3, "x_dim": 10, "fields": 2, "hidden": 32, "depth": 2,
                                "embed_dim": 16}
    with pytest.raises(UserError, match="config model.cond_dim is 7 but npz:.* has 3 -- set model.cond_dim to 3"):
        build_task(_config(f"npz:{path}", model={"fields": 2, "cond_dim": 7}), CPU)
    with pytest.raises(UserError, match="model.coarse_index: 5 is past the condition's 3 values -- use 0..2, or -1"):
        build_task(_config(f"npz:{path}", model={"fields": 2, "coarse_index": 5}), CPU)
    with pytest.raises(UserError, match="diffusion.clip_sample is true.* -- set diffusion.clip_sample: false"):
        build_task(_config(f"npz:{path}", diffusion={"clip_sample": True}), CPU)
    with pytest.raises(UserError, match="sizes are unknown without data .* -- set model.cond_dim and model.x_dim"):
        build_task(_config("builtin:fields"), CPU, load_data=False)
    with pytest.raises(UserError, match="written by a 'images' run, not a fields run"):
        build_task(_config("builtin:fields"), CPU, load_data=False, signature={"task": "images", "channels": 1})


def test_state_round_trip_lets_a_task_without_data_generate_the_same_fields(tmp_path):
    task = build_task(_config(f"npz:{_npz(tmp_path)}"), CPU)
    batch = task.draw(torch.arange(8), torch.Generator().manual_seed(0))
    examples = task.examples(batch, slice(0, 8))
    assert examples["x"].shape == (8, 10) and examples["cond"].shape == (8, 3)
    assert examples["x"].mean().abs() < 1 and task.stats.x_std.shape == (10,)  # standardised per feature
    assert torch.isfinite(task.loss(task.build_network(), batch, slice(0, 4), channels_last=False))
    net = task.build_network().eval()
    bare = build_task(_config(f"npz:{tmp_path / 'absent.npz'}"), CPU, load_data=False, signature=task.signature())
    bare.load_state_tensors(task.state_tensors())
    for key, value in task.state_tensors().items():
        assert torch.equal(bare.state_tensors()[key], value)
    full = task.generate(net, count=6, steps=5, seed=3).samples
    assert full.shape == (6, 10)
    assert torch.allclose(bare.generate(net, count=6, steps=5, seed=3).samples, full)
    halves = [task.generate(net, count=6, steps=5, seed=3, rows=slice(i, i + 3)).samples for i in (0, 3)]
    assert torch.allclose(torch.cat(halves), full, atol=1e-6)  # ranks sharing the work give the same fields
    with pytest.raises(UserError, match="field statistics .* do not fit"):
        bare.load_state_tensors({**task.state_tensors(), "x_mean": torch.zeros(11)})


def test_preview_plot_export_and_reference_loop(tmp_path):
    task = build_task(_config(f"npz:{_npz(tmp_path, shape=(16,))}"), CPU)
    net = task.build_network().eval()
    generated = task.generate(net, count=8, steps=4, seed=0)
    [png] = task.write_samples(generated, tmp_path / "samples" / "preview.png")
    with Image.open(png) as image:
        assert image.size[0] > 300
    how = task.export(net, tmp_path / "export")
    assert "load_export" in how
    loaded_task, loaded_net = load_export(tmp_path / "export")
    cond = torch.randn(3, 3)
    assert torch.allclose(loaded_task.sample_for(loaded_net, cond, members=2, steps=4, seed=1),
                          task.sample_for(net, cond, members=2, steps=4, seed=1))
    with pytest.raises(UserError, match="is not empty"):
        task.export(net, tmp_path / "export")
    reference = task.reference_data()
    examples = reference.collate([reference.dataset[i] for i in range(4)])
    assert examples["x"].shape == (4, 16) and torch.isfinite(task.reference_loss(net, examples))


def test_field_presets_train_on_builtin_data_by_default():
    cfg = get_preset("field-icon")
    assert (cfg.task, cfg.train.batch_per_gpu, cfg.diffusion.num_train_timesteps) == ("fields", 16, 50)
    task = build_task(cfg, CPU)
    assert (task.cond_dim, task.x_dim, task.num_items()) == (7, 256, 3840)
    assert sum(p.numel() for p in task.build_network().parameters()) < 2_000_000
    assert get_preset("field-large").model.hidden == 1024


# -- through the loop and the verbs --------------------------------------------------------------
MICRO_FIELDS = ["--preset", "field-icon", "--set", "data.source=builtin:fields:256", "--set", "model.hidden=32",
                "--set", "model.depth=1", "--set", "model.embed_dim=16", "--set", "train.steps=4",
                "--set", "train.log_every=2", "--set", "train.sample_count=8", "--set", "train.sample_steps=3"]


def test_train_sample_eval_and_export_verbs_on_a_field_run(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--out", str(run), *MICRO_FIELDS]) == 0
    assert "(fields)" in capsys.readouterr().err and (run / "samples" / "latest.png").is_file()
    assert main(["sample", str(run), "--n", "8", "--steps", "3", "--out", str(tmp_path / "s.png")]) == 0
    with Image.open(tmp_path / "s.png") as image:
        assert image.size[0] > 300
    capsys.readouterr()
    assert main(["eval", str(run), "--count", "4", "--steps", "3", "--json"]) == 0
    captured = capsys.readouterr()
    record = json.loads(captured.out)  # the one JSON line alone on stdout: the progress is on stderr
    assert "sampling: " in captured.err and "training the deterministic baseline (4 steps)" in captured.err
    assert record["task"] == "fields" and record["members"] == 4 and record["crps"] > 0
    assert all(isinstance(record[k], int) for k in ("members", "cases", "sampling_steps", "baseline_steps"))
    assert main(["eval", str(run), "--count", "1"]) == 2  # refused before sampling, naming the minimum
    assert capsys.readouterr().err.strip() == (
        "error: --count 1: a fields evaluation scores ensembles, and the spread-skill ratio and rank histogram need "
        "at least 2 members -- pass --count 2 or more (default 16)")
    assert main(["eval", str(run), "--features", "mine:build"]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: fields runs are evaluated without a feature network: --features (train.eval_features) is for image "
        "runs -- drop --features")
    assert main(["eval", str(run), "--count", "4", "--steps", "3", "--sampler", "dpmsolver", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["crps"] > 0
    assert (run / "eval" / "step_00000004" / "evaluation.png").is_file()
    assert json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["kind"] == "eval"
    assert main(["export", str(run), "--diffusers", str(tmp_path / "export")]) == 0
    task, network = load_export(tmp_path / "export")
    assert task.sample_for(network, torch.zeros(2, 7), members=3, steps=3, seed=0).shape == (2, 3, 256)
    # the loading hint export prints (and the model card shows) runs as written, its cond a NumPy array
    how = capsys.readouterr().out.split("(load with ", 1)[1].rsplit("); model card:", 1)[0]
    scope: dict = {}
    exec(how.replace("members=16", "members=2"), scope)
    assert "cond = np.zeros((4, 7))" in how and "steps=3" in how
    assert task.sample_for(network, np.zeros((4, 7)), members=2, steps=3, seed=0).shape == (4, 2, 256)


def test_resuming_a_field_run_restores_its_statistics(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--out", str(run), "--max-steps", "2", *MICRO_FIELDS]) == 0
    saved = ckpt.load_latest(run).task
    assert saved["x_std"].shape == (256,) and saved["cond_mean"].shape == (7,)
    assert main(["train", "--out", str(run), "--resume", "auto", *MICRO_FIELDS]) == 0
    assert "resumed from step 2" in capsys.readouterr().err
    assert torch.equal(ckpt.load_latest(run).task["x_std"], saved["x_std"])


# -- quality ------------------------------------------------------------------------------------
def test_diffusion_beats_climatology_and_a_deterministic_mlp_with_calibrated_spread(tmp_path):
    """On the built-in generator (7 -> 256, held-out conditions): CRPS below climatology and below
    a deterministic MLP of the same size trained as long on the same data; spread-skill 0.8-1.2."""
    cfg = _config("builtin:fields", model={"hidden": 256, "depth": 2, "embed_dim": 64},
                  optim={"lr": 2e-3, "warmup_steps": 50},
                  train={"steps": 600, "batch_per_gpu": 64, "ema_decay": 0.995, "log_every": 100,
                         "checkpoint_every": 600, "sample_count": 8, "sample_steps": 10},
                  runtime={"device": "cpu"})
    assert train(cfg, tmp_path / "run").finished
    trained = load_trained(tmp_path / "run", "cpu")
    scores = trained.task.evaluate(trained.network, tmp_path, count=16, steps=50, seed=0, cases=64)
    print({k: round(v, 4) for k, v in scores.items()})
    assert scores["crps"] < scores["crps_climatology"]
    assert scores["crps"] < scores["crps_mlp"]
    assert 0.8 <= scores["spread_skill"] <= 1.2
    assert scores["crps_ideal"] <= scores["crps"]  # nothing beats the true distribution
    assert (tmp_path / "evaluation.png").is_file()
