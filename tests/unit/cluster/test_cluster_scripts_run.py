"""Run the rendered job scripts under bash with stand-ins for srun/scontrol/python.

The stand-ins record what the script asked of them; the assertions are about the
script's own wiring: rendezvous variables, signal forwarding to every rank, the exit-85
requeue with its max-restarts guard, segment chains, and the hostile run directory.
Real schedulers run the same scripts in tests/integration.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from diffscale.cluster.planning.plan import PlanOptions, make_plan
from diffscale.cluster.planning.shape import Shape
from diffscale.cluster.planning.workload import DiffscaleRun, UserCommand
from diffscale.cluster.scripts.shellparts import end_marker, outside_stop, wait_for
from diffscale.config import presets
from diffscale.runtime.distributed import port_from_job_id
from diffscale.runtime.signals import EXIT_REQUEUE

from cluster_fixtures import fixture_profile

# The fake trainer: records its argv and environment, then exits with $FAKE_RC, or --
# with FAKE_WAIT_SIGNAL set -- waits for SIGUSR2 and exits 85 like diffscale does.
FAKE_PYTHON = r"""#!/bin/bash
printf '%s\0' "$@" >"$FAKE_LOG.argv"
echo "ENV RANK=${SLURM_PROCID:-} MASTER_ADDR=${MASTER_ADDR:-} MASTER_PORT=${MASTER_PORT:-}" >>"$FAKE_LOG"
if [ -n "${FAKE_WAIT_SIGNAL:-}" ]; then
    trap 'echo "rank got USR2" >>"$FAKE_LOG"; exit 85' USR2
    echo ready >"$FAKE_READY"
    for _ in $(seq 1 300); do sleep 0.1; done
    exit 3
