"""Smoke tests of the real SLURM and Grid Engine that tests/schedulers/*.sh start.

They prove the behaviours the cluster backends rely on, with real jobs submitted through
sbatch/qsub: multi-node srun, fake GPUs, signals before the time limit, requeue/reschedule,
parallel environments, qrsh -inherit and accounting.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from helpers import SLURM_HOSTLISTS


def _script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/bash\n" + body.lstrip("\n"))
    path.chmod(0o755)
    return path


def _wait_for(pred, timeout: float, what: str, poll: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(poll)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


# --------------------------------------------------------------------------- SLURM


@pytest.mark.slurm
@pytest.mark.timeout(300)
def test_slurm_two_nodes_srun(slurm_cluster, tmp_path):
    job = _script(tmp_path / "two.sh", """
srun hostname
srun env | grep SLURM_PROCID
srun bash -c 'echo "task procid=$SLURM_PROCID node=$SLURMD_NODENAME"'
""")
    out = tmp_path / "two.out"
    jid = slurm_cluster.sbatch("--nodes=2", "--ntasks-per-node=1", "-o", str(out), str(job),
                               cwd=tmp_path)
    info = slurm_cluster.wait(jid, timeout=120)
    text = _read(out)
    assert info["JobState"] == "COMPLETED", (info, text)
    assert info["ExitCode"] == "0:0"
    assert info["NodeList"] == "n[1-2]"
    assert sorted(re.findall(r"^SLURM_PROCID=(\d+)$", text, re.M)) == ["0", "1"], text
    assert "task procid=0 node=n1" in text and "task procid=1 node=n2" in text, text
    # jobcomp/filetxt records the finished job
    _wait_for(lambda: f"JobId={jid} " in _read(slurm_cluster.jobcomp_file), 10, "jobcomp record")
    line = next(ln for ln in _read(slurm_cluster.jobcomp_file).splitlines() if f"JobId={jid} " in ln)
    assert "JobState=COMPLETED" in line and "NodeList=n[1-2]" in line


@pytest.mark.slurm
@pytest.mark.timeout(300)
def test_slurm_fake_gpus(slurm_cluster, tmp_path):
    out1, out2 = tmp_path / "g1.out", tmp_path / "g2.out"
    j1 = slurm_cluster.sbatch(
        "-p", slurm_cluster.gpu_partition, "--gpus-per-node=1", "-o", str(out1),
        "--wrap", 'echo "batch CVD=$CUDA_VISIBLE_DEVICES"; srun bash -c \'echo "step CVD=$CUDA_VISIBLE_DEVICES"\'',
        cwd=tmp_path)
    j2 = slurm_cluster.sbatch(
        "-p", slurm_cluster.gpu_partition, "--nodes=2", f"--gpus-per-node={slurm_cluster.gpus_per_node}",
        "-o", str(out2),
        "--wrap", 'srun bash -c \'echo "step $SLURMD_NODENAME CVD=$CUDA_VISIBLE_DEVICES"\'',
        cwd=tmp_path)
    i1 = slurm_cluster.wait(j1, timeout=120)
    i2 = slurm_cluster.wait(j2, timeout=120)
    t1, t2 = _read(out1), _read(out2)
    assert i1["JobState"] == "COMPLETED" and i2["JobState"] == "COMPLETED", (i1, t1, i2, t2)
    assert re.search(r"^batch CVD=[01]$", t1, re.M), t1
    assert re.search(r"^step CVD=[01]$", t1, re.M), t1
    assert "step n1 CVD=0,1" in t2 and "step n2 CVD=0,1" in t2, t2


@pytest.mark.slurm
@pytest.mark.timeout(300)
def test_slurm_signal_before_time_limit(slurm_cluster, tmp_path):
    """--signal=B:USR2@50 in the 1-minute partition: the batch shell gets USR2 well
    before the limit (SLURM checks every few seconds; it came ~7-11 s in, measured)."""
    job = _script(tmp_path / "sig.sh", """
