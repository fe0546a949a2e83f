"""Shared test helpers: a micro model config that trains in seconds on a CPU, and a CLI runner."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def unavailable_here(reason: str) -> None:
    """Skip a test whose tool this machine lacks, with the reason; under CI (``CI=true``, which
    installs every tool the ``test`` extra names and runs as root) fail instead: a skip there
    would hide a test that never ran."""
    import pytest

    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true: {reason}")
    pytest.skip(reason)


def required(module: str, extra: str = "test"):
    """``module`` imported, or :func:`unavailable_here` (the ``extra`` of pyproject.toml installs it)."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        unavailable_here(f"{module} is not installed ({exc}); pip install -e '.[{extra}]' installs it")

# A 2-level UNet on 8 px glyphs: a training step takes milliseconds.
MICRO = [
    "model.sample_size=8",
    "model.block_out_channels=[8,16]",
    "model.attention=[false,true]",
    "model.layers_per_block=1",
    "model.norm_num_groups=8",
    "train.batch_per_gpu=8",
    "train.log_every=2",
    "train.checkpoint_every=4",
    "train.divergence_patience_steps=4",  # the guard's 2 windows, as at the image presets' log_every
    "train.sample_count=4",
    "train.sample_steps=3",
    "optim.warmup_steps=2",
]


def micro_args(*extra: str, steps: int = 8) -> list[str]:
    args: list[str] = []
    for item in [*MICRO, f"train.steps={steps}", *extra]:
        args += ["--set", item]
    return args


def write_idx(path: Path, array) -> Path:
    """An IDX file as MNIST and EMNIST ship them: uint8 images (N, H, W) or labels (N,), gzipped
    where ``path`` ends in .gz; its folders made."""
    import gzip

    import numpy as np

    array = np.asarray(array)
    magic = 2051 if array.ndim == 3 else 2049
    header = b"".join(v.to_bytes(4, "big") for v in (magic, *array.shape))
    path.parent.mkdir(parents=True, exist_ok=True)
    with (gzip.open if path.suffix == ".gz" else open)(path, "wb") as out:
        out.write(header + array.astype(np.uint8).tobytes())
    return path


def emnist_letters(root: Path, labels: list[int]) -> Path:
    """An EMNIST letters root (torchvision's layout) of one 28 px image per label (1-26 name
    'a'..'z'): each image a bar as long as its label, so the classes differ."""
    import numpy as np

    images = np.zeros((len(labels), 28, 28), np.uint8)
    for i, label in enumerate(labels):
        images[i, 2:2 + label, 12:16] = 255
    raw = root / "EMNIST" / "raw"
    write_idx(raw / "emnist-letters-train-images-idx3-ubyte.gz", images)
    write_idx(raw / "emnist-letters-train-labels-idx1-ubyte.gz", labels)
    return root


def run_cli(*args: str, env: dict | None = None, timeout: float = 300,
            cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m diffscale ARGS`` as a user would; returns the completed process."""
    full_env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="200")
    full_env.pop("RANK", None)
    full_env.pop("WORLD_SIZE", None)
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "diffscale", *args], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=cwd)


def fake_run(run_dir: Path, *, steps: int = 40, gpus: int = 2) -> Path:
    """A run folder as training and a cluster submission leave it, written directly (no training):
    metrics with GPU fields, two preview grids, a checkpoint folder, config.yaml, system.json,
    jobs.json with a continuation (a requeue), and a job log with a failure the doctor knows."""
    import json

    import numpy as np
    from PIL import Image

    from diffscale.cluster.jobs import records as jobs
    from diffscale.config import RunConfig, write_yaml

    run_dir.mkdir(parents=True)
    cfg = RunConfig()
    cfg.train.steps = steps
    write_yaml(cfg, run_dir / "config.yaml")
    with open(run_dir / "metrics.jsonl", "w") as fh:
        for step in range(5, steps + 1, 5):
            record = {"step": step, "total_steps": steps, "loss": 1.0 / step, "lr": 1e-3 * step / steps,
                      "samples_per_s": 100.0 + step, "eta_s": float(steps - step), "time": 1.7e9 + step}
            for i in range(gpus):
                record.update({f"gpu{i}_util_pct": 90.0 + i, f"gpu{i}_mem_mb": 1000.0 * (i + 1),
                               f"gpu{i}_mem_pct": 10.0})
            fh.write(json.dumps(record) + "\n")
    (run_dir / "samples").mkdir()
    for step in (steps // 2, steps):
        pixels = np.random.default_rng(step).integers(0, 255, (34, 34, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(run_dir / "samples" / f"step{step:08d}.png")
    (run_dir / "checkpoints" / f"step_{steps:08d}").mkdir(parents=True)
    (run_dir / "system.json").write_text(json.dumps({"collected_at": "2026-11-26T10:00:00", "topology": "GPU0 X NV18",
                                                      "sections": [{"title": "GPUs", "rows": [["GPU 0", "H100"]]}]}))
    record = jobs.JobRecord(job_id="777001", name="ds-run", shape="1x2", partition="gpu", script="job.sh",
                            log="logs/job-777001.out", segment=1, segments=2)
    jobs.append(run_dir, jobs.Submission(scheduler="slurm", cluster="testcluster", submitted_at="2026-11-26 10:00",
                                         run_dir=str(run_dir), what="diffscale tiny", jobs=(record,)))
    (run_dir / jobs.CONTINUATIONS).write_text("777002\t777001\tlogs/job-777002.out\n")
    (run_dir / "logs").mkdir()
    (run_dir / "logs" / "job-777001.out").write_text(
        "step 10/40\nTraceback (most recent call last):\n  File \"x.py\", line 1\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    return run_dir


def random_episodes(lengths=(20, 30), obs_dim=3, action_dim=2, seed=0):
    """Demonstration episodes of random float32 ``(obs, action)`` arrays, one per length."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(n, obs_dim)).astype(np.float32), rng.normal(size=(n, action_dim)).astype(np.float32))
            for n in lengths]


