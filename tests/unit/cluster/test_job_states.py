"""What status and cancel read from the schedulers (captured outputs), which job ids they trust,
wall-time strings, and the time limit plan reports with its source."""

from __future__ import annotations

import pytest

from diffscale.cluster.jobs import records as jobs
from diffscale.cluster.jobs.records import JobRecord, JobState, Submission
from diffscale.cluster.jobs.scheduler import (
    SLURM_FINAL,
    parse_qstat_xml,
    sge_finished_state,
    sge_state_words,
    slurm_state,
)
from diffscale.cluster.planning.plan import make_plan
from diffscale.cluster.planning.shape import Shape
from diffscale.cluster.planning.workload import DiffscaleRun, UserCommand
from diffscale.cluster.profiles.loading import load_profile
from diffscale.cluster.scripts.timefmt import parse_duration, parse_time_limit
from diffscale.cluster.tables import time_limit
from diffscale.config import presets
from diffscale.errors import UserError
from diffscale.runtime.job_end import parse_qacct, parse_scontrol_line

SCONTROL = ("JobId=7 JobName=ds-run-abc123 UserId=alice(1000) GroupId=alice(1000) JobState={state} Reason=None "
            "Requeue=1 Restarts=0 BatchFlag=1 ExitCode=0:15 NodeList=n1 TimeLimit=01:00:00")


@pytest.mark.parametrize("state", ["PENDING", "RUNNING", "SIGNALING", "STOPPED", "SUSPENDED", "SPECIAL_EXIT",
                                   "STAGE_OUT", "RESIZING", "REVOKED", "REQUEUE_HOLD", "COMPLETING", "SOMETHING_NEW"])
def test_slurm_states_that_are_not_final_are_active_and_show_no_exit_code(state):
    job = slurm_state("7", parse_scontrol_line(SCONTROL.format(state=state)))
    assert job.active and job.state == state and "exit" not in job.detail
    assert (job.name, job.user) == ("ds-run-abc123", "alice")


@pytest.mark.parametrize("state", sorted(SLURM_FINAL))
def test_slurm_final_states_are_not_active_and_show_the_exit_code(state):
    job = slurm_state("7", parse_scontrol_line(SCONTROL.format(state=state)))
    assert not job.active and "exit 0:15" in job.detail


@pytest.mark.parametrize("code, words", [
    ("qw", "PENDING"), ("hqw", "PENDING (held)"), ("hRwq", "PENDING (held, restarted)"), ("r", "RUNNING"),
    ("Rr", "RUNNING (restarted)"), ("t", "STARTING"), ("Rt", "STARTING (restarted)"), ("s", "SUSPENDED"),
    ("S", "SUSPENDED (its queue is suspended)"), ("T", "SUSPENDED (its queue passed a load threshold)"),
    ("dr", "DELETING (was running)"), ("dt", "DELETING (being transferred to its host)"),
    ("Eqw", "ERROR (stuck in error state: see qstat -j ID, then qmod -cj ID or qdel ID)"),
    ("rX", "RUNNING (code letters X unknown to diffscale: see man qstat)"),
])
def test_grid_engine_state_codes_in_words(code, words):
    assert sge_state_words(code) == words


QSTAT_XML = """<?xml version='1.0'?>
<job_info xmlns:xsd="http://arc.liv.ac.uk/repos/darcs/sge/source/dist/util/resources/schemas/qstat/qstat.xsd">
  <queue_info>
    <job_list state="running"><JB_job_number>12</JB_job_number><JAT_prio>0.55</JAT_prio>
      <JB_name>ds-a-very-long-run-name-123456-1x2</JB_name><JB_owner>bob</JB_owner><state>Rr</state>
      <queue_name>all.q@host1</queue_name><slots>2</slots></job_list>
  </queue_info>
  <job_info>
    <job_list state="pending"><JB_job_number>13</JB_job_number><JB_name>other</JB_name><JB_owner>eve</JB_owner>
      <state>hqw</state><queue_name></queue_name><slots>1</slots></job_list>
  </job_info>
</job_info>"""


def test_qstat_xml_gives_full_names_owners_and_codes():
    live = parse_qstat_xml(QSTAT_XML)
    assert live["12"] == {"state": "Rr", "name": "ds-a-very-long-run-name-123456-1x2", "owner": "bob",
                          "queue": "all.q@host1"}
    assert live["13"]["state"] == "hqw" and live["13"]["queue"] == ""
    with pytest.raises(UserError, match="is not XML"):
        parse_qstat_xml("error: commlib error")


QACCT = """==============================================================
jobname      ds-run-abc123
jobnumber    5
owner        root
failed       0
deleted_by   {deleted}
exit_status  {status}
"""


@pytest.mark.parametrize("deleted, status, state", [("NONE", "0", "COMPLETED"), ("NONE", "1", "FAILED"),
                                                    ("root@host", "137", "CANCELLED")])
def test_a_grid_engine_job_deleted_with_qdel_is_cancelled_not_failed(deleted, status, state):
    job = sge_finished_state("5", parse_qacct(QACCT.format(deleted=deleted, status=status)))
    assert job.state == state and not job.active and (job.name, job.user) == ("ds-run-abc123", "root")


