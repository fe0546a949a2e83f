"""A process killed with SIGKILL while saving leaves the previous checkpoint loadable."""

import os
import random
import signal
import subprocess
import sys
import textwrap
import time

from diffscale.runtime import checkpoint as ckpt

WRITER = textwrap.dedent("""
    import sys, torch
    from diffscale.runtime.checkpoint import CheckpointMeta, TrainingState, save_checkpoint
    run_dir = sys.argv[1]
    big = {f"w{i}": torch.full((256, 1024), float(i)) for i in range(24)}  # ~24 MB: saving takes a while
    opt = {"state": {0: {"step": torch.tensor(1.0), "exp_avg": torch.ones(4)}},
           "param_groups": [{"lr": 0.1, "params": [0]}]}
    step = 0
    while True:
        step += 1
        for t in big.values():
            t.add_(1)
        save_checkpoint(run_dir, TrainingState(step=step, model=big, ema=big, optimizer=opt,
                                               meta=CheckpointMeta(saved_at=step),
                                               rng={"torch_cpu": torch.get_rng_state()}), keep=2)
        print(step, flush=True)
""")


def test_sigkill_at_random_moments_never_leaves_a_broken_newest_checkpoint(tmp_path):
    rng = random.Random(1234)
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    run_dir = tmp_path / "run"
    trials = 0
    killed_mid_save = 0
    for _ in range(8):
        proc = subprocess.Popen([sys.executable, str(script), str(run_dir)], stdout=subprocess.PIPE, text=True)
        first = proc.stdout.readline()  # at least one complete checkpoint exists
        assert first.strip()
        time.sleep(rng.uniform(0.0, 0.6))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        trials += 1
        leftovers = list((run_dir / "checkpoints").glob(".tmp-*"))
        killed_mid_save += bool(leftovers)
        newest = ckpt.list_checkpoints(run_dir)[-1]
        ckpt.verify(newest)  # every renamed checkpoint is complete
        state = ckpt.load_latest(run_dir)
        assert state is not None and state.step == ckpt.step_of(newest)
        assert float(state.model["w0"][0, 0]) == state.step  # the weights of that very step
    assert trials == 8
    assert killed_mid_save >= 1, "no kill landed inside a save; the test did not exercise the atomic rename"
