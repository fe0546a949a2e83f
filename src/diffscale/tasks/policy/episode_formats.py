"""Readers of demonstration formats, each returning ``RawEpisode``s for ``episodes.assemble``
to check. Problems with the file itself (missing keys or columns, no episode boundaries)
end here in a ``UserError`` naming the file and the fix."""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from diffscale.errors import UserError


@dataclass(frozen=True)
class RawEpisode:
    """One episode as a reader found it, before the checks. ``where`` names it in messages."""

    where: str
    obs: np.ndarray
    action: np.ndarray


def read_reach2d(count: int, variant: str = "reach2d") -> list[RawEpisode]:
    """The scripted demonstrations of ``builtin:reach2d`` (left/right in pairs) or
    ``builtin:reach2d-routes`` (three routes in known shares)."""
    from diffscale.tasks.policy.envs.reach2d import demonstrations, route_demonstrations

    made = route_demonstrations(count, seed=0) if variant == "reach2d-routes" else demonstrations(count, seed=0)
    return [RawEpisode(f"builtin:{variant} episode {i}", obs, action) for i, (obs, action) in enumerate(made)]


def _split(where: str, obs: np.ndarray, action: np.ndarray, ends: np.ndarray) -> list[RawEpisode]:
    """Cut arrays concatenated along time at ``ends`` (exclusive episode ends)."""
    ends = np.asarray(ends).reshape(-1).astype(np.int64)
    total = len(obs)
    if total == 0:  # whatever the ends say: no episode (the caller says the data set is empty)
        return []
    if len(ends) and (np.any(np.diff(ends) <= 0) or ends[0] <= 0 or ends[-1] != total):
        raise UserError(f"{where}: episode_ends {ends[:8].tolist()}{'...' if len(ends) > 8 else ''} do not rise "
                        f"strictly to the {total} stored steps",
                        "store each episode's exclusive end row, the last one equal to the number of steps")
    starts = np.concatenate([[0], ends[:-1]])
    return [RawEpisode(f"{where} episode {i}", obs[s:e], action[s:e])  # no ends: starts is [0], no episode
            for i, (s, e) in enumerate(zip(starts, ends, strict=False))]


def read_npz(path: Path, option: str) -> list[RawEpisode]:
    """A ``.npz`` with ``obs``, ``action`` and optionally ``episode_ends``, or a folder of them."""
    if option:
        raise UserError(f"npz:{path}:{option}: npz episodes take no key option",
                        "store the arrays as 'obs', 'action' and 'episode_ends' and write npz:PATH")
    files = sorted(path.glob("*.npz")) if path.is_dir() else [path]
    if not files:
        raise UserError(f"folder '{path}' holds no .npz files", "point npz:PATH at a .npz file or a folder of them")
    episodes: list[RawEpisode] = []
    for file in files:
        if file.is_file() and not zipfile.is_zipfile(file):  # np.load would take it for a pickle
            raise UserError(f"'{file}' is not a .npz archive (numpy.savez writes a zip file)",
                            "write it with numpy.savez(path, obs=..., action=..., episode_ends=...)")
        try:  # opened here: np.load leaves a file it opened itself open when the archive is cut short
            with open(file, "rb") as fid, np.load(fid, allow_pickle=False) as arrays:
                missing = [k for k in ("obs", "action") if k not in arrays.files]
                if missing:
                    raise UserError(f"'{file}' has no {' or '.join(repr(k) for k in missing)} array "
                                    f"(it holds: {', '.join(arrays.files) or 'nothing'})",
                                    "save the episodes with numpy.savez(path, obs=..., action=..., episode_ends=...)")
                obs, action = arrays["obs"], arrays["action"]
                ends = arrays["episode_ends"] if "episode_ends" in arrays.files else np.array([len(obs)])
        except (OSError, ValueError, zipfile.BadZipFile) as exc:  # a truncated archive is a bad zip
            raise UserError(f"'{file}' is not a readable .npz file ({exc})", "write it with numpy.savez") from exc
        if len(obs) != len(action):
            raise UserError(f"'{file}': {len(obs)} observations but {len(action)} actions",
                            "store one observation and one action per step")
        episodes += _split(f"'{file}'", obs, action, ends)
    return episodes