trap 'echo "got USR2 after $SECONDS s"; exit 0' USR2
echo "started restart=${SLURM_RESTART_COUNT:-0}"
for i in $(seq 1 120); do sleep 1; done
echo "no signal"
""")
    out = tmp_path / "sig.out"
    jid = slurm_cluster.sbatch("-p", slurm_cluster.short_partition, "--signal=B:USR2@50", "--requeue",
                               "-o", str(out), str(job), cwd=tmp_path)
    info = slurm_cluster.job(jid)
    assert info["TimeLimit"] == "00:01:00", info  # partition MaxTime became the job's limit
    info = slurm_cluster.wait(jid, timeout=180)
    text = _read(out)
    assert info["JobState"] == "COMPLETED", (info, text)
    assert "got USR2" in text, text


@pytest.mark.slurm
@pytest.mark.timeout(300)
def test_slurm_scontrol_requeue(slurm_cluster, tmp_path):
    """scontrol requeue of a running --requeue job: it runs again (after cred_expire=10 s)
    with SLURM_RESTART_COUNT=1; --open-mode=append keeps the first run's output."""
    job = _script(tmp_path / "rq.sh", """
echo "run restart=${SLURM_RESTART_COUNT:-0}"
sleep 120
""")
    out = tmp_path / "rq.out"
    jid = slurm_cluster.sbatch("--requeue", "--signal=B:USR2@30", "--open-mode=append",
                               "-o", str(out), str(job), cwd=tmp_path)
    try:
        slurm_cluster.wait(jid, timeout=120, states={"RUNNING"})
        _wait_for(lambda: "run restart=0" in _read(out), 15, "first run output")
        subprocess.run(["scontrol", "requeue", jid], check=True, capture_output=True, timeout=30)
        _wait_for(lambda: "run restart=1" in _read(out), 120, "second run after requeue")
        info = slurm_cluster.job(jid)
        assert info["Restarts"] == "1", info
        assert info["JobState"] == "RUNNING", info
    finally:
        subprocess.run(["scancel", jid], capture_output=True, timeout=30)
    info = slurm_cluster.wait(jid, timeout=30)
    assert info["JobState"] == "CANCELLED", info


# --------------------------------------------------------------------------- Grid Engine


@pytest.mark.sge
@pytest.mark.timeout(300)
def test_sge_pe_gpu_job_and_qacct(sge_cluster, tmp_path):
    job = _script(tmp_path / "pe.sh", """
echo "NSLOTS=$NSLOTS"
echo "JOB_ID=$JOB_ID"
echo "TMPDIR=$TMPDIR"
test -d "$TMPDIR" && echo "TMPDIR exists"
echo "--- PE_HOSTFILE"
cat "$PE_HOSTFILE"
echo "--- end"
""")
    out = tmp_path / "pe.out"
    jid = sge_cluster.qsub("-b", "y", "-pe", "smp", "2", "-l", "gpus=1", "-l", "h_rt=0:1:0",
                           "-notify", "-r", "y", "-j", "y", "-o", str(out), "-wd", str(tmp_path),
                           str(job))
    records = sge_cluster.wait(jid, timeout=120)
    text = _read(out)
    final = records[-1]
    assert final.exit_status == 0, (final, text)
    assert final.failed == 0, (final, text)
    assert final["granted_pe"] == "smp" and final["slots"] == "2", final
    assert "NSLOTS=2" in text, text
    assert f"JOB_ID={jid}" in text, text
    assert "TMPDIR exists" in text, text
    hostfile = text.split("--- PE_HOSTFILE\n", 1)[1].split("--- end", 1)[0].split()
    assert hostfile[:3] == [sge_cluster.host, "2", f"{sge_cluster.queue}@{sge_cluster.host}"], text


