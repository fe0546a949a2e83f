"""Real torchrun process groups (gloo on CPU): the same training on 1, 2 and 2x1 'nodes'."""

import json
import os
import socket
import subprocess
import sys

import pytest
from safetensors.torch import load_file

from diffscale.cli import main
from diffscale.runtime import checkpoint as ckpt

from helpers import micro_args, run_cli

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env():
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


def torchrun(*args: str, nproc: int = 2, extra: tuple[str, ...] = (), timeout: float = 300):
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", *extra,
           "-m", "diffscale", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_env())


def _weights(run_dir):
    last = ckpt.list_checkpoints(run_dir)[-1]
    return last.name, load_file(str(last / "model.safetensors"))


def _assert_close(a, b):
    """Equal up to float reassociation of the all-reduce.

    Biases that feed a GroupNorm have a gradient that is zero in exact arithmetic, so
    their float noise is normalised by Adam into +-lr steps; those few elements may
    differ by up to lr x steps. Everything else agrees to 1e-5.
    """
    assert a.keys() == b.keys()
    total = sum(v.numel() for v in a.values())
    off = sum(int(((a[k] - b[k]).abs() > 1e-5).sum()) for k in a)
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    assert off / total < 0.03, f"{off} of {total} parameters differ by more than 1e-5"
    assert worst <= 1e-3 * STEPS, f"parameters differ by up to {worst}"


def _metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


STEPS = 6


@pytest.fixture(scope="module")
def single_reference(tmp_path_factory):
    """One process, batch 4 x accumulation 2: effective batch 8."""
    run = tmp_path_factory.mktemp("single") / "run"
    # in the test's process: the torchrun groups it is compared with are the processes under test
    assert main(["train", "--out", str(run), *micro_args("train.batch_per_gpu=4", "train.grad_accum=2",
                                                         steps=STEPS)]) == 0
    return run


def test_two_processes_match_one_process_at_the_same_effective_batch(tmp_path, single_reference):
    run = tmp_path / "ddp"
    proc = torchrun("train", "--out", str(run), *micro_args("train.batch_per_gpu=4", steps=STEPS),
                    extra=("--standalone",))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "world size 2 (torchrun) | effective batch 8 = 4 x 2 proc x 1 accum" in proc.stderr
    name_a, a = _weights(single_reference)
    name_b, b = _weights(run)
    assert name_a == name_b
    _assert_close(a, b)
    ma, mb = _metrics(single_reference), _metrics(run)
    assert [m["step"] for m in mb] == [m["step"] for m in ma]  # one line per report: only rank 0 logs
    for x, y in zip(ma, mb, strict=True):  # the same samples, noise and timesteps at every step
        assert x["loss"] == pytest.approx(y["loss"], rel=1e-5)
        assert x["grad_norm"] == pytest.approx(y["grad_norm"], rel=1e-4)
    assert len(list((run / "tb").iterdir())) == 1
    assert proc.stderr.count("diffscale | ") == 1  # the banner comes from rank 0 alone


def test_two_node_emulation_with_torchrun_nnodes_2(tmp_path, single_reference):
    run = tmp_path / "twonode"
    port = _free_port()
    procs = []
    for node_rank in (0, 1):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node_rank={node_rank}",
               "--nproc_per_node=1", "--master_addr=127.0.0.1", f"--master_port={port}",
               "-m", "diffscale", "train", "--out", str(run), *micro_args("train.batch_per_gpu=4", steps=STEPS)]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env()))
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    _assert_close(_weights(single_reference)[1], _weights(run)[1])


def test_resume_on_a_different_world_size_keeps_the_effective_batch(tmp_path, single_reference, capsys):
    run = tmp_path / "resize"
    first = torchrun("train", "--out", str(run), "--max-steps", "4",
                     *micro_args("train.batch_per_gpu=4", steps=STEPS), extra=("--standalone",))
    assert first.returncode == 0, first.stdout + first.stderr
    capsys.readouterr()
    assert main(["train", "--out", str(run), "--resume", "auto",
                 *micro_args("train.batch_per_gpu=4", steps=STEPS)]) == 0
    second = capsys.readouterr().err
    assert "resuming on 1 processes (was 2): train.grad_accum 1 -> 2 keeps the effective batch at 8" in second
    _assert_close(_weights(single_reference)[1], _weights(run)[1])


