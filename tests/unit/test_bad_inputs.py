"""Every verb, driven with bad inputs: each ends in exit 2, exactly one line starting ``error:``
(the last one, naming the cause and the fix), no traceback, and nothing created or changed on
disk. The CLI runs in this process (a subprocess per case costs ~2 s of imports).

Cases marked ``locked`` run with file modes applied to root too (``tests/unprivileged.py``):
root reads every file otherwise. A new verb, flag or data spec adds its rows here.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from diffscale.cli import main

from helpers import micro_args, write_idx
from unprivileged import unavailable, without_root_bypass

Setup = Callable[[Path], None]


# ----------------------------------------------------------------------------- set-ups

def _file(name: str, text: str = "x", mode: int | None = None) -> Setup:
    def make(ws: Path) -> None:
        path = ws / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if mode is not None:
            path.chmod(mode)
    return make


def _folder(name: str, mode: int | None = None, files: tuple[str, ...] = ()) -> Setup:
    def make(ws: Path) -> None:
        path = ws / name
        path.mkdir(parents=True, exist_ok=True)
        for file in files:
            (path / file).write_text("x")
        if mode is not None:
            path.chmod(mode)
    return make


def _run(ws: Path) -> None:
    """A copy of the module's trained run (checkpoints at steps 4 and 8) as ``{run}``."""
    shutil.copytree(TRAINED["run"], ws / "run")


def _class_run(ws: Path) -> None:
    """A copy of the module's class-conditional run (the built-in numerals, classes 0-9) as ``{run}``."""
    shutil.copytree(TRAINED["classes"], ws / "run")


def _fields_run(ws: Path) -> None:
    """A copy of the module's fields run (field-icon, 2 steps) as ``{run}``."""
    shutil.copytree(TRAINED["fields"], ws / "run")


def _cond(ws: Path) -> None:
    """Two conditions of the fields run's 7 values, as c.npy."""
    import numpy as np

    np.save(ws / "c.npy", np.zeros((2, 7), np.float32))


def _empty_parquet(ws: Path) -> None:
    """A Parquet table with an image column and no rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"image": pa.array([], type=pa.binary())}), ws / "empty.parquet")


def _sweep(ws: Path) -> None:
    """A planned sweep directory {ws}/sw of one command element, as `sweep run` leaves it."""
    assert main(["sweep", "run", "--axis", "k=a", "--out", str(ws / "sw"), "--", "true", "{k}"]) == 0


def _big_grid(ws: Path) -> None:
    """A sweep file of 1000 x 1000 elements."""
    values = ", ".join(str(i) for i in range(1000))
    (ws / "big.yaml").write_text(f"base: {{preset: tiny}}\naxes: {{optim.warmup_steps: [{values}], "
                                 f"train.seed: [{values}]}}\n")


def _outside_log(ws: Path) -> None:
    """A run directory whose jobs.json names a log outside it."""
    _jobs(ws)
    record = json.loads((ws / "jobs" / "jobs.json").read_text())
    record["submissions"][0]["jobs"][0]["log"] = "../../../../../../../../etc/hostname"
    (ws / "jobs" / "jobs.json").write_text(json.dumps(record))


def _each_checkpoint(action: Callable[[Path], None]) -> Setup:
    def make(ws: Path) -> None:
        for step in sorted((ws / "run" / "checkpoints").iterdir()):
            action(step)
    return make


_damaged = _each_checkpoint(lambda step: (step / "manifest.json").write_text("{not json"))
_unreadable = _each_checkpoint(lambda step: (step / "manifest.json").chmod(0))


def _jobs(ws: Path) -> None:
    """A run directory with one recorded SLURM job (id 123) and no log yet."""
    record = {"job_id": "123", "name": "ds-jobs-abc123", "shape": "1x1", "partition": "cpu",
              "script": "job-1x1.slurm.sh", "log": "logs/ds-jobs-abc123-123.out"}
    sub = {"scheduler": "slurm", "cluster": "test", "submitted_at": "2026-01-01T00:00:00+00:00",
           "run_dir": str(ws / "jobs"), "what": "a test", "jobs": [record], "user": "root"}
    (ws / "jobs").mkdir()
    (ws / "jobs" / "jobs.json").write_text(json.dumps({"submissions": [sub]}))


def _npz(name: str, truncated: bool = False, **arrays: list[float]) -> Setup:
    def make(ws: Path) -> None:
        import numpy as np

        path = ws / name
        np.savez(path, **{k: np.asarray(v, dtype=np.float32) for k, v in arrays.items()})
        if truncated:  # as a copy cut short by a full disk leaves it
            path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return make


def _zeros(name: str, shape: tuple[int, ...]) -> Setup:
    def make(ws: Path) -> None:
        import numpy as np

        np.savez(ws / name, images=np.zeros(shape, dtype=np.uint8))
    return make


def _sparse_idx(name: str, count: int) -> Setup:
    """An MNIST image file of ``count`` 28 px images whose pixels are a hole: no disk used."""
    def make(ws: Path) -> None:
        (ws / name).mkdir()
        with open(ws / name / "train-images-idx3-ubyte", "wb") as out:
            out.write(b"".join(v.to_bytes(4, "big") for v in (2051, count, 28, 28)))
            out.truncate(16 + count * 28 * 28)
    return make


def _emnist_images_only(ws: Path) -> None:
    """An EMNIST letters root ``{ws}/em`` holding the images file and not the labels file."""
    import numpy as np

    write_idx(ws / "em" / "EMNIST" / "raw" / "emnist-letters-train-images-idx3-ubyte.gz", np.zeros((16, 28, 28)))


def _utf16(name: str, text: str) -> Setup:
    def make(ws: Path) -> None:
        (ws / name).write_bytes(text.encode("utf-16"))  # with its byte-order mark, as Windows editors save
    return make


_BAD_PROFILE = "name: x\nscheduler: slurm\npartitions:\n  cpu:\n    gpus_per_node: 0\n    gpu_count: 2\n"


@dataclass(frozen=True)
class Case:
    argv: str
    """Command line; ``{ws}`` is the case's empty workspace (also the working directory), ``{run}``
    a trained run's copy where a set-up makes one."""
    says: str
    """Words the error line must contain."""
    setup: tuple[Setup, ...] = ()
    locked: bool = False
    """Run with file modes applied (root's permission bypass dropped)."""
    env: tuple[tuple[str, str], ...] = ()


