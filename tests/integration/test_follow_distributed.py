"""Two torchrun ranks following one spool: rank 0 reads it and broadcasts what it read, so both
ranks wait in step and train on exactly the rows one process would (gloo on CPU)."""

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from diffscale.runtime import checkpoint as ckpt
from diffscale.tasks.fields.data import FieldGenerator
from diffscale.tasks.fields.spool import SpoolWriter

pytestmark = pytest.mark.integration

ARGS = ["--preset", "field-icon", "--device", "cpu"]
for _item in ("model.hidden=32", "model.depth=1", "model.embed_dim=16", "train.steps=12", "train.log_every=4",
              "train.checkpoint_every=12", "train.sample_count=4", "train.sample_steps=2", "optim.warmup_steps=2",
              "train.seed=3"):
    ARGS += ["--set", _item]


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", COLUMNS="200")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


def _newest(run):
    return ckpt.list_checkpoints(run)[-1]


def test_two_ranks_wait_together_and_train_on_the_rows_of_one_process(tmp_path):
    spool = tmp_path / "spool"
    writer = SpoolWriter(spool)
    ddp = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                            "-m", "diffscale", "train", "--data", f"spool:{spool}:240", "--out", str(tmp_path / "ddp"),
                            *ARGS, "--set", "train.batch_per_gpu=8"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env())
    assert ddp.stdout is not None
    seen = []
    for line in ddp.stdout:
        seen.append(line)
        if "waiting for data" in line:
            break
    generator = FieldGenerator()
    for step in range(3):  # the simulation's output arrives while both ranks wait
        cond, x = generator.sample(80, seed=step)
        writer.write(cond.numpy(), x.numpy(), sim_time=600.0 * step)
    out = "".join(seen) + ddp.communicate(timeout=600)[0]
    assert ddp.returncode == 0, out
    assert "world size 2 (torchrun) | effective batch 16 = 8 x 2 proc x 1 accum" in out
    assert out.count("waiting for data: buffer 0/240 samples") == 1  # rank 0 alone reports

    single = subprocess.run([sys.executable, "-m", "diffscale", "train", "--data", f"spool:{spool}:240",
                             "--out", str(tmp_path / "single"), *ARGS], capture_output=True, text=True, env=_env(),
                            timeout=600)
    assert single.returncode == 0, single.stdout + single.stderr
    a, b = _newest(tmp_path / "ddp"), _newest(tmp_path / "single")
    assert a.name == b.name
    task_a, task_b = load_file(str(a / "task.safetensors")), load_file(str(b / "task.safetensors"))
    assert all(torch.equal(task_a[k], task_b[k]) for k in task_b)  # the same buffer and statistics
    weights_a, weights_b = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert all(torch.allclose(weights_a[k], weights_b[k], atol=1e-5) for k in weights_b)  # up to all-reduce order
    losses = [[json.loads(r)["loss"] for r in (run / "metrics.jsonl").read_text().splitlines() if '"loss"' in r]
              for run in (tmp_path / "ddp", tmp_path / "single")]
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)

    # The simulation ends: both ranks learn it from rank 0 at their next agreement, train one more
    # pass over the final buffer (240 samples / 16) together and end, checkpointed, with exit 0.
    writer.end(0)
    ended = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                            "-m", "diffscale", "train", "--data", f"spool:{spool}:240", "--out", str(tmp_path / "ddp"),
                            *ARGS, "--set", "train.batch_per_gpu=8", "--set", "train.steps=1000000",
                            "--resume", "auto"], capture_output=True, text=True, env=_env(), timeout=600)
    assert ended.returncode == 0, ended.stdout + ended.stderr
    records = [json.loads(r) for r in (tmp_path / "ddp" / "metrics.jsonl").read_text().splitlines()]
    source_ended = [r for r in records if r.get("kind") == "source_ended"]
    assert len(source_ended) == 1 and source_ended[0]["ended"] == "exited", source_ended
    final = ckpt.load_checkpoint(_newest(tmp_path / "ddp"))
    assert final.step == source_ended[0]["step"] + 240 // 16
    assert final.task["buffer_source_end"].tolist() == [0, 0, final.step]
    assert ended.stderr.count(f"done: {final.step} steps") == 1, ended.stderr  # progress goes to stderr
