"""The suite's data sets: shapes, determinism, what sets them apart, and that diffscale reads them."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from benchmarks.suite import generate
from benchmarks.suite.fields import fronts, rain
from benchmarks.suite.images import GENERATORS, describe
from benchmarks.suite.policies import routes, wobbly
from benchmarks.suite.sets import CHUNK, SETS, chosen, image_array
from diffscale.errors import UserError
from diffscale.tasks.policy.envs.reach2d import GOAL_TOLERANCE, ROUTES, TWO_WAYS


@pytest.mark.parametrize("name", list(GENERATORS))
def test_each_image_generator_gives_its_shape_dtype_and_labels_the_same_for_a_seed(name):
    _, px, channels = GENERATORS[name]
    images, labels = image_array(name, 12, seed=3)
    assert images.dtype == np.uint8 and images.shape == (12, px, px) + ((3,) if channels == 3 else ())
    assert labels.dtype == np.int64 and labels.shape == (12,) and labels.min() >= 0
    again, again_labels = image_array(name, 12, seed=3)
    assert np.array_equal(images, again) and np.array_equal(labels, again_labels)
    other, _ = image_array(name, 12, seed=4)
    assert not np.array_equal(images, other)
    assert len({im.tobytes() for im in images}) == 12  # no two images alike
    assert images.std() > 10  # not blank


STATS = {name: describe(image_array(name, 64)[0]) for name in GENERATORS}


def test_each_image_set_has_the_property_it_is_named_for():
    s = STATS
    assert s["strokes"]["sparse_share"] > 0.85 and s["strokes"]["edge_share"] < 0.15  # thin strokes on black
    assert s["textures"]["flat_share"] < 0.02 and s["textures"]["sparse_share"] < 0.4  # dense, nothing flat
    assert s["flat"]["flat_share"] > 0.85 and s["flat"]["high_freq"] < 0.1  # large flat regions
    assert s["colour"]["colourfulness"] > 0.3 and s["clouds"]["colourfulness"] > 0.2
    assert all(s[n]["colourfulness"] == 0 for n in ("strokes", "textures", "flat", "hifreq"))
    assert s["hifreq"]["high_freq"] > 0.35 and s["hifreq"]["edge_share"] == max(v["edge_share"] for v in s.values())
    assert s["clouds"]["high_freq"] == min(v["high_freq"] for v in s.values()) and s["clouds"]["flat_share"] < 0.05


def test_every_two_image_sets_differ_in_a_statistic_or_their_format():
    resolutions = {GENERATORS[n][1:] for n in GENERATORS}
    assert {64, 128} <= {px for px, _ in resolutions} and {1, 3} == {c for _, c in resolutions}
    for a, b in itertools.combinations(GENERATORS, 2):
        gap = max(abs(STATS[a][k] - STATS[b][k]) for k in STATS[a])
        assert gap >= 0.1 or GENERATORS[a][1:] != GENERATORS[b][1:], (a, b, STATS[a], STATS[b])
        assert gap >= 0.05, (a, b)


def test_an_image_set_written_in_chunks_is_the_one_in_memory_and_diffscale_reads_it(tmp_path):
    from diffscale.tasks.images.sources import load_images, load_labels

    count = CHUNK + 5  # two chunks, the second short
    path = SETS["strokes"].ensure(tmp_path, count, seed=1)
    with np.load(path) as archive:
        images, labels = archive["images"], archive["labels"]
    expected, expected_labels = image_array("strokes", count, seed=1)
    assert np.array_equal(images, expected) and np.array_equal(labels, expected_labels)
    loaded = load_images(f"npz:{path}", 16)
    assert loaded.shape == (count, 1, 16, 16)
    found = load_labels(f"npz:{path}", count)
    assert found is not None and found[1] == ["0", "1", "2", "3"]
    mtime = path.stat().st_mtime_ns
    assert SETS["strokes"].ensure(tmp_path, count, seed=1) == path and path.stat().st_mtime_ns == mtime  # kept


@pytest.mark.parametrize("name", list(GENERATORS))
def test_every_image_set_loads_at_a_presets_resolution_with_its_channels_and_labels(tmp_path, name):
    from diffscale.tasks.images.sources import load_images, load_labels

    path = SETS[name].ensure(tmp_path, 8)
    assert load_images(f"npz:{path}", 16).shape == (8, GENERATORS[name][2], 16, 16)
    found = load_labels(f"npz:{path}", 8)
    assert found is not None and len(found[0]) == 8


def test_fronts_are_bimodal_and_conserve_the_coarse_value(tmp_path):
    from diffscale.tasks.fields.data import load_fields

    cond, x = fronts(np.random.default_rng(0), 2000)
    assert cond.shape == (2000, 7) and x.shape == (2000, 256) and x.dtype == np.float32
    assert np.allclose(x.mean(axis=1), cond[:, 0], atol=1e-4)
    centre = x[:, 8 * 16 + 8] - cond[:, 0]  # a value near the cell's middle, relative to the cell mean
    near_middle = (np.abs(centre) < 0.25).mean()
    away = (np.abs(centre) > 0.75).mean()
    assert away > 0.6 and near_middle < 0.1  # two separated modes, little mass between them
    train = SETS["fronts"].ensure(tmp_path, 64)
    data = load_fields(f"npz:{train}")
    assert data.cond.shape == (64, 7) and data.x.shape == (64, 256)
    held_out = load_fields(SETS["fronts"].eval_args(tmp_path, 64)[1])
    assert held_out.x.shape == (1024, 256) and not np.array_equal(held_out.x[:64].numpy(), data.x.numpy())


def test_rain_is_intermittent_and_heavy_tailed():
    cond, x = rain(np.random.default_rng(0), 2000)
    assert cond.shape == (2000, 5) and x.shape == (2000, 64) and (x >= 0).all()
    dry = (x == 0).mean()
    wet = x[x > 0]
    assert 0.3 < dry < 0.8
    assert np.percentile(wet, 99.9) > 20 * np.median(wet)  # far tails: a Gaussian's 99.9 % is ~3 sigma
    kurtosis = ((x - x.mean()) ** 4).mean() / x.var() ** 2
    assert kurtosis > 30
    assert SETS["rain"].overrides == ("model.cond_dim=0", "model.x_dim=0", "model.coarse_index=-1")


def _route(obs: np.ndarray, layout) -> str:
    """The route a demonstration took: where it first crossed the obstacles' height."""
    crossing = int(np.flatnonzero(obs[:, 1] >= 0)[0])
    return layout.mode_at(float(obs[crossing, 0]))


