"""A process killed with SIGKILL while saving leaves the previous checkpoint loadable."""

import os
import random
import signal
import subprocess
import sys
import textwrap
import time

from diffscale.runtime import checkpoint as ckpt

# One process imports torch once and forks a writer for each line on its stdin: every trial kills
# a fresh writer process without paying a Python and torch start-up of its own. A writer prints
# its pid, then each step it saved; the forking process prints how each writer ended.
WRITER = textwrap.dedent("""
    import os, sys, traceback, torch
    from diffscale.runtime.checkpoint import CheckpointMeta, TrainingState, save_checkpoint
    run_dir = sys.argv[1]

    def write_forever():
        print("writer", os.getpid(), flush=True)
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

    for _ in sys.stdin:
        pid = os.fork()
        if pid == 0:  # the writer: it never returns to this loop
            try:
                write_forever()
            except BaseException:
                traceback.print_exc()
            os._exit(1)
        print("ended", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
""")


def _check_newest(run_dir) -> None:
    newest = ckpt.list_checkpoints(run_dir)[-1]
    ckpt.verify(newest)  # every renamed checkpoint is complete
    state = ckpt.load_latest(run_dir)
    assert state is not None and state.step == ckpt.step_of(newest)
    assert float(state.model["w0"][0, 0]) == state.step  # the weights of that very step


def _saving(run_dir) -> bool:
    folder = run_dir / "checkpoints"
    return folder.is_dir() and any(name.startswith(".tmp-") for name in os.listdir(folder))


def _kill_mid_save(pid: int, run_dir, deadline_s: float = 120) -> bool:
    """Stop the writer the moment a temporary checkpoint folder shows, and kill it while the folder
    is still there (a stopped process cannot finish the save meanwhile): a kill inside a save by
    construction, not by chance. False when no save was caught stopped before the deadline."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if _saving(run_dir):
            os.kill(pid, signal.SIGSTOP)
            if _saving(run_dir):
                os.kill(pid, signal.SIGKILL)
                return True
            os.kill(pid, signal.SIGCONT)  # it renamed the folder between the two looks: next save
    os.kill(pid, signal.SIGKILL)
    return False


def test_sigkill_at_random_moments_and_inside_a_save_never_leaves_a_broken_newest_checkpoint(tmp_path):
    rng = random.Random(1234)
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    run_dir = tmp_path / "run"
    forks = subprocess.Popen([sys.executable, str(script), str(run_dir)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)

    def start() -> int:
        forks.stdin.write("next\n")
        forks.stdin.flush()
        pid = int(forks.stdout.readline().split()[1])
        first = forks.stdout.readline()  # at least one complete checkpoint exists
        assert first.strip().isdigit(), first
        return pid

    def ended() -> None:
        line = next(line for line in forks.stdout if line.startswith("ended"))
        assert line.split() == ["ended", str(-signal.SIGKILL)]

    for _ in range(8):  # at random moments: mostly between saves
        pid = start()
        time.sleep(rng.uniform(0.0, 0.6))
        os.kill(pid, signal.SIGKILL)
        ended()
        _check_newest(run_dir)
    pid = start()  # and once inside a save, aimed
    assert _kill_mid_save(pid, run_dir), "no save was caught in progress"
    ended()
    assert list((run_dir / "checkpoints").glob(".tmp-*")), "the kill left no half-written folder behind"
    _check_newest(run_dir)
    forks.stdin.close()
    assert forks.wait(timeout=60) == 0
    forks.stdout.close()
