"""Demonstration episodes: the readers on small files written here (npz, zarr, LeRobot Parquet,
the built-in reach2d), their refusals of bad input, training windows cut across episodes with
padding at their edges, and min/max normalisation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from diffscale.errors import UserError
from diffscale.tasks.policy.episodes import MinMax, load_episodes, window_positions

from helpers import concat_episodes, random_episodes


# -- readers --------------------------------------------------------------------------------------
def _write_zarr(path: Path, data: dict[str, np.ndarray], episode_ends: np.ndarray | None) -> None:
    import zarr

    v3 = zarr.__version__.startswith("3")
    root = zarr.open_group(str(path), mode="w", **({"zarr_format": 2} if v3 else {}))  # the reference's format
    create = root.create_array if v3 else root.create_dataset  # zarr 3 renamed it
    for key, values in data.items():
        create(f"data/{key}", data=values)
    if episode_ends is not None:
        create("meta/episode_ends", data=episode_ends)


def _write_lerobot(path: Path, episodes, null_action_row: tuple[int, int] | None = None) -> None:
    """LeRobot's layout: frames under data/, and (as v3.0 has) Parquet tables of other kinds under meta/."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    chunk = path / "data" / "chunk-000"
    chunk.mkdir(parents=True)
    for index, (obs, action) in reversed(list(enumerate(episodes))):  # files out of order on purpose
        frames = np.arange(len(obs))[::-1]  # rows out of order too: the reader sorts by frame_index
        actions = [list(r) for r in action[frames]]
        if null_action_row is not None and null_action_row[0] == index:
            actions[list(frames).index(null_action_row[1])] = None
        table = pa.table({
            "observation.state": pa.array([list(r) for r in obs[frames]], pa.list_(pa.float32())),
            "action": pa.array(actions, pa.list_(pa.float32(), action.shape[1])),
            "episode_index": np.full(len(obs), index), "frame_index": frames, "timestamp": frames / 10.0})
        pq.write_table(table, chunk / f"episode_{index:06d}.parquet")
    (path / "meta" / "episodes" / "chunk-000").mkdir(parents=True)
    pq.write_table(pa.table({"episode_index": np.arange(len(episodes)), "length": [len(o) for o, _ in episodes]}),
                   path / "meta" / "episodes" / "chunk-000" / "file-000.parquet")
    pq.write_table(pa.table({"task_index": [0], "task": ["reach"]}), path / "meta" / "tasks.parquet")


def test_readers_load_the_same_episodes_from_every_format(tmp_path):
    episodes = random_episodes()
    obs, action, ends = concat_episodes(episodes)
    np.savez(tmp_path / "one.npz", obs=obs, action=action, episode_ends=ends)
    (tmp_path / "folder").mkdir()
    for i, (o, a) in enumerate(episodes):
        np.savez(tmp_path / "folder" / f"ep{i}.npz", obs=o, action=a)
    _write_zarr(tmp_path / "buffer.zarr", {"state": obs, "action": action}, ends)
    _write_lerobot(tmp_path / "lerobot", episodes)
    for spec in (f"npz:{tmp_path / 'one.npz'}", f"npz:{tmp_path / 'folder'}", f"zarr:{tmp_path / 'buffer.zarr'}",
                 f"lerobot:{tmp_path / 'lerobot'}"):
        loaded = load_episodes(spec, min_length=16)
        assert np.array_equal(loaded.obs, obs) and np.array_equal(loaded.action, action), spec
        assert loaded.ends.tolist() == ends.tolist(), spec
        assert "2 episodes of 20-30 steps, obs 3, action 2" in loaded.describe()


def test_zarr_observation_keys_are_concatenated_per_step(tmp_path):
    obs, action, ends = concat_episodes(random_episodes())
    keypoints = np.arange(len(obs) * 9 * 2, dtype=np.float32).reshape(len(obs), 9, 2)
    _write_zarr(tmp_path / "pusht.zarr", {"keypoint": keypoints, "state": obs, "action": action}, ends)
    loaded = load_episodes(f"zarr:{tmp_path / 'pusht.zarr'}:keypoint+state", min_length=16)
    assert loaded.obs.shape == (50, 18 + 3)
    assert np.array_equal(loaded.obs[:, :18], keypoints.reshape(50, 18)) and np.array_equal(loaded.obs[:, 18:], obs)


def test_builtin_reach2d_and_max_episodes():
    loaded = load_episodes("builtin:reach2d", min_length=16, max_episodes=6)
    assert len(loaded.ends) == 6 and loaded.obs.shape[1] == 4 and loaded.action.shape[1] == 2


