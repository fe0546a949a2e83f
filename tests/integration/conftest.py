"""Real schedulers for the integration tests: a two-node SLURM and a one-host Grid Engine.

Session fixtures:

* ``slurm_cluster`` -> :class:`SlurmCluster` -- runs ``tests/schedulers/slurm.sh start``
* ``sge_cluster``   -> :class:`SgeCluster`   -- runs ``tests/schedulers/sge.sh start``

Each starts its scheduler once per session (installing the Debian packages if missing;
``start`` is idempotent, so a running scheduler is simply joined), applies the scheduler's
environment to ``os.environ`` for the session, and at session end stops the scheduler only
if a pytest session started it and no other pytest process on the machine still uses it
(registry: /tmp/diffscale-{slurm,sge}.users/). Outside CI (``CI`` != "true") the
fixtures skip when not root or when apt is unavailable; under ``CI=true`` a failed start is
a test error carrying the script's output.

Tests that use a fixture get the matching marker (``slurm`` / ``sge``) automatically, so
``-m "not slurm and not sge"`` deselects them.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from diffscale.cluster.jobs.scheduler import SLURM_FINAL

REPO = Path(__file__).resolve().parents[2]
SCHEDULERS = REPO / "tests" / "schedulers"
SLURM_SH = SCHEDULERS / "slurm.sh"
SGE_SH = SCHEDULERS / "sge.sh"

START_TIMEOUT_S = 900  # a cold start includes apt-get install

# SLURM job states after which a job never runs again by itself: diffscale's own list (SPECIAL_EXIT
# and REVOKED are not final; a job seen in SIGNALING on a busy machine is still running)
SLURM_TERMINAL = set(SLURM_FINAL)


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def _skip_reason() -> str | None:
    """Why the scheduler fixtures cannot run here (None: they can). Never skips in CI."""
    if _in_ci():
        return None
    if os.name != "posix" or os.geteuid() != 0:
        return "real schedulers need root (they install Debian packages and start daemons)"
    if shutil.which("apt-get") is None or shutil.which("dpkg") is None:
        return "real schedulers need apt-get/dpkg (Debian) to install SLURM / Grid Engine"
    return None


def _parse_exports(text: str) -> dict[str, str]:
    env = {}
    for line in text.splitlines():
        m = re.match(r"^export ([A-Za-z_][A-Za-z0-9_]*)=(.*)$", line.strip())
        if m:
            env[m.group(1)] = m.group(2).strip().strip("'\"")
    return env


def _run_script(script: Path, action: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(script), action],
        capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
    )


def _stop(script: Path) -> None:
    try:
        proc = _run_script(script, "stop", 180)
    except subprocess.TimeoutExpired as e:
        warnings.warn(f"{script.name} stop timed out: {e.stderr or ''}", stacklevel=2)
        return
    if proc.returncode != 0:
        warnings.warn(f"{script.name} stop failed (rc={proc.returncode}): {proc.stderr}", stacklevel=2)


def _start(script: Path) -> tuple[dict[str, str], bool]:
    """Start a scheduler; returns (env, started_here)."""
    already = _run_script(script, "status", 60).returncode == 0
    t0 = time.monotonic()
    try:
        proc = _run_script(script, "start", START_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail(
            f"{script.name} start timed out after {START_TIMEOUT_S}s\n"
            f"--- stdout\n{e.stdout or ''}\n--- stderr\n{e.stderr or ''}",
            pytrace=False,
        )
    if proc.returncode != 0:
        pytest.fail(
            f"{script.name} start failed (rc={proc.returncode}) after {time.monotonic() - t0:.1f}s\n"
            f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}",
            pytrace=False,
        )
    return _parse_exports(proc.stdout), not already


class _Users:
    """Which pytest processes use a scheduler, so that concurrent sessions on one machine
    (developers, xdist workers) don't stop it under each other: the scheduler is stopped
    by the last user to leave, and only if a pytest session started it."""

    def __init__(self, name: str):
        self.dir = Path(f"/tmp/diffscale-{name}.users")
        self.flag = self.dir / "started-by-pytest"
        self._lock_path = Path(f"/tmp/diffscale-{name}.users.lock")

    @contextlib.contextmanager
    def locked(self):
        with open(self._lock_path, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def live(self) -> list[int]:
        pids = []
        for p in self.dir.glob("pid-*"):
            pid = int(p.name[4:])
            try:
                os.kill(pid, 0)
                pids.append(pid)
            except ProcessLookupError:
                p.unlink(missing_ok=True)
            except PermissionError:
                pids.append(pid)
        return pids

    def join(self, started_here: bool) -> None:
        self.dir.mkdir(exist_ok=True)
        if started_here:
            self.flag.touch()
        elif not self.live():
            self.flag.unlink(missing_ok=True)  # running, but not from a pytest session we know
        (self.dir / f"pid-{os.getpid()}").touch()

    def leave(self) -> bool:
        """Unregister; True when the caller should stop the scheduler."""
        (self.dir / f"pid-{os.getpid()}").unlink(missing_ok=True)
        if self.live() or not self.flag.exists():
            return False
        self.flag.unlink(missing_ok=True)
        return True


@contextlib.contextmanager
def _scheduler_session(name: str, script: Path):
    """Start (or join) a scheduler for this session; yields (env, started_here)."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    users = _Users(name)
    with users.locked():
        env, started = _start(script)
        users.join(started)
    applied = _EnvApplied(env)
    try:
        yield env, started
    finally:
        applied.restore()
        with users.locked():
            if users.leave():
                _stop(script)