def _submission(user: str = "alice") -> Submission:
    records = tuple(JobRecord(job_id=i, name="ds-run-abc123" + ("-1x1" if i == "8" else ""), shape="1x1" if i == "8"
                              else "2x1", partition="cpu", script="s", log="l") for i in ("7", "8"))
    return Submission(scheduler="slurm", cluster="c", submitted_at="t", run_dir="/r", what="w", jobs=records,
                      race=("2x1", "1x1"), user=user)


def test_a_job_id_that_now_names_another_job_is_refused(tmp_path):
    sub = _submission()
    ours = [JobState("7", "RUNNING", active=True, name="ds-run-abc123", user="alice"),
            JobState("8", "GONE")]  # a job the scheduler forgot: nothing to compare, nothing to refuse
    jobs.check_ours(sub, ours, tmp_path)
    with pytest.raises(UserError, match=r"job 7 of .*jobs.json is named 'train-gpt', but diffscale submitted "
                                        r"'ds-run-abc123' as 'alice' under that id: the scheduler was reinstalled"):
        jobs.check_ours(sub, [JobState("7", "RUNNING", active=True, name="train-gpt", user="alice")], tmp_path)
    with pytest.raises(UserError, match="belongs to user 'bob'"):
        jobs.check_ours(sub, [JobState("7", "RUNNING", active=True, name="ds-run-abc123", user="bob")], tmp_path)
    # a jobs.json written before the user was recorded: only the name is checked
    jobs.check_ours(_submission(user=""), [JobState("7", "RUNNING", name="ds-run-abc123", user="bob")], tmp_path)


def test_jobs_diffscale_cancelled_show_as_cancelled(tmp_path):
    sub = _submission()
    states = [JobState("7", "FAILED", "exit 137"), JobState("8", "GONE", "not in qstat")]
    assert [s.state for s in jobs.with_cancellations(sub, states, tmp_path, None)] == ["FAILED", "GONE"]
    jobs.record_cancelled(tmp_path, ["7"])
    shown = jobs.with_cancellations(sub, states, tmp_path, race_owner="2x1")
    assert [s.state for s in shown] == ["CANCELLED", "CANCELLED"]
    assert shown[0].detail.startswith("by diffscale cancel") and "lost the race to shape 2x1" in shown[1].detail


def test_an_old_jobs_file_without_a_user_still_loads(tmp_path):
    (tmp_path / "jobs.json").write_text('{"submissions": [{"scheduler": "slurm", "cluster": "c", "submitted_at": "t",'
                                        ' "run_dir": "/r", "what": "w", "jobs": []}]}')
    assert jobs.latest(tmp_path).user == ""
    assert Submission(scheduler="slurm", cluster="c", submitted_at="t", run_dir="/r", what="w", jobs=()).user


@pytest.mark.parametrize("text, seconds", [("90", 5400), ("1:30", 90), ("01:00:00", 3600), ("100:00:00", 360000),
                                           ("2-00", 172800), ("1-12:30", 131400), ("1-00:00:01", 86401),
                                           ("48h", 172800), ("1.5h", 5400), (172800, 172800)])
def test_wall_times_in_every_scheduler_form(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text, says", [("00:00:00", "not a positive duration"), ("0", "not a positive duration"),
                                        ("99:99:99", "has 99 minutes"), ("1:99", "has 99 seconds"),
                                        ("1-24:00", "has 24 hours"), ("1-0:60", "has 60 minutes"),
                                        ("x-1", "is not a duration"), ("1:2:3:4", "is not a duration"),
                                        (0, "positive")])
def test_wall_times_out_of_range_are_refused(text, says):
    with pytest.raises(UserError, match=says):
        parse_duration(text, what="--time")


def test_unlimited_is_a_profile_fact_but_not_a_job_time():
    assert parse_duration("UNLIMITED") is None and parse_duration("INFINITE") is None
    with pytest.raises(UserError, match="asks for no time limit"):
        parse_time_limit("infinite")


def test_plan_says_which_time_limit_applies_and_where_it_comes_from():
    gilbreth, torch_ = load_profile("purdue-gilbreth"), load_profile("nyu-torch")
    run = DiffscaleRun(config=presets.get_preset("tiny"), run_dir="/r", python="python3")
    command = UserCommand(("python", "t.py"), "/r", "python3")
    assert time_limit(make_plan(gilbreth, Shape(1, 4, time_s=3600), run), asked=True) == "01:00:00 (--time)"
    assert "estimated training ~" in time_limit(make_plan(gilbreth, Shape(1, 4), run), asked=False)
    assert time_limit(make_plan(gilbreth, Shape(1, 4), command), asked=False).startswith(
        "48:00:00: the partition's maximum (diffscale cannot estimate a user command's time")
    no_max = next(p.name for p in torch_.partitions if p.max_time_s is None)
    assert time_limit(make_plan(torch_, Shape(1, 1, partition=no_max), command), asked=False).startswith(
        f"none passed to the scheduler: partition '{no_max}''s default applies")
