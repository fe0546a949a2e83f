"""``sweep run``: the elements worked through on this machine, one at a time or one per GPU, each a
normal run directory (a diffscale run resumes from its newest checkpoint), with the same state
files a submitted sweep has. An element already done is skipped, so running again continues.

SIGTERM or SIGINT to ``sweep run`` is passed to the elements it runs (each in a session of its
own, so a terminal's Ctrl-C reaches them once, through it): a diffscale run checkpoints and
exits, the element is recorded as stopped, and ``sweep run`` exits 128 + the signal's number.
"""

from __future__ import annotations

import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from diffscale.errors import UserError
from diffscale.io.rundir import duration, progress
from diffscale.studies.expand import Element
from diffscale.studies.plan import SweepPlan, compile_cache_dir
from diffscale.studies.standing import element_state, failure_reason
from diffscale.studies.state import ElementRecord, ElementState, read_states, record

LOCAL_LOG = "logs/local.out"
"""An element's output when ``sweep run`` runs it, relative to its run directory."""

PROGRESS_EVERY_S = 30.0
"""How often ``sweep run`` says where its running elements stand (``--progress-every``)."""


def gpu_slots(text: str | None) -> list[str | None]:
    """``--gpus``: None -> one element at a time, the environment's devices; ``auto`` -> one per GPU
    nvidia-smi lists; ``0,1`` -> those."""
    if text is None:
        return [None]
    if text.strip() == "auto":
        smi = shutil.which("nvidia-smi")
        listed = subprocess.run([smi, "-L"], capture_output=True, text=True).stdout if smi else ""
        count = sum(1 for line in listed.splitlines() if line.startswith("GPU "))
        if not count:
            raise UserError("--gpus auto found no GPU (nvidia-smi lists none)",
                            "leave --gpus out to run the elements one at a time")
        return [str(i) for i in range(count)]
    ids = [t.strip() for t in text.split(",") if t.strip()]
    if not ids or not all(t.isdigit() for t in ids) or len(set(ids)) != len(ids):
        raise UserError(f"--gpus '{text}' is not a list of GPU indices", "write e.g. --gpus 0,1 or --gpus auto")
    return list(ids)


def element_argv(plan: SweepPlan, element: Element) -> tuple[str, ...]:
    if plan.definition.command:
        return element.command(plan.definition.command)
    return (sys.executable, "-m", "diffscale", "train", str(Path(element.run_dir) / "config.yaml"),
            "--out", element.run_dir, "--resume", "auto")


def element_env(plan: SweepPlan, position: int, gpu: str | None) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    cfg = plan.configs[position]
    if cfg is not None:  # elements training the same network share its compiled kernels
        env["TORCHINDUCTOR_CACHE_DIR"] = compile_cache_dir(plan.sweep_dir, cfg, 1)
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    return env


@dataclass
class Stop:
    """The signal that stopped ``sweep run`` (None while none came) and the elements' processes it
    is passed to."""

    signum: int | None = None
    running: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def handle(self, signum: int, frame: FrameType | None) -> None:  # noqa: ARG002 - signal handler signature
        with self.lock:
            first = self.signum is None
            self.signum = signum
            children = list(self.running.values())
        if first:
            print(f"sweep run: got {signal.Signals(signum).name}: passing it to {len(children)} running element(s)",
                  flush=True)
        for child in children:
            try:
                child.send_signal(signum)
            except ProcessLookupError:
                pass

    def start(self, index: int, argv: tuple[str, ...], **kwargs: object) -> subprocess.Popen[bytes] | None:
        """The element's process, unless a stop came first (then None)."""
        with self.lock:
            if self.signum is not None:
                return None
            child = subprocess.Popen(argv, start_new_session=True, **kwargs)  # type: ignore[call-overload]
            self.running[index] = child
            return child

    def ended(self, index: int) -> None:
        with self.lock:
            self.running.pop(index, None)


def run_one(plan: SweepPlan, position: int, gpu: str | None, stop: Stop) -> ElementState:
    """Run one element to its end; its output appended to its run directory's logs/local.out."""
    element = plan.elements[position]
    log = Path(element.run_dir) / LOCAL_LOG
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as out:
        out.write(f"diffscale: sweep element {element.index} on {'GPU ' + gpu if gpu else 'this machine'}\n")
        out.flush()
        try:
            child = stop.start(element.index, element_argv(plan, element), cwd=element.run_dir,
                               env=element_env(plan, position, gpu), stdout=out, stderr=subprocess.STDOUT)
            rc = child.wait() if child is not None else None
        except OSError as exc:
            out.write(f"{exc}\n")
            rc = 127
        finally:
            stop.ended(element.index)
        if rc is None:
            return ElementState(element.index, "pending")
        out.write(f"diffscale: command exited with {rc}\n")
    if rc == 0:
        return ElementState(element.index, "done", exit_code=0)
    if stop.signum is not None:
        name = signal.Signals(stop.signum).name
        return ElementState(element.index, "stopped", f"sweep run got {name} and passed it on (exit {rc}); "
                            "`diffscale sweep run` continues it", exit_code=rc)
    return ElementState(element.index, "failed", failure_reason(Path(element.run_dir)), exit_code=rc)