def read_zarr(path: Path, option: str) -> list[RawEpisode]:
    """The diffusion-policy replay buffer: ``data/<key>`` and ``meta/episode_ends`` (zarr v2 or v3)."""
    import zarr

    try:  # Any: zarr's types say little about what a group holds
        root: Any = zarr.open_group(str(path), mode="r")
    except Exception as exc:  # zarr raises several types for "not a group"; each means the same to a user
        raise UserError(f"'{path}' is not a zarr group ({type(exc).__name__})",
                        "point zarr:PATH at a replay buffer folder holding data/ and meta/") from exc
    meta = root.get("meta")
    if meta is None or "episode_ends" not in meta:
        raise UserError(f"'{path}' has no meta/episode_ends, so its episodes cannot be told apart",
                        "store each episode's exclusive end row in meta/episode_ends (the diffusion-policy "
                        "replay-buffer layout)")
    data = root.get("data")
    keys = sorted(data.array_keys()) if data is not None else []
    wanted = option.split("+") if option else [next((k for k in ("obs", "state") if k in keys), "obs")]
    missing = [k for k in [*wanted, "action"] if k not in keys]
    if missing:
        raise UserError(f"'{path}' has no data/{missing[0]} (data holds: {', '.join(keys) or 'nothing'})",
                        f"name the observation arrays: zarr:{path}:KEY[+KEY] (e.g. keypoint+state), and store "
                        "actions in data/action")
    steps = data["action"].shape[0]
    if steps == 0:  # no episode (the caller says the data set is empty)
        return []
    uneven = [k for k in wanted if data[k].shape[0] != steps]
    if uneven:
        raise UserError(f"'{path}': data/{uneven[0]} has {data[uneven[0]].shape[0]} steps but data/action has {steps}",
                        "store one row per step in every data/ array (the same episodes, the same order)")
    obs = np.concatenate([np.asarray(data[k][:]).reshape(steps, -1) for k in wanted], axis=1)
    return _split(f"'{path}'", obs, np.asarray(data["action"][:]), np.asarray(meta["episode_ends"][:]))


def _column(table: Any, name: str, where: str) -> np.ndarray:
    """A Parquet column of numbers or of lists of one length -> (N, D); empty rows or lists of
    several lengths are a ``UserError`` naming the first such row's episode and frame."""
    import pyarrow as pa
    import pyarrow.compute as pc

    column = table.column(name).combine_chunks()

    def row(i: int) -> str:
        frame = f", frame {table.column('frame_index')[i].as_py()}" if "frame_index" in table.column_names else ""
        return f"episode {table.column('episode_index')[i].as_py()}{frame}"

    if column.null_count:
        first = int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
        raise UserError(f"{where}: column '{name}' has {column.null_count} empty rows (the first: {row(first)})",
                        "give every frame its values, or leave those frames out")
    if pa.types.is_list(column.type) or pa.types.is_fixed_size_list(column.type) or \
            pa.types.is_large_list(column.type):
        lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False)
        if len(lengths) and np.any(lengths != lengths[0]):
            first = int(np.flatnonzero(lengths != lengths[0])[0])
            raise UserError(f"{where}: column '{name}' holds {int(lengths[0])} values in its first row but "
                            f"{int(lengths[first])} in {row(first)}",
                            "store the same number of values in every frame (one robot, one state layout)")
        values = column.flatten().to_numpy(zero_copy_only=False)
        return values.reshape(len(column), -1) if len(column) else values.reshape(0, 0)
    return column.to_numpy(zero_copy_only=False).reshape(len(column), 1)


def read_lerobot(path: Path, option: str) -> list[RawEpisode]:
    """LeRobot Parquet: per-frame rows with state/action list columns and ``episode_index``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    # LeRobot keeps the frames under data/; meta/ may hold Parquet files of other tables (v3.0)
    root = path / "data" if (path / "data").is_dir() else path
    files = sorted(root.rglob("*.parquet")) if path.is_dir() else [path]
    if not files:
        raise UserError(f"'{path}' holds no .parquet files",
                        "point lerobot:PATH at a LeRobot data set folder (its data/ holds the Parquet files)")
    try:
        table = pa.concat_tables([pq.read_table(f) for f in files], promote_options="default")
    except (pa.ArrowInvalid, OSError) as exc:
        raise UserError(f"'{path}': Parquet files could not be read together ({exc})",
                        "point lerobot:PATH at one data set's folder") from exc
    wanted = option.split("+") if option else ["observation.state"]
    missing = [c for c in [*wanted, "action", "episode_index"] if c not in table.column_names]
    if missing:
        raise UserError(f"'{path}' has no column '{missing[0]}' (columns: {', '.join(table.column_names)})",
                        f"name the state columns: lerobot:{path}:COLUMN[+COLUMN]; actions must be in 'action' "
                        "and episodes in 'episode_index'")
    order = ["episode_index", "frame_index"] if "frame_index" in table.column_names else ["episode_index"]
    table = table.sort_by([(c, "ascending") for c in order])
    where = f"'{path}'"
    obs = np.concatenate([_column(table, c, where) for c in wanted], axis=1)
    action = _column(table, "action", where)
    episode = _column(table, "episode_index", where)[:, 0]
    ids, starts = np.unique(episode, return_index=True)
    ends = np.append(starts[1:], len(episode))
    return [RawEpisode(f"'{path}' episode {int(i)}", obs[s:e], action[s:e])  # no rows: ends is [0], no episode
            for i, s, e in zip(ids, starts, ends, strict=False)]