def _bad_inputs(tmp: Path) -> list[tuple[str, str]]:
    """(spec, expected message) for each kind of bad input, the files written to ``tmp``."""
    (short_obs, short_action), = random_episodes(lengths=(10,))
    np.savez(tmp / "short.npz", obs=short_obs, action=short_action)
    (tmp / "mixed").mkdir()
    for i, (o, a) in enumerate(random_episodes(lengths=(20,)) + random_episodes(lengths=(20,), obs_dim=4)):
        np.savez(tmp / "mixed" / f"ep{i}.npz", obs=o, action=a)
    obs, action, ends = concat_episodes(random_episodes())
    action[33, 1] = np.nan
    np.savez(tmp / "nan.npz", obs=obs, action=action, episode_ends=ends)
    np.savez(tmp / "empty.npz", obs=np.zeros((0, 3)), action=np.zeros((0, 2)), episode_ends=np.zeros(0, int))
    np.savez(tmp / "nokey.npz", state=obs, action=action)
    np.savez(tmp / "badends.npz", obs=obs, action=np.nan_to_num(action), episode_ends=np.array([30, 20]))
    _write_zarr(tmp / "noends.zarr", {"state": obs, "action": np.nan_to_num(action)}, None)
    _write_zarr(tmp / "uneven.zarr", {"state": obs[:-1], "action": np.nan_to_num(action)}, ends)
    _write_zarr(tmp / "nosteps.zarr", {"state": obs[:0], "action": action[:0]}, ends[:0])
    np.savez(tmp / "noends0.npz", obs=obs[:0], action=action[:0], episode_ends=np.array([0]))
    (tmp / "text.npz").write_text("obs,action\n1,2\n")
    two = random_episodes(lengths=(20, 20))
    _write_lerobot(tmp / "lerobot-dims", [two[0], (np.concatenate([two[1][0], two[1][0][:, :1]], 1), two[1][1])])
    _write_lerobot(tmp / "lerobot-null", two, null_action_row=(1, 5))
    return [
        (f"npz:{tmp}/short.npz", "short.npz' episode 0: 10 steps, fewer than the prediction horizon "
                                 "model.pred_horizon=16 -- drop episodes that short"),
        (f"npz:{tmp}/mixed", "ep1.npz' episode 0: 'obs' has 4 values per step but"),
        (f"npz:{tmp}/nan.npz", "nan.npz' episode 1: 'action' holds NaN or infinite values (first at step 13) "
                               "-- fix or drop that episode"),
        (f"npz:{tmp}/empty.npz", "holds no episodes -- point data.source at demonstrations"),
        (f"npz:{tmp}/nokey.npz", "nokey.npz' has no 'obs' array (it holds: state, action) -- save the episodes"),
        (f"npz:{tmp}/badends.npz", "episode_ends [30, 20] do not rise strictly to the 50 stored steps"),
        (f"zarr:{tmp}/noends.zarr", "noends.zarr' has no meta/episode_ends, so its episodes cannot be told apart "
                                    "-- store each episode's exclusive end row in meta/episode_ends"),
        (f"zarr:{tmp}/noends.zarr:keypoint", "has no meta/episode_ends"),
        (f"npz:{tmp}/missing.npz", "missing.npz' does not exist -- check the path"),
        (f"lerobot:{tmp}/mixed", "holds no .parquet files"),
        (f"zarr:{tmp}/uneven.zarr", "uneven.zarr': data/state has 49 steps but data/action has 50 -- store one row "
                                    "per step in every data/ array"),
        (f"zarr:{tmp}/nosteps.zarr", "holds no episodes"),
        (f"npz:{tmp}/noends0.npz", "holds no episodes"),
        (f"npz:{tmp}/text.npz", "text.npz' is not a .npz archive (numpy.savez writes a zip file)"),
        (f"lerobot:{tmp}/lerobot-dims", "lerobot-dims': column 'observation.state' holds 3 values in its first row "
                                        "but 4 in episode 1, frame 0 -- store the same number of values"),
        (f"lerobot:{tmp}/lerobot-null", "lerobot-null': column 'action' has 1 empty rows (the first: episode 1, "
                                        "frame 5) -- give every frame its values"),
        ("hdf5:demo.h5", "unknown episode source 'hdf5:demo.h5'"),
    ]


def test_bad_input_is_one_error_naming_the_file_and_the_fix(tmp_path):
    for spec, message in _bad_inputs(tmp_path):
        with pytest.raises(UserError) as caught:
            load_episodes(spec, min_length=16)
        assert message in str(caught.value), (spec, str(caught.value))


# -- windows and normalisation --------------------------------------------------------------------
def test_windows_are_padded_at_episode_edges_and_never_cross_episodes():
    ends = np.array([20, 50])
    windows = window_positions(ends, 16, pad_before=1, pad_after=7)
    # per episode of L steps: L - T + pad_after + pad_before + 1 windows (SequenceSampler's count)
    assert len(windows) == (20 - 16 + 7 + 1 + 1) + (30 - 16 + 7 + 1 + 1)
    assert windows[0].tolist() == [0, 0, *range(1, 15)]  # the first observation repeated before the start
    last_of_first = windows[12]
    assert last_of_first.tolist() == [*range(11, 20), *[19] * 7]  # the last action repeated after the end
    assert windows[13].tolist() == [20, 20, *range(21, 35)]  # the next episode starts afresh
    assert windows[-1].tolist() == [*range(41, 50), *[49] * 7]
    episode = np.searchsorted(ends, windows, side="right")
    assert (episode == episode[:, :1]).all()


def test_min_max_maps_the_data_to_unit_range_and_back():
    values = torch.tensor([[0.0, 5.0, 3.0], [10.0, 7.0, 3.0], [5.0, 6.0, 3.0]])
    norm = MinMax.fit(values)
    scaled = norm.normalize(values)
    assert torch.allclose(scaled[:, :2].amin(0), torch.tensor([-1.0, -1.0]))
    assert torch.allclose(scaled[:, :2].amax(0), torch.tensor([1.0, 1.0]))
    assert torch.equal(scaled[:, 2], torch.zeros(3))  # a constant dimension maps to 0, not to inf
    assert torch.allclose(norm.unnormalize(scaled), values)