PLAN = "plan --cluster purdue-gilbreth --account mylab --preset tiny --out {ws}/p"
SUBMIT = "submit --cluster purdue-gilbreth --account mylab --preset tiny --out {ws}/s"
USER_CMD = "plan --cluster purdue-gilbreth --account mylab --out {ws}/p"
FIELDS = "train --preset field-icon --set train.steps=2 --out {ws}/t"
POLICY = "train --preset policy-tiny --set train.steps=2 --out {ws}/t"
COUPLE = "plan --cluster dkrz-levante --account a --preset field-icon --couple {ws}/sp"
RUN = (_run,)
LOCKED_DIR = _folder("locked", 0o555)
NO_SCHEDULER = (("PATH", "/nonexistent"),)

CASES = [
    # train
    Case("train --out {ws}/afile", "is a regular file, not a folder", (_file("afile"),)),
    Case("train --out {ws}/afile/sub", "lies under", (_file("afile"),)),
    Case("train --max-steps 0", "--max-steps 0 is out of range"),
    Case("train --preset field-icon --device cpu --set runtime.step_graph=on --out {ws}/t",
         "runtime.step_graph on needs a CUDA GPU (this run trains on cpu) -- set runtime.step_graph to auto or off"),
    Case("train --max-steps -1", "--max-steps -1 is out of range"),
    Case("train {ws}/missing.yaml", "does not exist"),
    Case("train {ws}/bad.yaml", "is not valid YAML", (_file("bad.yaml", "a: [b"),)),
    Case("train {ws}/list.yaml", "does not hold a mapping", (_file("list.yaml", "- a\n- b\n"),)),
    Case("train {ws}/utf16.yaml", "is not UTF-8 text (byte 0 is 0xff; a UTF-16 file",
         (_utf16("utf16.yaml", "train:\n  steps: 4\n"),)),
    Case("train {ws}/locked.yaml", "permission denied", (_file("locked.yaml", "train: {}\n", 0),), locked=True),
    Case("train --preset nope", "nope"),
    Case("train --set train.stpes=5", "unknown config key 'train.stpes'"),
    Case("train --set train.steps=abc", "train.steps"),
    Case("train --set train.steps=-1", "train.steps"),
    Case("train --set noequals", "has no '='"),
    Case("train --set runtime.cpu_threads=-1", "config runtime.cpu_threads: -1 is not a whole number from 0 to 4096"),
    Case("train --set task=imagse", "is not one of"),
    Case("train --device tpu", "invalid choice: 'tpu'"),
    Case("train --bogus", "unrecognized arguments: --bogus"),
    Case("train --data bogus:x --out {ws}/t", "bogus"),
    Case("train --data npz:{ws}/missing.npz --out {ws}/t", "missing.npz"),
    Case("train --data imagefolder:{ws}/empty --out {ws}/t", "empty", (_folder("empty"),)),
    Case("train --set data.max_bad_fraction=1", "data.max_bad_fraction: is 1.0, outside [0, 1)"),
    Case("train --set data.workers=-2", "data.workers: is -2"),
    Case("train --set data.resident=maybe", "data.resident"),
    Case("train --data imagefolder:{ws}/bad --out {ws}/t",
         "/bad/a.png (UnidentifiedImageError)), more than data.max_bad_fraction = 0.01 allows -- remove or replace "
         "the damaged files", (_file("bad/a.png"),)),
    Case("train --data webdataset:{ws}/noshards --out {ws}/t",
         "/noshards' -- point --data webdataset:DIR_OR_GLOB at a folder of .tar shards"),
    Case("train --data webdataset:{ws}/wds --out {ws}/t", "a.tar' holds no samples with an image (.png, .jpg or "
         ".jpeg) -- remove the empty shard, or write it again", (_file("wds/a.tar", "\0" * 10240),)),
    Case("train --data parquet:{ws}/empty.parquet --out {ws}/t", "empty.parquet' holds no images (0 rows or samples)",
         (_empty_parquet,)),
    Case("train --data parquet:{ws}/missing.parquet --out {ws}/t",
         "/missing.parquet' does not exist -- check the path given to --data parquet:PATH[:COLUMN]"),
    Case("train --data emnist:{ws}/nothing --out {ws}/t", "EMNIST"),
    Case("train --data npz:{ws}/cut.npz --out {ws}/t", "cannot read array file",
         (_npz("cut.npz", truncated=True, images=[[[0.0] * 8] * 8] * 64),)),
    Case("train --data npz:{ws}/flat.npz --out {ws}/t", "has shape (10, 0, 5): no pixels",
         (_zeros("flat.npz", (10, 0, 5)),)),
    Case("train --data npz:{ws}/none.npz --out {ws}/t", "has shape (0, 8, 8): no images",
         (_zeros("none.npz", (0, 8, 8)),)),
    Case("train --data npz:{ws}/plain.npz --set model.class_conditional=on --out {ws}/t",
         "plain.npz' has no labels -- set model.class_conditional to off, or train on labelled data",
         (_zeros("plain.npz", (16, 8, 8)),)),
    Case("train --data emnist:{ws}/em:letters --set model.class_conditional=on --out {ws}/t",
         "/em' (looked for EMNIST/raw/emnist-letters-train-labels-idx1-ubyte[.gz] beside the images) -- copy "
         "emnist-letters-train-labels-idx1-ubyte beside the images file", (_emnist_images_only,)),
    Case("train --set model.class_conditional=maybe", "config model.class_conditional: expected true or false"),
    Case("train --set model.label_dropout=1", "config model.label_dropout: 1.0 is outside [0, 1)"),
    Case("train --set train.sample_guidance=-1", "config train.sample_guidance: must be 0 or more (got -1.0)"),
    Case("train --out {run}", "already holds checkpoints", RUN),
    Case("train --out {run} --resume auto", "every checkpoint in", (_run, _damaged)),
    Case("train --out {run} --resume auto", "is not readable", (_run, _unreadable), locked=True),
    Case("train --out {run} --resume {ws}/nope", "does not exist", RUN),
    Case("train --out {run} --resume {run}/checkpoints/step_00000008", "is not readable", (_run, _unreadable),
         locked=True),
    Case("train --out {run} --resume auto --set model.block_out_channels=[16,32]", "different model", RUN),
    Case("train --out {ws}/locked/run", "no permission to write", (LOCKED_DIR,), locked=True),
    Case("train --out {ws}/sealed --resume auto", "permission denied", (_folder("sealed/checkpoints"),
                                                                       _folder("sealed", 0)), locked=True),
    # sample
    Case("sample {ws}/nowhere", "is not a diffscale run"),
    Case("sample {ws}/afile", "is not a diffscale run", (_file("afile"),)),
    Case("sample {run} --n 0", "--n 0 is out of range", RUN),
    Case("sample {run} --members 3", "--members is the ensemble size for the conditions of --cond", RUN),
    Case("sample {run} --cond {ws}/c.npz --members 0", "--members 0 is out of range", RUN),
    Case("sample {run} --cond {ws}/c.npz --out {ws}/e.npz", "image runs are sampled without conditions",
         (_run, _npz("c.npz", cond=[[0.0]]))),
    Case("sample {run} --cond {ws}/c.npz --out {ws}/e.png", "with --cond is written as a NumPy archive",
         (_run, _npz("c.npz", cond=[[0.0]]))),
    Case("sample {run} --cond {ws}/c.npz --gif", "--gif is for samples drawn as pictures", RUN),
    Case("sample {run} --cond {ws}/c.npz", "has no array 'cond' (it holds: x)", (_run, _npz("c.npz", x=[[0.0]]))),
    Case("sample {run} --cond {ws}/c.npz", "holds NaN or infinite values in 1 rows (first: row 1)",
         (_run, _npz("c.npz", cond=[[0.0], [float("nan")]]))),
    Case("sample {run} --cond {ws}/c.npz", "holds an array of shape (2,)", (_run, _npz("c.npz", cond=[0.0, 1.0]))),
    Case("sample {run} --cond {ws}/c.txt", "is neither a .npy nor a .npz file", (_run, _file("c.txt"))),
    Case("sample {run} --cond {ws}/c.npy", "c.npy' does not exist", RUN),
    Case("sample {run} --cond {ws}/c.npz", "cannot read --cond", (_run, _npz("c.npz", True, cond=[[0.0]] * 64))),
    Case("sample {run} --n -1", "--n -1 is out of range", RUN),
    Case("sample {run} --steps 0", "--steps 0 is out of range", RUN),
    Case("sample {run} --n abc", "invalid int value: 'abc'", RUN),
    Case("sample {run} --seed -1", "--seed -1 is out of range (a seed is a whole number from 0 to 2**63 - 1)", RUN),
    Case("sample {run} --seed 18446744073709551616", "--seed 18446744073709551616 is out of range", RUN),
    Case("sample {run} --n 10000000000", "sampling --n 10000000000 needs about", RUN),
    Case("sample {run} --sampler euler", "invalid choice: 'euler'", RUN),
    Case("sample {run} --out {ws}/afile/x.png", "lies under", (_run, _file("afile"))),
    Case("sample {run} --out {ws}", "is a folder, not a file", RUN),
    Case("sample {run}", "every checkpoint in", (_run, _damaged)),
    Case("sample {run}", "is not readable", (_run, _unreadable), locked=True),
    Case("sample {ws}/fresh", "has no usable checkpoint", (_file("fresh/config.yaml", "train: {}\n"),)),
    Case("sample {ws}/fresh", "permission denied", (_file("fresh/config.yaml", "train: {}\n", 0),), locked=True),
    Case("sample {run} --out {ws}/locked/x.png", "no permission to write", (_run, LOCKED_DIR), locked=True),
    Case("sample {run} --class 3", "--class needs a class-conditional images run; this images run is trained "
         "without classes (model.class_conditional off) -- drop --class and --guidance", RUN),
    Case("sample {run} --guidance 3", "--guidance needs a class-conditional images run", RUN),
    Case("sample {run} --class A --guidance -1", "--guidance -1.0 is negative -- use 0 or more", (_class_run,)),
    Case("sample {run} --class 3 --guidance inf", "--guidance inf is not a finite number", (_class_run,)),
    Case("sample {run} --class 3 --guidance nan", "--guidance nan is not a finite number", (_class_run,)),
    Case("sample {run} --cond {ws}/c.npy --members 1000000000", "2 conditions x --members 1,000,000,000 needs about",
         (_fields_run, _cond)),
    Case("eval {run} --guidance -1", "--guidance -1.0 is negative -- use 0 or more", (_class_run,)),
    Case("eval {run} --guidance 3", "--guidance needs a class-conditional images run; this images run is trained "
         "without classes (model.class_conditional off) -- drop --class and --guidance", RUN),
    Case("sample {run} --class A", "--class 'A' is not a class of this run (its classes: 0, 1, 2, 3, 4, 5, 6, 7, 8, "
         "9) -- pass a class name or an index from 0 to 9", (_class_run,)),
    Case("sample {run} --class 3,10", "--class '10' is not a class of this run", (_class_run,)),
    Case("sample {run} --cond {ws}/c.npz --class 3", "--class and --guidance are for class-conditional image runs; "
         "--cond is for fields runs", (_class_run,)),
    Case("sample", "the following arguments are required: RUN_DIR"),
    # export
    Case("export {run} --diffusers {ws}/afile", "is a regular file, not a folder", (_run, _file("afile"))),
    Case("export {run} --diffusers {ws}/afile/sub", "lies under", (_run, _file("afile"))),
    Case("export {run} --diffusers {ws}/full", "is not empty", (_run, _folder("full", files=("x",)))),
    Case("export {ws}/nowhere --diffusers {ws}/out", "is not a diffscale run"),
    Case("export {run} --diffusers {ws}/out", "every checkpoint in", (_run, _damaged)),
    Case("export {run} --diffusers {ws}/out", "is not readable", (_run, _unreadable), locked=True),
    Case("export {run} --diffusers {ws}/locked/out", "no permission to write", (_run, LOCKED_DIR), locked=True),
    Case("export {run}", "export needs a place to write: --diffusers OUT_DIR, --push-to-hub REPO, or both", RUN),
    Case("export {run} --diffusers {ws}/out --private", "--private is a setting of the Hub repo", RUN),
    Case("export {run} --diffusers {ws}/out --license 'MIT License'", "is not a licence identifier of the Hub", RUN),
    Case("export {run} --diffusers {ws}/out --push-to-hub lab/x/y", "--push-to-hub 'lab/x/y' is not a Hub repo id",
         RUN),
    Case("export {run} --diffusers {ws}/out --push-to-hub lab/a--b", "is not a Hub repo id", RUN),
    Case("export {run} --diffusers {ws}/out --push-to-hub 'lab/my model'", "is not a Hub repo id", RUN),
    Case("export {run} --diffusers {ws}/out --push-to-hub lab/x --token-file {ws}/nothing",
         "nothing' cannot be read (No such file or directory)", RUN),
    Case("export {run} --diffusers {ws}/out --push-to-hub lab/x --token-file {ws}/empty", "is empty",
         (_run, _file("empty", "\n"))),
    Case("export {run} --diffusers {ws}/out --push-to-hub lab/x --token-file {ws}/utf16", "utf16' is not text (byte "
         "0 is 0xff; a Hub token is plain ASCII)", (_run, _utf16("utf16", "hf_abc"))),
    # the fields and policy tasks' data specs
    Case(f"{FIELDS} --data npz:{{ws}}/missing.npz", "array file"),
    Case(f"{FIELDS} --data npz:{{ws}}/x.npz", "has no array 'cond'", (_npz("x.npz", x=[[1.0]]),)),
    Case(f"{FIELDS} --data npz:{{ws}}/afile", "cannot read array file", (_file("afile"),)),
    Case(f"{FIELDS} --data builtin:nope", "holds images, not fields"),
    Case(f"{FIELDS} --data imagefolder:{{ws}}", "is not field data"),
    Case(f"{FIELDS} --data spool:{{ws}}/nospool", "spool directory"),
    Case(f"{FIELDS} --data spool:{{ws}}/sp:1000000000000", "a replay buffer of 1,000,000,000,000 samples",
         (_folder("sp"),)),
    Case(f"{POLICY} --data npz:{{ws}}/missing.npz", "episode data"),
    Case(f"{POLICY} --data npz:{{ws}}/x.npz", "has no 'obs' or 'action' array", (_npz("x.npz", x=[[1.0]]),)),
    Case(f"{POLICY} --data npz:{{ws}}/cut.npz", "cut.npz' is not a .npz archive (numpy.savez writes a zip file)",
         (_npz("cut.npz", truncated=True, obs=[[1.0]] * 64, action=[[1.0]] * 64, episode_ends=[64]),)),
    Case(f"{POLICY} --data zarr:{{ws}}/missing.zarr", "episode data"),
    Case(f"{POLICY} --data zarr:{{ws}}/afile", "is not a zarr group", (_file("afile"),)),
    Case(f"{POLICY} --data lerobot:{{ws}}/nothing", "episode data"),
    Case(f"{POLICY} --data lerobot:{{ws}}/afile", "could not be read", (_file("afile"),)),
    Case(f"{POLICY} --data builtin:nope", "unknown built-in episodes 'nope'"),
    Case(f"{POLICY} --set model.conv=fft", "model.conv: 'fft' is not one of auto, cudnn, matmul"),
    Case(f"{POLICY} --data spool:{{ws}}/sp", "unknown episode source"),
    Case(f"{POLICY} --data npz:{{ws}}/one.npz", "has 13 training examples, fewer than one effective batch of 64",
         (_npz("one.npz", obs=[[0.0] * 4] * 20, action=[[0.0] * 2] * 20),)),
    Case(f"{POLICY} --set model.step_embed_dim=33", "model.step_embed_dim: 33 is not an even number of at least 4"),
    Case(f"{POLICY} --set data.shift_px=3", "data.shift_px: 3 is an image augmentation"),
    # eval
    Case("eval {run} --count 0", "--count 0 is out of range", RUN),
    Case("eval {run} --data npz:{ws}/held.npz", "images runs are not scored on given pairs: --data is for fields runs",
         RUN),
    Case("eval {run} --steps 0", "--steps 0 is out of range", RUN),
    Case("eval {run} --max-episode-steps 0", "--max-episode-steps 0 is out of range", RUN),
    Case("eval {run} --checkpoint 5", "has no checkpoint of step 5 (checkpoints: 4, 8)", RUN),
    Case("eval {run} --checkpoint -1", "--checkpoint -1 is out of range", RUN),
    Case("eval {run} --count 1", "--count 1: a Frechet distance needs at least 2 samples", RUN),
    Case("eval {run} --env pusht", "images runs are evaluated without an environment", RUN),
    Case("eval {run} --features nocolon", "--features 'nocolon' is not module:function", RUN),
    Case("eval {run} --features diffscale_no_such_module:build", "cannot load the feature network", RUN),
    Case("eval {run} --sampler euler", "invalid choice: 'euler'", RUN),
    Case("eval {ws}/fresh", "has no usable checkpoint", (_file("fresh/config.yaml", "train: {}\n"),)),
    Case(f"{FIELDS} --set train.eval_every=1", "fields runs have no sample-quality metrics"),
    Case("train --set train.eval_every=-1 --out {ws}/t", "train.eval_every: is negative"),
    Case("train --set train.eval_features=nocolon --out {ws}/t",
         "train.eval_features: 'nocolon' is not module:function"),
    Case("train --set train.sample_sampler=euler --out {ws}/t", "train.sample_sampler"),
    Case("eval {run} --seed -1", "--seed -1 is out of range (a seed is a whole number from 0 to 2**63 - 1)", RUN),
    Case("eval {run} --seed 9223372036854775808", "--seed 9223372036854775808 is out of range", RUN),
    Case("eval {ws}/nowhere", "is not a diffscale run"),
    Case("eval {run}", "every checkpoint in", (_run, _damaged)),
    Case("eval {run}", "is not readable", (_run, _unreadable), locked=True),
    # presets
    Case("presets --bogus", "unrecognized arguments: --bogus"),
    # plan and submit: times
    Case(f"{PLAN} --time 00:00:00", "is not a positive duration"),
    Case(f"{PLAN} --time 0", "is not a positive duration"),
    Case(f"{PLAN} --time 0h", "is not a positive duration"),
    Case(f"{PLAN} --time 99:99:99", "has 99 minutes (at most 59)"),
    Case(f"{PLAN} --time 1:60", "has 60 seconds (at most 59)"),
    Case(f"{PLAN} --time 1-24", "has 24 hours (at most 23)"),
    Case(f"{PLAN} --time -1", "is not a duration"),
    Case(f"{PLAN} --time abc", "is not a duration"),
    Case(f"{PLAN} --time unlimited", "asks for no time limit"),
    Case(f"{PLAN} --time 49:00:00", "the partition's maximum 48:00:00"),
    Case(f"{PLAN} --time 00:01:00", "preflight check 'wall time' failed: --time 00:01:00 ends before the run's "
         "first checkpoint"),
    Case(f"{SUBMIT} --time 00:00:00", "is not a positive duration"),
    # plan and submit: shape and resources
    Case(f"{PLAN} --gpus-per-node 0", "--gpus-per-node 0 is out of range"),
    Case(f"{PLAN} --gpus-per-node -2", "--gpus-per-node -2 is out of range"),
    Case(f"{PLAN} --gpus-per-node 8", "8 GPUs per node asked, but 'a100-80gb' nodes have 4"),
    Case("plan --cluster nyu-torch --account a --gpus-per-node 1 --preset medium --data mnist:{ws}/mn "
         "--set data.resident=on --out {ws}/p", "preflight check 'data on the device' failed: 8,000,000 items x "
         "1x64x64 = 30.52 GiB (the IDX header): resident on the device (30.52 GiB; data.resident on); with the model "
         "(~25.8 GB, estimated) ~58.5 GB > 90% of 48 GB per L40S -- stream it from the decoded cache: --set "
         "data.resident=auto", (_sparse_idx("mn", 8_000_000),)),
    Case(f"{PLAN} --procs-per-node 0", "--procs-per-node 0 is out of range"),
    Case(f"{PLAN} --nodes 1000000000", "--nodes 1000000000 is out of range: more nodes than any partition "
         "diffscale plans for holds (at most 4096) -- pass --nodes 4096 or less"),
    Case(f"{PLAN} --nodes 1000000 --force", "--nodes 1000000 is out of range"),
    Case(f"{PLAN} --nodes 10000", "--nodes 10000 is out of range"),
    Case(f"{PLAN} --gpus-per-node 99999999999999999999",
         "--gpus-per-node 99999999999999999999 is out of range: more GPUs per node than any node holds (at most 64)"),
    Case(f"{PLAN} --gpus-per-node 20000", "--gpus-per-node 20000 is out of range"),
    Case(f"{PLAN} --procs-per-node 100000", "--procs-per-node 100000 is out of range"),
    Case(f"{PLAN} --cpus-per-task 100000", "--cpus-per-task 100000 is out of range"),
    Case(f"{PLAN} --mem 1e9", "--mem 1e+09 is out of range"),
    Case(f"{PLAN} --max-restarts 99999999", "--max-restarts 99999999 is out of range"),
    Case(f"{PLAN} --race 1x4,100000x4 --partition a100-80gb", "--race 100000 is out of range"),
    Case(f"{COUPLE} --sim-nodes 100000 -- ./sim", "--sim-nodes 100000 is out of range"),
    Case(f"{PLAN} --gpus-per-node 1 --procs-per-node 1", "not allowed with argument"),
    Case(f"{PLAN} --nodes 0", "--nodes 0 is out of range"),
    Case(f"{PLAN} --nodes two", "invalid int value: 'two'"),
    Case(f"{PLAN} --cpus-per-task 0", "--cpus-per-task 0 is out of range"),
    Case(f"{PLAN} --mem -5", "--mem -5 is out of range"),
    Case(f"{PLAN} --mem 0", "--mem 0 is out of range"),
    Case(f"{PLAN} --mem nan", "--mem nan is out of range"),
    Case(f"{PLAN} --global-batch 0", "--global-batch 0 is out of range"),
    Case(f"{PLAN} --global-batch 7", "not divisible"),
    Case(f"{PLAN} --max-restarts -1", "--max-restarts -1 is out of range"),
    Case(f"{PLAN} --signal BOGUS", "--signal 'BOGUS' is not a signal a diffscale run checkpoints on"),
    Case(f"{PLAN} --signal HUP", "is not a signal a diffscale run checkpoints on"),
    Case(f"{USER_CMD} --signal KILL -- sleep 1", "is not a signal a job can trap"),
    Case(f"{PLAN} --signal-lead -5", "--signal-lead -5 is out of range"),
    Case(f"{PLAN} --signal-lead 0", "--signal-lead 0 is out of range"),
    Case(f"{PLAN} --signal-lead 7200 --time 01:00:00", "is not shorter than the job's time limit"),
    Case(f"{PLAN} --partition nope", "nope"),
    Case(f"{PLAN} --account 'a b'", "has characters a scheduler option cannot carry"),
    Case(f"{PLAN} --race 0x1,1x1", "is not NODESxGPUS"),
    Case(f"{PLAN} --race 1x4", "needs at least two shapes"),
    Case(f"{PLAN} --race 1x4,1x4", "lists 1x4 twice"),
    Case(f"{PLAN} --race 2", "--race 2 counts --partition auto's candidates"),
    Case(f"{PLAN} --partition auto --race 1", "--race 1 is out of range: a race needs at least 2 candidates"),
    Case(f"{PLAN} --partition auto --race 1x4,2x2", "lists shapes of one partition"),
    Case(f"{SUBMIT} --partition auto", "submit needs to know how many of them to race"),
    Case(f"{PLAN} --setup 'module load a\nconda activate b'", "holds a line break"),
    Case(f"{PLAN} --setup ' '", "is not one shell line"),
    # plan and submit: what runs, where it goes, the profile
    Case("plan --cluster nope --preset tiny", "unknown cluster 'nope'"),
    Case("plan --cluster {ws}/missing.yaml --preset tiny", "does not exist"),
    Case("plan --cluster {ws}/bad.yaml --preset tiny", "is not a known field", (_file("bad.yaml", _BAD_PROFILE),)),
    Case("plan --cluster {ws}/locked.yaml --preset tiny", "permission denied",
         (_file("locked.yaml", _BAD_PROFILE, 0),), locked=True),
    Case("plan {ws}/locked.yaml --cluster purdue-gilbreth --account mylab", "permission denied",
         (_file("locked.yaml", "{}", 0),), locked=True),
    Case("plan --cluster purdue-gilbreth --account mylab", "nothing to run"),
    Case("plan --cluster purdue-gilbreth --account mylab --preset tiny {ws}/c.yaml",
         "both --preset and a positional argument"),
    Case("plan --cluster purdue-gilbreth --account mylab --set train.steps=1 -- true",
         "--set applies to diffscale runs"),
    Case("plan --preset tiny", "the following arguments are required: --cluster"),
    Case("submit --cluster purdue-gilbreth --account mylab --preset policy --data zarr:data/demos.zarr --out {ws}/s",
         "data path 'data/demos.zarr' (data.source zarr:data/demos.zarr) does not exist under"),
    Case("submit --cluster purdue-gilbreth --account mylab --data npz:x.npz --out {ws}/s -- true",
         "--data applies to diffscale runs"),
    Case("plan --cluster purdue-gilbreth --account mylab --preset tiny --out {ws}/afile/sub", "lies under",
         (_file("afile"),)),
    Case("submit --cluster purdue-gilbreth --account mylab --preset tiny --out {ws}/afile", "is a regular file",
         (_file("afile"),)),
    Case("submit --cluster purdue-gilbreth --account mylab --preset tiny --out {ws}/locked/run",
         "no permission to write", (LOCKED_DIR,), locked=True),
    Case(f"{SUBMIT} --gpus-per-node 8", "or pass --force to go ahead anyway"),
    # plan and submit --couple: a simulation feeding a trainer
    Case(f"{COUPLE} --sim-nodes 0 -- ./sim", "--sim-nodes 0 is out of range"),
    Case(f"{COUPLE} --sim-procs-per-node 0 -- ./sim", "--sim-procs-per-node 0 is out of range"),
    Case(f"{COUPLE} --sim-time 00:00:00 -- ./sim", "is not a positive duration"),
    Case(f"{COUPLE} --sim-partition nope -- ./sim", "has no partition 'nope'"),
    Case(f"{COUPLE} --race 1x1,2x1 -- ./sim", "--race and --couple cannot be combined"),
    Case(COUPLE, "--couple needs the simulation's command"),
    Case("plan --cluster dkrz-levante --account a --couple {ws}/sp -- ./sim", "--couple needs the trainer's config"),
    Case("plan --cluster dkrz-levante --account a --preset field-icon --couple {ws}/afile/sp -- ./sim", "lies under",
         (_file("afile"),)),
    # status, logs, cancel
    Case("status {ws}/nowhere", "does not exist -- pass the --out folder of `diffscale train` or `diffscale submit`"),
    Case("status {ws}/empty", "holds no training records (metrics.jsonl) and no checkpoints", (_folder("empty"),)),
    Case("report {ws}/nowhere", "does not exist"),
    # probe: a user's command measured for a bounded time
    Case("probe", "nothing to probe -- write the command after `--`"),
    Case("probe --out {ws}/p -- {ws}/nonexistent-cmd", "not found -- give the path of an existing program"),
    Case("probe --seconds 0 -- true", "--seconds 0 is out of range: a probe runs 5 to 1800 s"),
    Case("probe --seconds 99999 -- true", "--seconds 99999 is out of range: a probe runs 5 to 1800 s"),
    Case("report {run} --out {ws}/afile/r.html", "is a regular file", (*RUN, _file("afile"))),
    Case("status {ws}/jobs", "is not a diffscale jobs file", (_file("jobs/jobs.json", "{not json"),)),
    Case("status {ws}/jobs", "is not a diffscale jobs file", (_file("jobs/jobs.json", '{"submissions": [{}]}'),)),
    Case("status {ws}/jobs", "cannot read", (_file("jobs/jobs.json", "{}", 0),), locked=True),
    Case("status {ws}/jobs", "`scontrol` is not on PATH", (_jobs,), env=NO_SCHEDULER),
    Case("cancel {ws}/jobs", "is not a diffscale jobs file", (_file("jobs/jobs.json", "[]"),)),
    Case("cancel {ws}/jobs", "cannot read", (_file("jobs/jobs.json", "{}", 0),), locked=True),
    Case("cancel {ws}/jobs", "`scontrol` is not on PATH", (_jobs,), env=NO_SCHEDULER),
    Case("logs {ws}/jobs -n -3", "-n -3 is out of range", (_jobs,)),
    Case("logs {ws}/jobs --job 999", "job 999 is not part of the latest submission", (_jobs,)),
    Case("logs {ws}/jobs", "no log yet for job(s) 123", (_jobs,)),
    Case("logs {ws}/jobs", "name the log '../../../../../../../../etc/hostname', outside the run directory",
         (_outside_log,)),
    Case("logs {ws}/empty", "has no train.log and no jobs.json", (_folder("empty"),)),
    Case("logs {ws}/jobs", "permission denied", (_jobs, _file("jobs/logs/ds-jobs-abc123-123.out", "log", 0)),
         locked=True),
    # cluster
    Case("cluster", "the following arguments are required"),
    Case("cluster show nope", "unknown cluster 'nope'"),
    Case("cluster show {ws}/missing.yaml", "does not exist"),
    Case("cluster show {ws}/bad.yaml", "is not a known field", (_file("bad.yaml", _BAD_PROFILE),)),
    Case("cluster show {ws}/locked.yaml", "permission denied", (_file("locked.yaml", _BAD_PROFILE, 0),), locked=True),
    Case("cluster discover --name 'bad name!'", "is not a usable profile name"),
    Case("cluster discover --name ../up", "is not a usable profile name"),
    Case("cluster discover --out {ws}/afile/x.yaml", "lies under", (_file("afile"),)),
    Case("cluster discover --out {ws}", "is a folder, not a file"),
    Case("cluster discover --out {ws}/locked/x.yaml", "no permission to write", (LOCKED_DIR,), locked=True),
    Case("cluster discover", "no scheduler answers here", env=NO_SCHEDULER),
    Case("cluster discover --scheduler pbs", "invalid choice: 'pbs'"),
    # bench
    Case("bench --steps -1 --out {ws}/b", "--steps -1 is out of range"),
    Case("bench --steps 0 --out {ws}/b", "--steps 0 is out of range"),
    Case("bench --warmup -1 --out {ws}/b", "--warmup -1 is out of range"),
    Case("bench --gpus 0 --out {ws}/b", "--gpus '0' is out of range"),
    Case("bench --gpus 1,-2 --out {ws}/b", "--gpus '1,-2' is out of range"),
    Case("bench --gpus a --out {ws}/b", "is not a list of numbers"),
    Case("bench --two-node -1 --out {ws}/b", "--two-node -1 is out of range"),
    Case("bench --profile -1 --out {ws}/b", "--profile -1 is out of range"),
    Case("bench --sampling-steps 0 --out {ws}/b", "--sampling-steps 0 is out of range"),
    Case("bench --timeout 0 --out {ws}/b", "--timeout 0 is out of range"),
    Case("bench --concurrent 0 --out {ws}/b", "starts no run"),
    Case("bench --preset nope --out {ws}/b", "unknown preset 'nope'"),
    Case("bench --recipe bogus --out {ws}/b", "unknown recipe 'bogus'"),
    Case("bench --trace --out {ws}/b", "none are profiled"),
    Case("bench --out {ws}/afile", "is a regular file, not a folder", (_file("afile"),)),
    Case("bench --out {ws}/afile/sub", "lies under", (_file("afile"),)),
    Case("bench --out {ws}/locked/b", "no permission to write", (LOCKED_DIR,), locked=True),
    Case("bench --collect --out {ws}/empty", "no worker records", (_folder("empty"),)),
    # doctor
    Case("doctor {ws}/nowhere", "is neither a run directory, a log file nor a job id"),
    Case("doctor {ws}/locked.log", "cannot read the log", (_file("locked.log", "boom", 0),), locked=True),
    Case("doctor 99999999", "no scheduler here knows job 99999999", env=NO_SCHEDULER),
    # the top level
    Case("bogus", "invalid choice: 'bogus'"),
    # sweep
    Case("sweep plan --preset tiny --zip optim.lr=1e-4,3e-4 --zip train.seed=0,1,2 --out {ws}/sw",
         "zipped axes have different lengths (optim.lr has 2, train.seed has 3)"),
    Case("sweep plan --axis lr=1e-4 --out {ws}/sw -- python train.py --lr {{lr}} --depth {{depth}}",
         "placeholder {depth} of the command has no value"),
    Case("sweep plan --axis lr=1e-4 --axis width=8 --out {ws}/sw -- python train.py --lr {{lr}}",
         "axis width is not a placeholder of the command"),
    Case("sweep run --progress-every -1 --axis k=a --out {ws}/sw -- true {{k}}",
         "--progress-every -1 is not a number of seconds >= 0"),
    Case("sweep run --progress-every nan --axis k=a --out {ws}/sw -- true {{k}}",
         "--progress-every nan is not a number of seconds >= 0"),
    Case("sweep run --preset tiny --axis optim.lr=1e-4,abc --out {ws}/sw",
         "element 1 (optim.lr=abc): config optim.lr: expected a number"),
    Case("sweep plan --preset tiny --axis data.fraction=0.5,0 --out {ws}/sw",
         "element 1 (data.fraction=0): config data.fraction: is 0.0, outside (0, 1]"),
    Case("sweep plan --preset tiny --axis train.seed=0,1,2 --cluster {ws}/p.yaml --procs-per-node 1 --out {ws}/sw",
         "job shape cpu-1x1 has 3 elements, more than one array may hold (2, MaxArraySize in slurm.conf)",
         (_file("p.yaml", "name: p\nscheduler: slurm\nmax_array_size: 2\npartitions:\n  cpu: {gpus_per_node: 0, "
                          "cpus_per_node: 4, mem_per_node_gb: 8, max_time: null}\n"),)),
    Case("sweep plan --preset tiny --axis cluster.partition=a,b --out {ws}/sw",
         "axis cluster.partition varies the cluster job, but the sweep names no cluster"),
    Case("sweep plan {ws}/s.yaml", "zip[0] is not a mapping",
         (_file("s.yaml", "base: {preset: tiny}\nzip: [[1, 2]]\n"),)),
    Case("sweep plan {ws}/s.yaml", "bases is not a sweep setting (did you mean 'base'?)",
         (_file("s.yaml", "bases: {preset: tiny}\n"),)),
    Case("sweep plan {ws}/missing.yaml", "missing.yaml' does not exist -- pass a sweep YAML"),
    Case("sweep plan", "no sweep given"),
    Case("sweep submit --preset tiny --axis optim.lr=1e-4 --out {ws}/sw", "names no cluster to submit to"),
    Case("sweep submit {ws}/s.yaml --failed", "--failed resubmits the failed elements of a started sweep",
         (_file("s.yaml", "base: {preset: tiny}\naxes: {optim.lr: [1e-4]}\n"),)),
    Case("sweep status {ws}/nosweep", "is not a sweep directory", (_folder("nosweep"),)),
    Case("sweep report {ws}/nosweep", "is not a sweep directory", (_folder("nosweep"),)),
    Case("sweep collect {ws}/nosweep", "is not a sweep directory", (_folder("nosweep"),)),
    Case("sweep run --preset tiny --axis optim.lr=1e-4 --gpus 0,x --out {ws}/sw", "--gpus '0,x' is not a list"),
    Case("sweep plan {ws}/big.yaml", "the sweep has 1,000,000 elements (1000 x 1000), more than max_elements (10,000)",
         (_big_grid,)),
    Case("sweep plan --preset tiny --axis train.seed=0,1,2,3 --max-elements 3 --out {ws}/sw",
         "the sweep has 4 elements (4), more than max_elements (3)"),
    Case("sweep plan --preset tiny --axis train.seed=0 --max-elements 0 --out {ws}/sw",
         "max_elements 0 is out of range"),
    Case("sweep plan {ws}/s.yaml", "cluster.mem 'lots' is not an amount of memory -- write GiB per node",
         (_file("s.yaml", "base: {preset: tiny}\naxes: {optim.lr: [1e-4]}\ncluster: {name: bu-scc, mem: lots}\n"),)),
    Case("sweep plan {ws}/s.yaml", "cluster.mem '0G' is out of range",
         (_file("s.yaml", "base: {preset: tiny}\naxes: {optim.lr: [1e-4]}\ncluster: {name: bu-scc, mem: 0G}\n"),)),
    Case("sweep plan {ws}/s.yaml", "cluster.time 5400 is a number (YAML reads an unquoted H:MM:SS as seconds) -- "
         "quote it", (_file("s.yaml", "base: {preset: tiny}\naxes: {optim.lr: [1e-4]}\n"
                                      "cluster: {name: bu-scc, time: 1:30:00}\n"),)),
    Case("sweep plan {ws}/s.yaml", "cluster.nodes 'two' is not a whole number",
         (_file("s.yaml", "base: {preset: tiny}\naxes: {optim.lr: [1e-4]}\ncluster: {name: bu-scc, nodes: two}\n"),)),
    Case("sweep plan {ws}/s.yaml", "cluster.force names 'bogus', which is not a preflight check of this sweep",
         (_file("s.yaml", "base: {preset: tiny}\naxes: {optim.lr: [1e-4]}\ncluster: {name: purdue-gilbreth, "
                          "account: lab, gpus_per_node: 1, force: [bogus]}\n"),)),
    Case("sweep plan --preset tiny --axis optim.lr=1e-4 --force-check nodes --out {ws}/sw",
         "--force-check names a preflight check, but the sweep names no cluster"),
    Case("sweep plan --preset tiny --axis cluster.shape=3x1 --cluster {ws}/p.yaml --procs-per-node 1 --out {ws}/sw",
         "preflight check 'nodes' failed for element 0 (cluster.shape=3x1): 3 nodes > the partition's maximum 2 -- "
         "use --nodes 2 or fewer",
         (_file("p.yaml", "name: p\nscheduler: slurm\npartitions:\n  cpu: {gpus_per_node: 0, cpus_per_node: 4, "
                          "mem_per_node_gb: 8, max_time: null, max_nodes: 2}\n"),)),
    Case("sweep plan {ws}/s.yaml", "preflight check 'host RAM per node' failed for element 0 (optim.lr=1e-4): "
         "cluster.mem: 100 GiB > 8 GiB per 'cpu' node -- ask at most cluster.mem: 8; or force this check alone "
         "(cluster.force: ['host RAM per node'], or --force-check 'host RAM per node'), or every check with --force",
         (_file("s.yaml", "base: {preset: tiny}\naxes: {optim.lr: [1e-4]}\ncluster: {name: p.yaml, procs_per_node: 1, "
                          "mem: 100G}\n"),
          _file("p.yaml", "name: p\nscheduler: slurm\npartitions:\n  cpu: {gpus_per_node: 0, cpus_per_node: 4, "
                          "mem_per_node_gb: 8, max_time: null, max_nodes: 2}\n"))),
    Case("sweep plan {ws}/sw --out {ws}/elsewhere", "a started sweep stays where it is", (_sweep,)),
    Case("sweep status {ws}/sw", "elements.json is damaged", (_sweep, _file("sw/elements.json", "[{\"index\": 0}"))),
]

