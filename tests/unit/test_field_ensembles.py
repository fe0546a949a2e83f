"""Ensembles of a field run for the user's own conditions (``diffscale sample --cond``, and
``sample_ensembles`` from Python), and ``eval --data`` on given held-out pairs."""

from __future__ import annotations

import json

import numpy as np
import pytest

import diffscale
from diffscale.cli import main
from diffscale.tasks.fields.data import FieldGenerator

SMALL = ["--set", "model.hidden=32", "--set", "model.depth=1", "--set", "model.embed_dim=16", "--set", "train.steps=4",
         "--set", "train.log_every=2", "--set", "train.sample_count=8", "--set", "train.sample_steps=3"]


@pytest.fixture(scope="module")
def npz_run(tmp_path_factory):
    """A run on an npz file of 4 -> 24 pairs, its sizes following the data (model.x_dim=0, cond_dim=0)."""
    root = tmp_path_factory.mktemp("fields")
    rng = np.random.default_rng(0)
    cond = rng.normal(size=(96, 4)).astype(np.float32)
    x = (cond @ rng.normal(size=(4, 24)) + 10).astype(np.float32)
    np.savez(root / "train.npz", cond=cond, x=x)
    np.savez(root / "held.npz", cond=cond[:12] + 0.5, x=x[:12])
    run = root / "run"
    assert main(["train", "--out", str(run), "--preset", "field-icon", "--data", f"npz:{root / 'train.npz'}",
                 "--set", "model.x_dim=0", "--set", "model.cond_dim=0", "--set", "model.coarse_index=-1",
                 *SMALL]) == 0
    return run


def test_sample_cond_writes_ensembles_and_conditions_in_the_data_units(npz_run, tmp_path, capsys):
    cond = np.linspace(-1, 1, 5 * 4).reshape(5, 4)
    np.save(tmp_path / "cond.npy", cond)
    capsys.readouterr()
    out = tmp_path / "ens.npz"
    assert main(["sample", str(npz_run), "--cond", str(tmp_path / "cond.npy"), "--members", "3", "--steps", "3",
                 "--seed", "2", "--out", str(out)]) == 0
    assert capsys.readouterr().out.split() == [str(out)]
    with np.load(out) as written:
        assert sorted(written.files) == ["cond", "ensembles"]
        ensembles, kept = written["ensembles"], written["cond"]
    assert ensembles.shape == (5, 3, 24) and ensembles.dtype == np.float32
    assert np.allclose(kept, cond) and abs(float(ensembles.mean()) - 10) < 5  # the data's units, not standardised
    # the Python call gives the same ensembles; an .npz with the training data's 'cond' array the same too
    again = diffscale.sample_ensembles(npz_run, cond, members=3, steps=3, seed=2)
    assert np.array_equal(again, ensembles)
    np.savez(tmp_path / "cond.npz", cond=cond, x=np.zeros((5, 24)))
    assert main(["sample", str(npz_run), "--cond", str(tmp_path / "cond.npz"), "--members", "3", "--steps", "3",
                 "--seed", "2"]) == 0
    default = npz_run / "samples" / "ensembles_cond_seed2.npz"
    assert capsys.readouterr().out.split() == [str(default)]
    with np.load(default) as written:
        assert np.array_equal(written["ensembles"], ensembles)
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]


def test_sample_cond_of_the_wrong_width_is_one_error_and_writes_nothing(npz_run, tmp_path, capsys):
    np.save(tmp_path / "cond.npy", np.zeros((5, 7)))
    capsys.readouterr()
    assert main(["sample", str(npz_run), "--cond", str(tmp_path / "cond.npy"), "--out", str(tmp_path / "e.npz")]) == 2
    assert capsys.readouterr().err.strip() == ("error: conditions of shape (5, 7) do not fit this model, which takes "
                                               "N x 4 -- pass an N x 4 array of conditions in the data's units")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cond.npy"]


def test_eval_scores_given_held_out_pairs_and_says_when_it_scores_training_rows(npz_run, capsys):
    capsys.readouterr()
    assert main(["eval", str(npz_run), "--count", "2", "--steps", "2", "--json"]) == 0
    captured = capsys.readouterr()
    record = json.loads(captured.out.strip().splitlines()[-1])
    assert record["held_out"] == 0 and "data" not in record
    assert captured.err.strip().splitlines()[-1] == ("note: scored on 96 rows of the training data (held_out 0): "
                                                     "pass --data npz:HELDOUT for pairs the model has not seen")
    held = npz_run.parent / "held.npz"
    assert main(["eval", str(npz_run), "--count", "2", "--steps", "2", "--json", "--data", f"npz:{held}"]) == 0
    captured = capsys.readouterr()
    record = json.loads(captured.out.strip().splitlines()[-1])
    assert record["held_out"] == 1 and record["cases"] == 12 and record["data"] == f"npz:{held}"
    assert "note:" not in captured.err


def test_eval_of_held_out_pairs_of_other_sizes_is_one_error_and_writes_nothing(npz_run, tmp_path, capsys):
    cond, x = FieldGenerator().sample(8, 3)
    np.savez(tmp_path / "other.npz", cond=cond.numpy(), x=x.numpy())
    evaluations = sorted((npz_run / "eval").rglob("*")) if (npz_run / "eval").exists() else []
    lines = (npz_run / "metrics.jsonl").read_text()
    capsys.readouterr()
    assert main(["eval", str(npz_run), "--data", f"npz:{tmp_path / 'other.npz'}"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: npz:{tmp_path / 'other.npz'} holds cond 7 -> x 256 x 1 but this run was trained for cond 4 -> "
        "x 24 x 1 -- pass held-out pairs of the sizes of the run's training data")
    assert (sorted((npz_run / "eval").rglob("*")) if (npz_run / "eval").exists() else []) == evaluations
    assert (npz_run / "metrics.jsonl").read_text() == lines


def test_sample_cond_is_refused_for_a_policy_run_through_its_task(tmp_path, capsys):
    run = tmp_path / "policy"
    assert main(["train", "--out", str(run), "--preset", "policy-tiny", "--set", "model.down_dims=[16,32]",
                 "--set", "model.step_embed_dim=16", "--set", "train.batch_per_gpu=16", "--set", "train.steps=2",
                 "--set", "data.max_items=20", "--set", "train.sample_count=4", "--set", "train.sample_steps=3"]) == 0
    np.save(tmp_path / "cond.npy", np.zeros((2, 4)))
    capsys.readouterr()
    assert main(["sample", str(run), "--cond", str(tmp_path / "cond.npy"), "--out", str(tmp_path / "e.npz")]) == 2
    assert capsys.readouterr().err.strip().startswith("error: policy runs plan from observation histories")
    assert main(["eval", str(run), "--data", "npz:held.npz"]) == 2
    assert capsys.readouterr().err.strip() == ("error: policy runs are not scored on given pairs: --data is for "
                                               "fields runs -- drop --data")
    assert not (tmp_path / "e.npz").exists()
