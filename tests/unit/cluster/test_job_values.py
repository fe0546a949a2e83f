"""Values that reach a job script: refused where a script cannot carry them, inert where quoted.

Every string flag of plan, submit and probe (SLURM and Grid Engine profiles) is given a
newline, ``$()``, backticks, quotes and ``;``: a name the scheduler reads as one token is
refused (exit 2, one ``error:`` line naming the flag, nothing written); free text (the run
directory, the command) is rendered, passes ``bash -n``, keeps its header whole and, run
against stand-in schedulers, never runs the payload. Job ids read back from jobs.json are
checked before status, logs or cancel act on them.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from diffscale.cli import main
from diffscale.cluster.jobs import records as jobs
from diffscale.cluster.jobs import scheduler

CLUSTERS = ("purdue-gilbreth", "bu-scc")  # SLURM, Grid Engine
VERBS = ("plan", "submit", "probe")


def payloads(tmp: Path) -> list[str]:
    touch = f"touch {tmp}/pwned"
    return [f"x\n{touch}", f"x\r{touch}", "x\0y", f"$({touch})", f"`{touch}`", "a'b\"c", f"a;{touch}", "a b"]


def _argv(verb: str, cluster: str, out: Path, *flags: str) -> list[str]:
    return [verb, "--cluster", cluster, "--out", str(out), *flags, "--", "echo", "hi"]


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    return err


TOKEN_FLAGS = {"plan": ("--account", "--qos", "--partition"), "submit": ("--account", "--qos", "--partition"),
               "probe": ("--account", "--partition")}
"""The scheduler-token flags of each verb (probe has no --qos)."""


@pytest.mark.parametrize("cluster", CLUSTERS)
@pytest.mark.parametrize("verb,flag", [(v, f) for v in VERBS for f in TOKEN_FLAGS[v]])
def test_a_scheduler_token_with_shell_characters_is_refused(verb, cluster, flag, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(scheduler, "run", _never)
    out = tmp_path / "run"
    for value in payloads(tmp_path):
        err = _refused(_argv(verb, cluster, out, flag, value), capsys)
        what = "holds a line break" if any(c in value for c in "\n\r\0") else \
            "has characters a scheduler option cannot carry -- use letters, digits and _ . + : = / @ , - only"
        assert err.startswith(f"error: {flag} {value!r} {what}"), err
        assert not out.exists() and not (tmp_path / "pwned").exists()


def test_the_line_break_message_names_the_flag_and_the_fix(tmp_path, capsys):
    err = _refused(_argv("probe", "purdue-gilbreth", tmp_path / "run", "--account", "x\ntouch FILE"), capsys)
    assert err == ("error: --account 'x\\ntouch FILE' holds a line break -- a job-script value is one line; "
                   "pass the account name alone\n")


@pytest.mark.parametrize("cluster", CLUSTERS)
@pytest.mark.parametrize("verb", VERBS)
def test_a_python_path_with_a_line_break_is_refused(verb, cluster, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(scheduler, "run", _never)
    err = _refused(_argv(verb, cluster, tmp_path / "run", "--python", f"python\ntouch {tmp_path}/pwned"), capsys)
    assert err.startswith("error: --python 'python\\ntouch ") and "holds a line break" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("cluster", CLUSTERS)
@pytest.mark.parametrize("verb", ["plan", "submit"])
def test_a_setup_line_with_a_line_break_is_refused(verb, cluster, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(scheduler, "run", _never)
    err = _refused(_argv(verb, cluster, tmp_path / "run", "--setup", f"module load a\rtouch {tmp_path}/pwned"),
                   capsys)
    assert err.startswith("error: --setup 'module load a\\rtouch ")
    assert err.endswith("holds a line break -- a job-script value is one line; pass each line as its own --setup\n")


def _never(*args, **kwargs):
    raise AssertionError(f"a scheduler command ran: {args}")


STUBS = {
    "srun": "#!/bin/bash\nwhile [ \"${1#--}\" != \"$1\" ]; do shift; done\nexec \"$@\"\n",
    "scontrol": "#!/bin/bash\n[ \"$1 $2\" = \"show hostnames\" ] && echo n1\nexit 0\n",
    "python": "#!/bin/bash\nprintf '%s\\0' \"$@\" >>\"$FAKE_ARGV\"\nexit 0\n",
}


def _header_intact(script: str, mark: str) -> None:
    lines = script.splitlines()
    first_command = next(i for i, line in enumerate(lines) if line and not line.startswith("#"))
    directives = [i for i, line in enumerate(lines) if line.startswith(mark)]
    assert directives and max(directives) < first_command
    for needed in (("--output=", "--requeue") if mark == "#SBATCH" else ("-o logs/", "-r y")):
        assert any(needed in lines[i] for i in directives), needed


@pytest.mark.parametrize("cluster", CLUSTERS)
def test_free_text_is_quoted_and_never_runs_its_payload(cluster, tmp_path, capsys):
    pwned = tmp_path / "pwned"
    touch = f"touch {pwned}"
    out = tmp_path / "it's \"q\" $(touch pwned) `touch pwned`;touch pwned x"  # a name has no slash
    command = ["echo", f"$({touch})", f"`{touch}`", f"a;{touch}", "it's \"q\"", f"x\n{touch}"]
    assert main(["probe", "--cluster", cluster, "--out", str(out), "--python", "python", "--", *command]) == 0
    script = capsys.readouterr().out
    _header_intact(script, "#SBATCH" if cluster == "purdue-gilbreth" else "#$")
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in STUBS.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    out.mkdir()
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", FAKE_ARGV=str(tmp_path / "argv"),
               SLURM_JOB_ID="12", SLURM_JOB_NODELIST="n1", JOB_ID="12", TMPDIR=str(tmp_path))
    ran = subprocess.run(["bash", "-s"], input=script, text=True, env=env, cwd=tmp_path, capture_output=True)
    assert ran.returncode == 0, ran.stderr
    assert not pwned.exists() and not list(tmp_path.rglob("pwned"))
    argv = (tmp_path / "argv").read_text().split("\0")
    assert argv[argv.index("--") + 1:-1] == command  # the command arrives word for word


def _jobs_file(run_dir: Path, scheduler_name: str, job_id: str) -> None:
    record = jobs.JobRecord(job_id=job_id, name="ds-run", shape="1x1", partition="gpu", script="job.sh",
                            log="logs/job.out")
    jobs.append(run_dir, jobs.Submission(scheduler=scheduler_name, cluster="c", submitted_at="now",
                                         run_dir=str(run_dir), what="x", jobs=(record,)))


@pytest.mark.parametrize("scheduler_name", ["slurm", "sge"])
@pytest.mark.parametrize("verb", ["status", "logs", "cancel"])
def test_a_job_id_that_is_an_option_never_reaches_the_scheduler(verb, scheduler_name, tmp_path, capsys,
                                                                monkeypatch):
    monkeypatch.setattr(scheduler, "run", _never)
    _jobs_file(tmp_path, scheduler_name, "--user=root")
    err = _refused([verb, str(tmp_path)], capsys)
    form = "digits, optionally _N (array task) or +N (het component)" if scheduler_name == "slurm" else \
        "digits, optionally .N (array task)"
    assert err == (f"error: {tmp_path / 'jobs.json'} holds job id '--user=root', which is not a {scheduler_name} "
                   f"job id ({form}) -- the file was edited or damaged: fix the id, or submit the run again\n")


@pytest.mark.parametrize(("scheduler_name", "good", "bad"), [
    ("slurm", ["123", "123_4", "123+1"], ["12a", "123.4", "-1", "", "1 2", "1\n2"]),
    ("sge", ["123", "123.4"], ["123_4", "123+1", "--user=root", "1;2"]),
])
def test_job_ids_in_the_schedulers_format(scheduler_name, good, bad):
    assert all(jobs.is_job_id(scheduler_name, i) for i in good)
    assert not any(jobs.is_job_id(scheduler_name, i) for i in bad)


def test_an_edited_after_id_is_refused_too(tmp_path, capsys):
    _jobs_file(tmp_path, "slurm", "123")
    data = json.loads((tmp_path / "jobs.json").read_text())
    data["submissions"][0]["jobs"][0]["after"] = "--me"
    (tmp_path / "jobs.json").write_text(json.dumps(data))
    assert "holds job id '--me'" in _refused(["status", str(tmp_path)], capsys)


def test_a_real_id_reaches_scancel(tmp_path, capsys, monkeypatch):
    calls: list[list[str]] = []

    def fake(argv, **kwargs):
        calls.append(list(argv))
        line = f"JobId=123 JobName=ds-run UserId={jobs.current_user()}(1) JobState=RUNNING"
        return subprocess.CompletedProcess(argv, 0, line + "\n" if argv[0] == "scontrol" else "", "")

    monkeypatch.setattr(scheduler, "run", fake)
    _jobs_file(tmp_path, "slurm", "123")
    assert main(["cancel", str(tmp_path)]) == 0, capsys.readouterr().err
    assert ["scancel", "123"] in calls
