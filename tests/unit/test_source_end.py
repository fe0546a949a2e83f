"""How a spool's follower learns that its simulation ended when no end marker says so: the
scheduler's word on the simulation's job (its records parsed here as SLURM 22.05 and SoGE 8.1.9
print them; tests/integration/test_coupled_ends.py asks the real schedulers), a heartbeat that
stops, and an ended run that a later job resumes without training again."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from diffscale.cli import main
from diffscale.data.locations import SPOOL_JOB_NAME
from diffscale.runtime import checkpoint as ckpt
from diffscale.runtime.job_end import (
    EndKind,
    JobEnd,
    JobRef,
    NoAnswer,
    current_job,
    job_end,
    parse_qacct,
    parse_scontrol_line,
    read_job_file,
    sge_end,
    slurm_end,
    write_job_file,
)
from diffscale.tasks.fields.data import FieldGenerator
from diffscale.tasks.fields.source import VANISHED_GRACE_S, EndHow, SourceEnd, SourceWatch
from diffscale.tasks.fields.spool import HEARTBEAT_NAME, SpoolWriter, write_end

SMALL = ["--preset", "field-icon", "--device", "cpu"]
for _item in ("model.hidden=32", "model.depth=1", "model.embed_dim=16", "train.log_every=10",
              "train.checkpoint_every=20", "train.sample_count=4", "train.sample_steps=3", "optim.warmup_steps=2"):
    SMALL += ["--set", _item]


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_JOB_ID", "JOB_ID"):
        env.pop(key, None)
    return env


def _write(writer: SpoolWriter, steps: range) -> None:
    generator = FieldGenerator()
    for step in steps:
        cond, x = generator.sample(80, seed=step)
        writer.write(cond.numpy(), x.numpy(), sim_time=600.0 * step)

SCONTROL = "JobId=12 JobName=ds-run-sim JobState={state} Reason=None ExitCode={code} EndTime=2026-11-29T06:04:27"


@pytest.mark.parametrize("state, code, kind, status", [
    ("COMPLETED", "0:0", EndKind.COMPLETED, 0), ("FAILED", "3:0", EndKind.FAILED, 3),
    ("FAILED", "0:9", EndKind.FAILED, 137), ("CANCELLED", "0:15", EndKind.CANCELLED, 0),
    ("TIMEOUT", "0:15", EndKind.TIME_LIMIT, 0), ("NODE_FAIL", "0:0", EndKind.FAILED, 0),
    ("OUT_OF_MEMORY", "0:125", EndKind.FAILED, 0), ("PREEMPTED", "0:15", EndKind.CANCELLED, 0),
])
def test_slurm_final_states_as_ends(state, code, kind, status):
    ended = slurm_end(parse_scontrol_line(SCONTROL.format(state=state, code=code)))
    assert ended is not None and (ended.kind, ended.state, ended.exit_status) == (kind, state, status)
    assert ended.at is not None


@pytest.mark.parametrize("state", ["PENDING", "RUNNING", "COMPLETING", "REQUEUED", "SUSPENDED", "SOMETHING_NEW"])
def test_slurm_jobs_that_hold_nodes_have_not_ended(state):
    assert slurm_end(parse_scontrol_line(SCONTROL.format(state=state, code="0:0"))) is None


QACCT = """==============================================================
jobnumber    3
end_time     Sun Nov 29 06:03:51 2026
failed       {failed}
exit_status  {status}
{extra}"""


@pytest.mark.parametrize("failed, status, extra, kind", [
    ("0", "0", "", EndKind.COMPLETED), ("0", "3", "", EndKind.FAILED),
    ("37  : qmaster enforced h_rt, h_cpu, or h_vmem limit", "137                  (Killed)", "", EndKind.TIME_LIMIT),
    ("100 : assumedly after job", "137                  (Killed)", "", EndKind.CANCELLED),  # qdel on SoGE 8.1.9
    ("100 : assumedly after job", "137", "deleted_by   alice", EndKind.CANCELLED),
    ("100 : assumedly after job", "1", "", EndKind.FAILED),
])
def test_grid_engine_records_as_ends(failed, status, extra, kind):
    ended = sge_end(parse_qacct(QACCT.format(failed=failed, status=status, extra=extra)))
    assert ended.kind is kind and ended.at is not None


def _answers(*procs: tuple[int, str, str]):
    """A scheduler whose commands answer ``procs`` (return code, stdout, stderr) in turn."""
    queue = list(procs)

    def run(argv):
        code, out, err = queue.pop(0)
        return subprocess.CompletedProcess(argv, code, out, err)

    return run


def test_what_the_schedulers_answer_about_a_job_that_is_gone_or_cannot_be_asked():
    slurm, sge = JobRef("slurm", "12"), JobRef("sge", "3")
    gone = job_end(slurm, _answers((1, "", "slurm_load_jobs error: Invalid job id specified")))
    assert gone is not None and gone.kind is EndKind.VANISHED
    with pytest.raises(NoAnswer, match="Socket timed out"):
        job_end(slurm, _answers((1, "", "slurm_load_jobs error: Socket timed out on send/recv operation")))
    assert job_end(sge, _answers((0, "job_number: 3", ""))) is None  # qmaster still has it
    qdel = job_end(sge, _answers((1, "", "Following jobs do not exist: \n3"),
                                 (0, QACCT.format(failed="100 : assumedly after job", status="137", extra=""), "")))
    assert qdel is not None and qdel.kind is EndKind.CANCELLED
    no_record = job_end(sge, _answers((1, "", "Following jobs do not exist: \n3"),
                                      (1, "", "error: job id 3 not found")))
    assert no_record is not None and no_record.kind is EndKind.VANISHED
    with pytest.raises(NoAnswer, match="unable to contact qmaster"):
        job_end(sge, _answers((1, "", "error: unable to contact qmaster using port 6444 on host \"vm\"")))


def test_the_job_a_process_runs_in_and_the_file_that_names_it(tmp_path):
    assert current_job({"SLURM_JOB_ID": "12"}) == JobRef("slurm", "12")
    assert current_job({"JOB_ID": "3", "SGE_ROOT": "/var/lib/gridengine", "QUEUE": "all.q"}) == JobRef("sge", "3")
    assert current_job({"JOB_ID": "3"}) is None  # another tool's JOB_ID
    write_job_file(tmp_path / SPOOL_JOB_NAME, JobRef("sge", "3"))
    assert read_job_file(tmp_path / SPOOL_JOB_NAME) == JobRef("sge", "3")
    (tmp_path / SPOOL_JOB_NAME).write_text('{"scheduler": "pbs", "job_id": "3"}')
    assert read_job_file(tmp_path / SPOOL_JOB_NAME) is None


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_scheduler_s_word_ends_the_simulation_and_the_marker_outranks_it(tmp_path):
    write_job_file(tmp_path / SPOOL_JOB_NAME, JobRef("slurm", "12"))
    said: list[JobEnd | None] = [None]
    watch = SourceWatch(tmp_path, ask=lambda job: said[0], watch_s=3600)
    assert watch.check() is None  # running
    said[0] = JobEnd(EndKind.CANCELLED, "CANCELLED", 0, 1.5e9)
    watch._ask()  # what the watching thread does every WATCH_S
    ended = watch.check()
    assert ended == SourceEnd(EndHow.CANCELLED, 0, 1.5e9, "SLURM job 12: CANCELLED") and ended.ok
    assert ended.words() == "cancelled"
    said[0] = JobEnd(EndKind.FAILED, "NODE_FAIL", 0, None)
    watch._ask()
    failed = watch.check()
    assert failed is not None and not failed.ok and failed.words() == "its job failed"
    write_end(tmp_path, 0)
    assert watch.check() == SourceEnd(EndHow.EXITED, 0, (tmp_path / "ended.json").stat().st_mtime)
    watch.close()


def test_a_job_gone_without_a_record_counts_once_it_stayed_gone(tmp_path):
    write_job_file(tmp_path / SPOOL_JOB_NAME, JobRef("sge", "3"))
    clock = Clock()
    watch = SourceWatch(tmp_path, ask=lambda job: JobEnd(EndKind.VANISHED, "no record", None, None), clock=clock,
                        watch_s=3600)
    assert watch.check() is None
    clock.now += VANISHED_GRACE_S
    watch._ask()
    ended = watch.check()
    assert ended is not None and ended.how is EndHow.VANISHED and ended.ok
    watch.close()


def test_a_heartbeat_that_stops_ends_the_simulation_and_a_scheduler_that_cannot_be_asked_is_said(tmp_path):
    SpoolWriter(tmp_path, heartbeat_s=None)
    beat = {"time": 1.5e9, "every_s": 10, "stale_after_s": 120}
    (tmp_path / HEARTBEAT_NAME).write_text(json.dumps(beat))
    clock = Clock()
    watch = SourceWatch(tmp_path, clock=clock)
    assert watch.check() is None
    clock.now += 119
    assert watch.check() is None
    (tmp_path / HEARTBEAT_NAME).write_text(json.dumps({**beat, "time": 1.5e9 + 10}))  # it beats again
    clock.now += 100
    assert watch.check() is None
    clock.now += 120
    ended = watch.check()
    assert ended is not None and ended.how is EndHow.SILENT and ended.ok and ended.at == 1.5e9 + 10
    assert ended.words() == "its heartbeat stopped"

    def no_scheduler(job: JobRef) -> JobEnd | None:
        raise NoAnswer("`scontrol` is not on PATH here")

    write_job_file(tmp_path / SPOOL_JOB_NAME, JobRef("slurm", "12"))
    asked = SourceWatch(tmp_path, ask=no_scheduler, clock=clock, watch_s=3600)
    assert asked.check() is None  # the heartbeat, seen for the first time
    assert asked.news() == ["warning: cannot ask the scheduler about the simulation's SLURM job 12 (`scontrol` is not "
                           "on PATH here): its end marker and heartbeat tell when it ends"]
    assert asked.news() == []  # said once
    clock.now += 121
    assert asked.check() is not None  # the heartbeat still tells
    asked.close()


def test_a_writer_inside_a_job_names_it_and_one_outside_beats(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    SpoolWriter(tmp_path / "in-job")
    assert read_job_file(tmp_path / "in-job" / SPOOL_JOB_NAME) == JobRef("slurm", "77")
    assert not (tmp_path / "in-job" / HEARTBEAT_NAME).exists()
    monkeypatch.delenv("SLURM_JOB_ID")
    SpoolWriter(tmp_path / "outside", heartbeat_s=30).end(0)
    beat = json.loads((tmp_path / "outside" / HEARTBEAT_NAME).read_text())
    assert beat["every_s"] == 30 and beat["stale_after_s"] == 360
    assert not (tmp_path / "outside" / SPOOL_JOB_NAME).exists()


# A simulation outside a scheduler that ends without marking the end (killed, or never calling end()).
SILENT_WRITER = """
import sys
from diffscale.tasks.fields.data import FieldGenerator
from diffscale.tasks.fields.spool import SpoolWriter
writer, generator = SpoolWriter(sys.argv[1], heartbeat_s=0.25), FieldGenerator()
for step in range(6):
    cond, x = generator.sample(80, seed=step)
    writer.write(cond.numpy(), x.numpy(), sim_time=600.0 * step)