@pytest.mark.parametrize(("make", "layout", "shares"), [(wobbly, TWO_WAYS, {"left": 0.7, "right": 0.3}),
                                                        (routes, ROUTES, {"left": 1 / 3, "middle": 1 / 3,
                                                                          "right": 1 / 3})])
def test_demonstrations_reach_the_goal_on_their_routes_in_their_shares(make, layout, shares):
    episodes = make(np.random.default_rng(0), 60)
    assert len(episodes) == 60
    taken = [_route(obs, layout) for obs, _ in episodes]
    for route, share in shares.items():
        assert abs(taken.count(route) / 60 - share) < 0.02
    for obs, action in episodes:
        assert obs.shape[1] == 4 and action.shape == (len(obs), 2) and len(obs) >= 16
        assert np.linalg.norm(action[-1] - obs[-1, 2:]) < GOAL_TOLERANCE  # the last step reaches the goal
    speeds = np.concatenate([np.linalg.norm(np.diff(obs[:, :2], axis=0), axis=1) for obs, _ in episodes])
    assert speeds.std() > 0.005  # varied, not the scripts' constant speed


def test_policy_sets_load_as_episodes(tmp_path):
    from diffscale.tasks.policy.episodes import load_episodes

    path = SETS["routes"].ensure(tmp_path, 12)
    episodes = load_episodes(f"npz:{path}", min_length=16)
    assert len(episodes.ends) == 12 and episodes.obs.shape[1] == 4 and episodes.action.shape[1] == 2
    assert SETS["routes"].eval_args(tmp_path) == ["--env", "reach2d-routes"]


def test_generate_writes_the_chosen_sets_and_refuses_an_unknown_one(tmp_path, capsys):
    assert generate.main(["--out", str(tmp_path), "--sets", "flat", "rain", "--count", "10"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fields-rain-n10-seed0-heldout.npz",
                                                          "fields-rain-n10-seed0.npz", "images-flat-n10-seed0.npz"]
    assert "npz:" in capsys.readouterr().out
    assert generate.main(["--out", str(tmp_path), "--sets", "flats"]) == 2
    assert capsys.readouterr().err.strip() == ("error: unknown data set 'flats' (did you mean 'flat'?) -- pick from: "
                                               + ", ".join(SETS) + " (or all)")
    with pytest.raises(UserError, match="positive number"):
        SETS["flat"].ensure(tmp_path, -1)
    assert [s.name for s in chosen(None) if s.task == "images"] == list(GENERATORS)