def _todo(plan: SweepPlan) -> list[int]:
    recorded = read_states(plan.sweep_dir, repair=True)
    todo = []
    for position, e in enumerate(plan.elements):
        row = ElementRecord(e.index, dict(e.values), e.run_dir)
        if element_state(row, recorded.get(e.index), None, False).state != "done":
            todo.append(position)
    return todo


def _install(stop: Stop) -> dict[int, object]:
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, stop.handle) for sig in (signal.SIGTERM, signal.SIGINT)}


def element_standing(run_dir: Path, running_for_s: float) -> str:
    """``step 120/400, eta 1 min 10 s`` from a running element's records, or how long it has run
    (a user command that writes no metrics.jsonl, or a run before its first logged step)."""
    try:
        p = progress(run_dir)
    except UserError:
        return f"running {duration(running_for_s)}"
    eta = f", eta {duration(p.eta_s)}" if p.eta_s is not None else ""
    return f"step {p.step}/{p.total_steps}{eta}" if p.total_steps else f"step {p.step}{eta}"


def started_line(element: Element, gpu: str | None) -> str:
    where = f" on GPU {gpu}" if gpu else ""
    return f"{element.label}: started{where}; its output in {Path(element.run_dir) / LOCAL_LOG}"


def progress_line(plan: SweepPlan, started: dict[int, float], done: int, now: float) -> str:
    """One line: how many elements are done and where each running one stands."""
    running = ", ".join(f"element {plan.elements[position].index}: "
                        f"{element_standing(Path(plan.elements[position].run_dir), now - since)}"
                        for position, since in sorted(started.items()))
    return f"sweep {plan.definition.name}: {done} of {len(plan.elements)} done; {running or 'none running'}"


def _wait(threads: list[threading.Thread], progress_every: float,
          line: Callable[[float], str | None], lock: threading.Lock) -> None:
    """Until every thread ends, waking twice a second for the signal handler, and printing
    ``line(now)`` on stderr every ``progress_every`` seconds (0: never)."""
    last_said = time.monotonic()
    for t in threads:
        while t.is_alive():
            t.join(min(0.5, progress_every) if progress_every > 0 else 0.5)
            now = time.monotonic()
            if progress_every > 0 and now - last_said >= progress_every:
                with lock:
                    said = line(now)
                if said:
                    print(said, file=sys.stderr, flush=True)
                last_said = now


def _ended(plan: SweepPlan, signum: int | None, failed: int) -> int:
    """The last line of ``sweep run`` and its exit code."""
    if signum is not None:
        print(f"sweep run stopped by {signal.Signals(signum).name}: "
              f"`diffscale sweep run {plan.sweep_dir}` continues it")
        return 128 + signum
    if failed:
        print(f"{failed} element(s) failed: `diffscale sweep status {plan.sweep_dir}` says why; "
              f"`diffscale sweep run {plan.sweep_dir}` runs them again")
        return 1
    print(f"all {len(plan.elements)} element(s) done: diffscale sweep collect {plan.sweep_dir}")
    return 0


def run_elements(plan: SweepPlan, slots: list[str | None], progress_every: float = PROGRESS_EVERY_S) -> int:
    """Every element not yet done, ``len(slots)`` at a time. Exit 0 when all are done, 1 when one
    failed, 128 + N when signal N stopped the sweep. Every ``progress_every`` seconds (0: never) a
    line on stderr says where the running elements stand."""
    todo = _todo(plan)
    print(f"sweep {plan.definition.name}: {len(plan.elements) - len(todo)} of {len(plan.elements)} element(s) "
          f"done; running {len(todo)} here, {len(slots)} at a time", flush=True)
    work: queue.Queue[int] = queue.Queue()
    for position in todo:
        work.put(position)
    lock = threading.Lock()
    failed: list[int] = []
    started: dict[int, float] = {}  # position -> when it started, while it runs
    done = len(plan.elements) - len(todo)
    stop = Stop()

    def worker(gpu: str | None) -> None:
        nonlocal done
        while stop.signum is None:
            try:
                position = work.get_nowait()
            except queue.Empty:
                return
            element = plan.elements[position]
            index = element.index
            with lock:
                record(plan.sweep_dir, ElementState(index, "running", f"here{' on GPU ' + gpu if gpu else ''}",
                                                    pid=os.getpid()))
                started[position] = time.monotonic()
                print(started_line(element, gpu), file=sys.stderr, flush=True)
            result = run_one(plan, position, gpu, stop)
            with lock:
                started.pop(position, None)
                record(plan.sweep_dir, result)
                if result.state == "failed":
                    failed.append(index)
                if result.state == "done":
                    done += 1
                print(f"{element.label}: {result.state}"
                      f"{' -- ' + result.reason if result.reason else ''}", flush=True)

    previous = _install(stop)
    try:
        threads = [threading.Thread(target=worker, args=(gpu,)) for gpu in slots]
        for t in threads:
            t.start()
        _wait(threads, progress_every, lambda now: progress_line(plan, dict(started), done, now)
              if started else None, lock)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
    return _ended(plan, stop.signum, len(failed))