class _EnvApplied:
    """Apply env to os.environ; undo on restore()."""

    def __init__(self, env: dict[str, str]):
        self._saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)

    def restore(self) -> None:
        for k, v in self._saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _sh(cmd: list[str], timeout: float = 30, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed (rc={proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


# --------------------------------------------------------------------------- SLURM


@dataclass(frozen=True)
class SlurmCluster:
    """The SLURM started by tests/schedulers/slurm.sh (two slurmd on this host)."""

    nodes: list[str] = field(default_factory=lambda: ["n1", "n2"])
    partitions: list[str] = field(default_factory=lambda: ["cpu", "gpu", "short"])
    default_partition: str = "cpu"
    gpu_partition: str = "gpu"
    short_partition: str = "short"          # MaxTime=00:01:00 (time-limit tests)
    short_max_time_s: int = 60
    cpus_per_node: int = 4                   # declared; the host really has 2 cores
    mem_per_node_mb: int = 8192              # RealMemory; DefMemPerCPU=2048 (not enforced)
    gpus_per_node: int = 2                   # fake char devices, Gres=gpu:2
    state_dir: Path = Path("/tmp/diffscale-slurm")
    env: dict[str, str] = field(default_factory=dict)
    started_here: bool = False

    @property
    def jobcomp_file(self) -> Path:
        """jobcomp/filetxt log: one line per finished job (JobState=..., ExitCode=...)."""
        return self.state_dir / "jobcomp.txt"

    def sbatch(self, *args: str, cwd: str | Path | None = None) -> str:
        """Run ``sbatch --parsable ARGS``; returns the job id."""
        proc = subprocess.run(["sbatch", "--parsable", *args], capture_output=True, text=True,
                              timeout=30, cwd=cwd, stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            raise RuntimeError(f"sbatch {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job -o`` as a dict (JobState, ExitCode, NodeList, Restarts, ...).

        Finished jobs stay visible for MinJobAge=3600 s. Values with spaces are cut at
        the first space (fine for the scalar fields tests read).
        """
        proc = _sh(["scontrol", "show", "job", "-o", str(job_id)])
        return dict(re.findall(r"(?:^|\s)([A-Za-z][\w/:]*)=(\S*)", proc.stdout))

    def wait(self, job_id: str, timeout: float = 60, states: set[str] | None = None,
             poll: float = 0.5) -> dict[str, str]:
        """Wait until the job's JobState is in ``states`` (default: any terminal state,
        and not COMPLETING); returns :meth:`job`. Raises TimeoutError with the job info."""
        want = states or SLURM_TERMINAL
        deadline = time.monotonic() + timeout
        info: dict[str, str] = {}
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if info.get("JobState") in want:
                return info
            time.sleep(poll)
        raise TimeoutError(f"SLURM job {job_id} not in {sorted(want)} after {timeout}s: {info}")


@pytest.fixture(scope="session")
def slurm_cluster() -> SlurmCluster:
    with _scheduler_session("slurm", SLURM_SH) as (env, started):
        yield SlurmCluster(
            state_dir=Path(env.get("DIFFSCALE_SLURM_DIR", "/tmp/diffscale-slurm")),
            env=env, started_here=started,
        )


# --------------------------------------------------------------------------- Grid Engine


class QacctRecord(dict):
    """One ``qacct -j`` record: raw string values by key, plus int accessors."""

    def int(self, key: str) -> int:
        """Leading integer of a value (``failed`` reads e.g. "37  : qmaster enforced h_rt,
        h_cpu, or h_vmem limit", ``exit_status`` "137                  (Killed)")."""
        m = re.match(r"\s*(-?\d+)", self.get(key, ""))
        if not m:
            raise ValueError(f"no integer in {key}={self.get(key)!r}")
        return int(m.group(1))

    @property
    def exit_status(self) -> int:
        return self.int("exit_status")

    @property
    def failed(self) -> int:
        return self.int("failed")


def parse_qacct(text: str) -> list[QacctRecord]:
    """``qacct -j`` output -> one record per run/task, oldest first (a rescheduled job adds
    a record per run; each qrsh -inherit task of a PE job adds one too)."""
    records: list[QacctRecord] = []
    cur: QacctRecord | None = None
    for line in text.splitlines():
        if line.startswith("====="):
            cur = QacctRecord()
            records.append(cur)
            continue
        if cur is None or not line.strip():
            continue
        key, _, value = line.partition(" ")
        cur[key] = value.strip()
    return records


@dataclass(frozen=True)
class SgeCluster:
    """The Grid Engine started by tests/schedulers/sge.sh (qmaster + execd on this host)."""

    host: str = ""
    queue: str = "all.q"
    pes: list[str] = field(default_factory=lambda: ["smp", "mpi"])  # $pe_slots, $fill_up
    slots: int = 4
    gpus: int = 2                  # consumable "gpus" (per JOB) on the exec host
    gpu_complex: str = "gpus"
    notify_s: int = 5              # queue notify time: SIGUSR2 this long before the h_rt kill
    state_dir: Path = Path("/tmp/diffscale-sge")
    env: dict[str, str] = field(default_factory=dict)
    started_here: bool = False

    def qsub(self, *args: str, cwd: str | Path | None = None) -> str:
        """Run ``qsub -terse ARGS``; returns the job id."""
        proc = subprocess.run(["qsub", "-terse", *args], capture_output=True, text=True,
                              timeout=30, cwd=cwd, stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            raise RuntimeError(f"qsub {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc.stdout.strip().split(".")[0]

    def is_known(self, job_id: str) -> bool:
        """True while qmaster still has the job (pending, running, rescheduling)."""
        return _sh(["qstat", "-j", str(job_id)], check=False).returncode == 0

    def qacct(self, job_id: str) -> list[QacctRecord]:
        proc = _sh(["qacct", "-j", str(job_id)], check=False)
        return parse_qacct(proc.stdout) if proc.returncode == 0 else []

    def wait(self, job_id: str, timeout: float = 60, poll: float = 0.5) -> list[QacctRecord]:
        """Wait until the job has left qmaster and its accounting is written; returns all
        qacct records (the last one is the final run's). Raises TimeoutError."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.is_known(job_id):
                records = self.qacct(job_id)
                if records:
                    return records
            time.sleep(poll)
        raise TimeoutError(
            f"SGE job {job_id} not finished after {timeout}s:\n"
            + _sh(["qstat", "-j", str(job_id)], check=False).stdout[-3000:]
        )


@pytest.fixture(scope="session")
def sge_cluster() -> SgeCluster:
    with _scheduler_session("sge", SGE_SH) as (env, started):
        yield SgeCluster(
            host=env.get("DIFFSCALE_SGE_HOST") or os.uname().nodename.split(".")[0],
            state_dir=Path(env.get("DIFFSCALE_SGE_DIR", "/tmp/diffscale-sge")),
            env=env, started_here=started,
        )


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if not Path(str(getattr(item, "path", None) or item.fspath)).is_relative_to(here):
            continue
        if "slurm_cluster" in fixtures:
            item.add_marker(pytest.mark.slurm)
        if "sge_cluster" in fixtures:
            item.add_marker(pytest.mark.sge)