@pytest.mark.sge
@pytest.mark.timeout(300)
def test_sge_qrsh_inherit_in_pe_job(sge_cluster, tmp_path):
    job = _script(tmp_path / "inherit.sh", """
host=$(awk 'NR==1{print $1}' "$PE_HOSTFILE")
for i in 1 2; do
  qrsh -inherit "$host" /bin/bash -c "echo inherit-$i on \\$(hostname) job=\\$JOB_ID"
  echo "qrsh rc=$?"
done
""")
    out = tmp_path / "inherit.out"
    jid = sge_cluster.qsub("-pe", "mpi", "2", "-j", "y", "-o", str(out), "-wd", str(tmp_path), str(job))
    records = sge_cluster.wait(jid, timeout=120)
    text = _read(out)
    assert text.count("qrsh rc=0") == 2, text
    assert "inherit-1 on" in text and f"job={jid}" in text, text
    # one accounting record per qrsh -inherit task plus the master task's
    assert len(records) == 3, records
    assert all(r.exit_status == 0 for r in records), records


@pytest.mark.sge
@pytest.mark.timeout(300)
def test_sge_notify_before_h_rt_kill(sge_cluster, tmp_path):
    """h_rt=10 s with -notify: SIGUSR2 arrives (queue notify=5 s before the kill), then the
    job is killed: qacct failed=37 (h_rt enforced), exit_status 137."""
    job = _script(tmp_path / "notify.sh", """
trap 'echo "USR2 after $SECONDS s"' USR2
echo started
for i in $(seq 1 60); do sleep 1; done
echo "not killed"
""")
    out = tmp_path / "notify.out"
    jid = sge_cluster.qsub("-l", "h_rt=0:0:10", "-notify", "-j", "y", "-o", str(out),
                           "-wd", str(tmp_path), str(job))
    records = sge_cluster.wait(jid, timeout=120)
    text = _read(out)
    final = records[-1]
    assert "USR2 after" in text, text
    assert "not killed" not in text, text
    assert final.failed == 37, final
    assert final.exit_status == 137, final


@pytest.mark.sge
@pytest.mark.timeout(300)
def test_sge_reschedule_exit_99_and_qmod(sge_cluster, tmp_path):
    """-r y: exit code 99 reruns the job (RESTARTED=1); qmod -rj reruns a running job."""
    flag = tmp_path / "ran-once"
    job = _script(tmp_path / "r99.sh", f"""
echo "run RESTARTED=$RESTARTED"
if [ ! -e {flag} ]; then touch {flag}; exit 99; fi
""")
    out = tmp_path / "r99.out"
    j99 = sge_cluster.qsub("-r", "y", "-j", "y", "-o", str(out), "-wd", str(tmp_path), str(job))

    job2 = _script(tmp_path / "rj.sh", """
echo "run RESTARTED=$RESTARTED"
[ "$RESTARTED" = 1 ] && exit 0
sleep 60
""")
    out2 = tmp_path / "rj.out"
    jrj = sge_cluster.qsub("-r", "y", "-j", "y", "-o", str(out2), "-wd", str(tmp_path), str(job2))
    _wait_for(lambda: "run RESTARTED=0" in _read(out2), 120, "first run of the qmod -rj job")
    subprocess.run(["qmod", "-rj", jrj], check=True, capture_output=True, timeout=30)

    r99 = sge_cluster.wait(j99, timeout=120)
    rrj = sge_cluster.wait(jrj, timeout=120)
    t99, trj = _read(out), _read(out2)
    assert "run RESTARTED=0" in t99 and "run RESTARTED=1" in t99, t99
    assert [r.exit_status for r in r99] == [99, 0], r99
    assert "run RESTARTED=1" in trj, trj
    assert rrj[-1].exit_status == 0, rrj


@pytest.mark.parametrize("spec, hosts", SLURM_HOSTLISTS)
def test_the_hostlist_parser_agrees_with_scontrol(slurm_cluster, spec, hosts):
    """diffscale's hostlist parser (runtime/distributed.py, tests/unit/test_launch_env.py) gives
    what SLURM's own scontrol gives, on the SLURM this session started (never skipped for want of it)."""
    import os

    from diffscale.runtime.distributed import expand_hostlist

    out = subprocess.run(["scontrol", "show", "hostnames", spec], capture_output=True, text=True, check=True,
                         env={**os.environ, **slurm_cluster.env}, timeout=30)
    assert out.stdout.split() == hosts == expand_hostlist(spec)