def concat_episodes(episodes):
    """``(obs, action, episode_ends)`` of episodes stored one after another, as npz and zarr keep them."""
    import numpy as np

    obs = np.concatenate([o for o, _ in episodes])
    action = np.concatenate([a for _, a in episodes])
    return obs, action, np.cumsum([len(o) for o, _ in episodes])


# SLURM's documented hostlist forms (slurm_hostlist_create(3), Slurm::Hostlist(3pm), slurm.conf(5)
# NodeName) and what SLURM's hostlist.c makes of them.
SLURM_HOSTLISTS = [
    ("n1", ["n1"]),
    ("linux[1-3,6]", ["linux1", "linux2", "linux3", "linux6"]),
    ("node1,node[2-5,12]", ["node1", "node2", "node3", "node4", "node5", "node12"]),
    ("tux[0-2,12,20-21]", ["tux0", "tux1", "tux2", "tux12", "tux20", "tux21"]),
    ("gpu[01-03,07]", ["gpu01", "gpu02", "gpu03", "gpu07"]),
    ("a[1-2],b3,c[009-010]", ["a1", "a2", "b3", "c009", "c010"]),
    ("n[8-10]", ["n8", "n9", "n10"]),  # width of the first bound: no padding
    ("n[08-10]", ["n08", "n09", "n10"]),
    ("node1 node2\tnode3", ["node1", "node2", "node3"]),  # whitespace separates too
    # several groups: the product, the first group varying slowest
    ("a[1-2]-b[01-02]", ["a1-b01", "a1-b02", "a2-b01", "a2-b02"]),
    ("rack[0-1]_blade[0-1,5]", ["rack0_blade0", "rack0_blade1", "rack0_blade5",
                                "rack1_blade0", "rack1_blade1", "rack1_blade5"]),
    ("x[1,3]-y[2],z", ["x1-y2", "x3-y2", "z"]),
]


def run_in_terminal(*args: str, columns: int = 80, timeout: float = 300) -> tuple[int, str]:
    """Run ``python -m diffscale ARGS`` on a pseudo-terminal ``columns`` wide, as in a user's
    terminal window; returns (exit code, what it showed, colours and styles removed)."""
    import fcntl
    import pty
    import re
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = dict(os.environ, COLUMNS=str(columns), LINES="50", NO_COLOR="1", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "diffscale", *args], stdin=subprocess.DEVNULL, stdout=slave,
                            stderr=slave, env=env)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: every writer closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    code = proc.wait(timeout=timeout)
    text = b"".join(chunks).decode("utf-8", "replace").replace("\r\n", "\n")
    return code, re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)


def eventually(condition: Callable[[], object], what: str, poll: float = 0.05) -> None:
    """Wait until ``condition()`` holds; fail with ``what`` after a minute (a guard against a hang,
    not a measurement: on a busy machine it holds later, not never)."""
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(poll)