@pytest.mark.parametrize("log_every", [2, 20])  # 20: the guard's early 10-step windows between logged ones
def test_two_ranks_take_the_divergence_guards_decisions_together(tmp_path, log_every):
    """A far too high learning rate after a healthy start: both ranks go back to the same state at
    the same steps (a rank that did not would hang or part ways at the next all-reduce), as one
    process at the same effective batch does."""
    single, ddp = tmp_path / "single", tmp_path / "ddp"
    too_high = ["--set", "optim.lr=0.1", "--set", f"train.log_every={log_every}"]
    healthy = micro_args("train.batch_per_gpu=4", "train.grad_accum=2", "optim.schedule=constant", steps=50)
    assert main(["train", "--out", str(single), "--max-steps", "30", *healthy]) == 0
    assert main(["train", "--out", str(single), "--resume", "auto", *healthy, *too_high]) == 0
    both = micro_args("train.batch_per_gpu=4", "optim.schedule=constant", steps=50)
    first = torchrun("train", "--out", str(ddp), "--max-steps", "30", *both, extra=("--standalone",))
    assert first.returncode == 0, first.stdout + first.stderr
    proc = torchrun("train", "--out", str(ddp), "--resume", "auto", *both, *too_high, extra=("--standalone",))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr.count("warning: divergence at step") >= 1  # said once per restore, by rank 0

    def restores(run):
        return [(m["step"], m["restored_step"]) for m in _metrics(run) if m.get("kind") == "divergence"]

    assert restores(ddp) == restores(single) and restores(ddp)
    assert proc.stderr.count("warning: divergence at step") == len(restores(ddp))
    _assert_close(_weights(single)[1], _weights(ddp)[1])


def test_a_missing_rank_fails_with_a_diagnosis_instead_of_hanging(tmp_path):
    env = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    proc = run_cli("train", "--out", str(tmp_path / "run"), *micro_args("runtime.join_timeout_s=3"),
                   env=env, timeout=120)
    assert proc.returncode == 2
    assert "error: only 1 of 2 ranks joined after 3 s" in proc.stderr
    assert "torchrun --nnodes N --node_rank K on each host" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_evaluation_while_training_is_shared_by_the_ranks_and_matches_one_process(tmp_path):
    """Each rank generates its rows of the seeded sample set (5 samples: 3 and 2) and every rank
    takes part in the gather; rank 0 alone writes the scores, the same as one process's."""
    evaluating = ("train.batch_per_gpu=4", "train.eval_every=3", "train.eval_count=5", "train.sample_sampler=dpmsolver")
    single = tmp_path / "single"
    assert main(["train", "--out", str(single), *micro_args(*evaluating, "train.grad_accum=2", steps=STEPS)]) == 0
    run = tmp_path / "ddp"
    proc = torchrun("train", "--out", str(run), *micro_args(*evaluating, steps=STEPS), extra=("--standalone",))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    one = [m for m in _metrics(single) if m.get("kind") == "eval"]
    two = [m for m in _metrics(run) if m.get("kind") == "eval"]
    assert [m["step"] for m in two] == [m["step"] for m in one] == [3, 6]
    for x, y in zip(one, two, strict=True):
        assert y["fd"] == pytest.approx(x["fd"], rel=1e-2)
    assert proc.stderr.count("eval at step 3:") == 1  # printed by rank 0 alone


# Two ranks as srun starts them: rank 0 hosts the rendezvous store. DDP is built after the
# group, as the trainer does (its import chain is what once captured the group), and the last
# collective comes right before the shutdown, as the preview's gather does.
SHUTDOWN = r'''
import os, torch
from diffscale.runtime.distributed import detect_launch, init_distributed
ctx = init_distributed(detect_launch(), torch.device("cpu"), join_timeout_s=120, collective_timeout_s=120)
from torch.nn.parallel import DistributedDataParallel
model = DistributedDataParallel(torch.nn.Linear(4, 4))
model(torch.ones(2, 4)).sum().backward()
rows = ctx.gather_rows(torch.full((1, 2), float(ctx.rank)), 1)
del model
ctx.shutdown()
threads = sorted(open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task"))
print("GATHERED", rows.flatten().tolist(), "THREADS", threads, flush=True)
'''


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads the process's threads from /proc")
def test_shutdown_ends_the_gloo_group_so_no_rank_aborts_at_exit(tmp_path):
    """After DistContext.shutdown no gloo thread is left: one still running while the interpreter
    finalises may need the GIL to release a collective's tensors, and the process then aborts
    ("terminate called without an active exception") although the run finished."""
    script = tmp_path / "shutdown.py"
    script.write_text(SHUTDOWN)
    port = str(_free_port())
    procs = []
    for rank in (0, 1):
        env = dict(_env(), SLURM_PROCID=str(rank), SLURM_LOCALID="0", SLURM_NODEID=str(rank), SLURM_NTASKS="2",
                   SLURM_STEP_ID="0", SLURM_JOB_ID="1", SLURM_JOB_NUM_NODES="2", SLURM_NTASKS_PER_NODE="1",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        procs.append(subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, env=env))
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    for out in outputs:
        assert "GATHERED [0.0, 0.0, 1.0, 1.0]" in out, out
        threads = out.split("THREADS", 1)[1]
        assert "gloo" not in threads and "pt_tcpstore" not in threads, out