"""


def _source_ended(run: Path) -> list[dict]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if r.get("kind") == "source_ended"]


def test_a_follower_ends_once_its_writer_s_heartbeat_stopped(tmp_path, capsys):
    spool, run = tmp_path / "spool", tmp_path / "run"
    writer = subprocess.run([sys.executable, "-c", SILENT_WRITER, str(spool)], env=_env(), capture_output=True,
                            text=True, timeout=300)
    assert writer.returncode == 0, writer.stderr
    assert not (spool / "ended.json").exists()
    assert main(["train", "--data", f"spool:{spool}:480", "--out", str(run), *SMALL,
                 "--set", "train.steps=1000000"]) == 0
    out = " ".join(capsys.readouterr().err.split())
    ended = _source_ended(run)
    assert len(ended) == 1 and ended[0]["ended"] == "silent" and ended[0]["ok"] and ended[0]["files"] == 6
    assert f"the simulation writing {spool} ended (its heartbeat stopped; none for" in out
    final = ckpt.load_checkpoint(ckpt.list_checkpoints(run)[-1])
    assert final.step == ended[0]["step"] + 480 // 16 and f"done: {final.step} steps" in out
    assert main(["status", str(run)]) == 0
    status = capsys.readouterr().out
    assert "done: the simulation ended (its heartbeat stopped at 20" in status and "eta" not in status


def test_a_run_resumed_after_its_simulation_ended_trains_no_more(tmp_path, capsys):
    spool, run = tmp_path / "spool", tmp_path / "run"
    writer = SpoolWriter(spool, heartbeat_s=None)
    _write(writer, range(6))
    writer.end(0)
    args = ["train", "--data", f"spool:{spool}:480", "--out", str(run), *SMALL, "--set", "train.steps=1000000"]
    assert main(args) == 0
    final = ckpt.load_checkpoint(ckpt.list_checkpoints(run)[-1])
    assert final.task["buffer_source_end"].tolist() == [int(EndHow.EXITED), 0, final.step]
    capsys.readouterr()
    assert main([*args, "--resume", "auto"]) == 0  # a requeued or chained job of the run
    out = " ".join(capsys.readouterr().err.split())
    assert (f"the simulation writing {spool} had already ended (exit status 0) and its final buffer was trained on: "
            f"nothing is left to train: checkpointed at step {final.step}") in out
    assert ckpt.load_checkpoint(ckpt.list_checkpoints(run)[-1]).step == final.step
    assert len(_source_ended(run)) == 1
    assert main(["status", str(run)]) == 0
    assert "done: the simulation ended (exit status 0 at 20" in capsys.readouterr().out