TRAINED: dict[str, Path] = {}


@pytest.fixture(scope="module", autouse=True)
def trained_run(tmp_path_factory):
    """One micro run for every case that needs a trained run (copied per case)."""
    run = tmp_path_factory.mktemp("trained") / "run"
    assert main(["train", "--out", str(run), *micro_args(steps=8)]) == 0
    TRAINED["run"] = run
    classes = run.parent / "classes"
    assert main(["train", "--out", str(classes), *micro_args("model.class_conditional=on", steps=4)]) == 0
    TRAINED["classes"] = classes
    fields = run.parent / "fields"
    assert main(["train", "--preset", "field-icon", "--device", "cpu", "--out", str(fields), "--set", "train.steps=2",
                 "--set", "train.sample_every=0"]) == 0
    TRAINED["fields"] = fields
    yield run


def _snapshot(root: Path) -> dict[str, tuple]:
    """Every path under ``root``: files with their mode, size and modification time, folders with
    their mode (a folder's time only says an entry came and went; what is there is compared)."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            found[str((Path(dirpath) / name).relative_to(root))] = ((Path(dirpath) / name).lstat().st_mode,)
        for name in filenames:
            st = (Path(dirpath) / name).lstat()
            found[str((Path(dirpath) / name).relative_to(root))] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return found


def _argv(case: Case, ws: Path) -> list[str]:
    words = [w.format(ws=ws, run=ws / "run") for w in shlex.split(case.argv)]
    if words[0] == "train" and "--preset" not in words:  # a wrongly accepted train then takes seconds
        words[1:1] = micro_args(steps=8)
    return words


@pytest.mark.parametrize("case", CASES, ids=[f"{c.argv}|{c.says}" for c in CASES])
def test_a_bad_input_ends_in_one_error_line_and_changes_nothing(case, tmp_path, capsys, monkeypatch):
    if case.locked and unavailable():
        pytest.skip(unavailable())
    ws = tmp_path / "ws"
    ws.mkdir()
    monkeypatch.chdir(ws)
    monkeypatch.setenv("DIFFSCALE_CLUSTERS_DIR", str(ws / "clusters"))
    for key, value in case.env:
        monkeypatch.setenv(key, value)
    for make in case.setup:
        make(ws)
    before = _snapshot(ws)
    capsys.readouterr()
    with without_root_bypass() if case.locked else contextlib.nullcontext():
        try:
            code = main(_argv(case, ws))
        except BaseException as exc:  # noqa: BLE001 - any escape is the failure this test exists for
            pytest.fail(f"raised {type(exc).__name__}: {exc}")
    out, err = capsys.readouterr()
    errors = [line for line in (out + err).splitlines() if line.startswith("error:")]
    assert code == 2, (out, err)
    assert len(errors) == 1 and err.rstrip().splitlines()[-1] == errors[0], (out, err)
    assert case.says in errors[0] and " -- " in errors[0], errors[0]
    assert "Traceback" not in out + err
    assert _snapshot(ws) == before, "the bad input created or changed files"