fi
exit "${FAKE_RC:-0}"
"""

# srun stand-in: records its options and execs the command once (one task), so signals
# sent to the srun pid reach the "rank".
FAKE_SRUN = r"""#!/bin/bash
echo "srun $*" >>"$FAKE_LOG"
while [ "${1#--}" != "$1" ]; do shift; done
export SLURM_PROCID=0
exec "$@"
"""

FAKE_SCONTROL = r"""#!/bin/bash
echo "scontrol $*" >>"$FAKE_LOG"
if [ "$1 $2" = "show hostnames" ]; then printf 'n7\nn8\n'; fi
exit 0
"""


@pytest.fixture
def stubs(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("python", FAKE_PYTHON), ("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        path = bin_dir / name
        path.write_text(text)
        path.chmod(0o755)
    log = tmp_path / "calls.log"
    return {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "FAKE_LOG": str(log),
        "FAKE_READY": str(tmp_path / "ready"),
        "SLURM_JOB_ID": "123457",
        "SLURM_JOB_NODELIST": "n[7-8]",
        "python": str(bin_dir / "python"),
    }


def _script(run_dir: Path, python: str, *, steps: int = 100, shape=Shape(2, 1), chain=True) -> Path:
    cfg = presets.get_preset("tiny")
    cfg.train.steps = steps
    workload = DiffscaleRun(config=cfg, run_dir=str(run_dir), python=python)
    plan = make_plan(fixture_profile("slurm-test"), shape, workload, PlanOptions(max_restarts=3, chain=chain))
    path = run_dir / "job.sh"
    path.write_text(plan.script())
    return path


def _run(script: Path, env: dict[str, str], **extra: str) -> subprocess.CompletedProcess:
    full = {**os.environ, **{k: v for k, v in env.items() if k != "python"}, **extra}
    return subprocess.run(["bash", str(script)], env=full, capture_output=True, text=True, timeout=60)


def test_srun_starts_every_rank_with_rendezvous_in_a_hostile_dir(hostile_dir, stubs):
    result = _run(_script(hostile_dir, stubs["python"]), stubs)
    assert result.returncode == 0, result.stderr
    log = Path(stubs["FAKE_LOG"]).read_text().splitlines()
    assert any(ln.startswith("srun --kill-on-bad-exit=1 --nodes=2 --ntasks-per-node=1 --cpus-per-task=") for ln in log)
    # the hostile path reached the trainer as single, intact argv words
    argv = Path(stubs["FAKE_LOG"] + ".argv").read_text().split("\0")[:-1]
    assert argv == ["-m", "diffscale", "train", str(hostile_dir / "config.yaml"), "--out", str(hostile_dir),
                    "--resume", "auto"]
    # the port formula in the script is the runtime's
    assert f"ENV RANK=0 MASTER_ADDR=n7 MASTER_PORT={port_from_job_id('123457')}" in log
    assert not (hostile_dir.parent / "pwned").exists() and not Path("pwned").exists()


def test_a_user_python_command_writes_through_to_the_job_log(tmp_path, stubs):
    """A job log is a file: the user's Python must not block-buffer its prints (issue: logs
    stayed empty until the command exited). The real interpreter reports whether it will."""
    probe = "import sys; print('write_through', sys.stdout.write_through)"
    command = UserCommand((sys.executable, "-c", probe), str(tmp_path), sys.executable)
    plan = make_plan(fixture_profile("slurm-test"), Shape(1, 1), command)
    assert any("PYTHONUNBUFFERED=1" in note for note in plan.notes)
    script = tmp_path / "job.sh"
    script.write_text(plan.script())
    env = {k: v for k, v in stubs.items() if k != "python"}
    result = subprocess.run(["bash", str(script)], env={**{k: v for k, v in os.environ.items()
                                                            if k != "PYTHONUNBUFFERED"}, **env},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "write_through True" in result.stdout
    # and without the script's export, the same command would have buffered
    bare = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"})
    assert "write_through False" in bare.stdout


def test_exit_85_requeues_the_job_and_skips_the_requeue_delay(tmp_path, stubs):
    result = _run(_script(tmp_path, stubs["python"]), stubs, FAKE_RC=str(EXIT_REQUEUE), SLURM_RESTART_COUNT="1")
    assert result.returncode == 0, result.stdout + result.stderr
    log = Path(stubs["FAKE_LOG"]).read_text()
    assert "scontrol requeue 123457" in log
    assert "scontrol update JobId=123457 StartTime=now" in log
    assert "restart 2 of 3" in result.stdout


def test_max_restarts_stops_the_requeue_loop(tmp_path, stubs):
    result = _run(_script(tmp_path, stubs["python"]), stubs, FAKE_RC=str(EXIT_REQUEUE), SLURM_RESTART_COUNT="3")
    assert result.returncode == EXIT_REQUEUE
    assert "scontrol requeue" not in Path(stubs["FAKE_LOG"]).read_text()
    assert "already restarted 3 times (max 3)" in result.stderr


def test_other_failures_pass_through_without_requeue(tmp_path, stubs):
    result = _run(_script(tmp_path, stubs["python"]), stubs, FAKE_RC="7")
    assert result.returncode == 7
    assert "scontrol requeue" not in Path(stubs["FAKE_LOG"]).read_text()


def test_segment_of_a_chain_ends_cleanly_on_85(tmp_path, stubs):
    # 200,000 tiny steps in one-hour jobs cannot fit one job: a chain of segments
    cfg = presets.get_preset("tiny")
    cfg.train.steps = 200_000
    workload = DiffscaleRun(config=cfg, run_dir=str(tmp_path), python=stubs["python"])
    plan = make_plan(fixture_profile("slurm-test"), Shape(1, 1, time_s=3600), workload)
    assert len(plan.segments) > 1
    script = tmp_path / "job.sh"
    script.write_text(plan.script())
    result = _run(script, stubs, FAKE_RC=str(EXIT_REQUEUE))
    assert result.returncode == 0
    assert "scontrol requeue" not in Path(stubs["FAKE_LOG"]).read_text()
    assert "next segment continues" in result.stdout


def test_warning_signal_reaches_the_ranks_and_requeues(tmp_path, stubs):
    script = _script(tmp_path, stubs["python"])
    env = {**os.environ, **{k: v for k, v in stubs.items() if k != "python"}, "FAKE_WAIT_SIGNAL": "1"}
    proc = subprocess.Popen(["bash", str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ready = Path(stubs["FAKE_READY"])
    deadline = time.monotonic() + 30
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ready.exists(), "fake rank never started"
    proc.send_signal(signal.SIGUSR2)  # what --signal=B:USR2 does: only the batch shell gets it
    out, err = proc.communicate(timeout=30)
    log = Path(stubs["FAKE_LOG"]).read_text()
    assert "rank got USR2" in log, out + err
    assert "scontrol requeue 123457" in log
    assert proc.returncode == 0


@pytest.mark.parametrize("profile_name", ["slurm-test", "sge-two-host"])
@pytest.mark.parametrize("rc", [0, 3])
def test_a_coupled_simulation_marks_its_spool_ended_with_its_status(profile_name, rc, hostile_dir, stubs):
    """The simulation's script writes the spool's end marker once its command ended, with the
    command's exit status: what ends the trainer following the spool (data/follow.py)."""
    import json

    from diffscale.cluster.planning.couple import coupled_plans
    from diffscale.config import merge
    from diffscale.data.locations import SPOOL_END_NAME, SpoolSpec
    from diffscale.tasks.fields.spool import read_end

    spool = SpoolSpec(hostile_dir / "spool $x", 240)
    cfg = merge(presets.get_preset("field-icon"), {"data": {"source": spool.source}})
    profile = fixture_profile(profile_name)
    sim, _ = coupled_plans(profile, cfg, spool, (stubs["python"], "sim.py"), run_dir=str(hostile_dir),
                           python=stubs["python"], sim=Shape(1, 1, partition=profile.partitions[0].name,
                                                             use_gpus=False, time_s=600),
                           trainer=Shape(1, 1), options=PlanOptions())
    script = hostile_dir / "sim.sh"
    script.write_text(sim.script())
    spool.directory.mkdir()
    assert read_end(spool.directory) is None
    done = _run(script, stubs, FAKE_RC=str(rc), JOB_ID="77", SGE_TASK_ID="undefined", NSLOTS="1")
    assert done.returncode == rc, done.stderr
    assert json.loads((spool.directory / SPOOL_END_NAME).read_text()) == {"exit_status": rc}
    assert read_end(spool.directory) == rc
    assert [p.name for p in spool.directory.iterdir()] == [SPOOL_END_NAME]  # no temporary file left


@pytest.mark.parametrize(("command", "marked"), [("exit 3", 3), ("kill -TERM $$", None), ("exit 0", 0)])
def test_the_end_marker_says_how_the_command_ended_by_itself_and_nothing_after_a_sigterm(command, marked, tmp_path):
    """A command ended by SIGTERM was stopped from outside (the scheduler's to tell) even when the
    shell's own trap has not run: SLURM signals the step and the batch shell apart, and the step may
    end first. Here the batch shell gets no signal at all."""
    spool = tmp_path / "spool it's"
    spool.mkdir()
    script = "\n".join([*outside_stop(str(spool)), f"bash -c '{command}' &", "step_pid=$!",
                        *wait_for("step_pid", "rc"), *end_marker(str(spool)), 'exit "$rc"'])
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == (143 if marked is None else marked), done.stderr
    marker = spool / "ended.json"
    assert (marker.read_text() == f'{{"exit_status": {marked}}}\n') if marked is not None else not marker.exists()
