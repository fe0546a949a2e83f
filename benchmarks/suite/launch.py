"""Training and evaluating suite runs as ``diffscale`` subprocesses, several side by side.

Each slot runs one process at a time: on GPUs a slot is one GPU (``CUDA_VISIBLE_DEVICES``), on a
CPU a share of the cores (``OMP_NUM_THREADS``). A run is ``diffscale train`` into its own folder,
then ``diffscale eval RUN --json``; its output goes to a log beside the run folder. A run whose
record (``result.json``) is already in its folder is not trained again, so a benchmark cut short
continues where it stopped; a folder without one (a run killed midway) is trained afresh. A call
interrupted (^C, or ``timeout --signal=INT``) starts no further run and keeps no record of the runs
it interrupted in their training; a run it caught in its evaluation is kept without its score,
and the next call evaluates it where its checkpoints still are (the machine that trained it).

On GPUs, runs that compile the same step (one preset, set and variant: the seed does not change the
graph) wait until the first of them has its compiled step in the shared kernel cache
(``KernelsReady``), then load it: three large runs started together on one H200 each compiled
for 175-180 s before their first step, the same kernels three times over; started this way the
first compiled for 140-152 s and the others took their first step 15-34 s after their start
(two H200, 2026-11-30).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from diffscale.runtime.signals import EXIT_REQUEUE

T = TypeVar("T")
R = TypeVar("R")

GRACE_S = 300
"""After the budget's stop request, the seconds a run has to write its checkpoint before it is killed."""

INTERRUPTED_CODES = (130, -signal.SIGINT)
"""Exit codes of a ``diffscale`` process stopped by SIGINT (its own handler's, or the signal's)."""

TRAINED_TO_AN_END = (0, EXIT_REQUEUE)
"""Exit codes of a training that ran to its end (85: stopped at ``--seconds``, checkpointed; a run
stopped so by another signal than the budget's is an interrupted one, ``train_and_eval``)."""
EVAL_CUT_OFF = ("the call was interrupted during the evaluation: the run is kept without its score (the next call "
                "evaluates it where its checkpoints are; elsewhere remove its result.json to train it again)")

interrupted = threading.Event()
"""Set when the call is interrupted: no further run or evaluation starts, no run cut off in its
training is kept."""

STEP_LOGGED = re.compile(r"\bstep \d+/\d+ |first step of this job")
"""A line of ``diffscale train`` after a step ran: its progress (``step 50/20000  loss ...``) or
its first step's note."""
BUILT = re.compile(r"the background compile has built the step|\bcompiled from step \d+")
"""A line of a run that trains eager while compiling once its compiled step is in the kernel cache:
the background process built it (and marked the folder whole), or the run switched to it."""


class KernelsReady:
    """Reads one run's output lines and says when its compiled step is in the kernel cache, so runs
    of the same step load it instead of compiling it beside it: at its first step where it compiles
    first (or compiles nothing), and where it trains eager while compiling (``runtime.
    compile_while_training``; its start note and first step say ``eager while compiling``) only once
    its background compile has built the step or it switched to compiled steps."""

    def __init__(self) -> None:
        self.eager_first = False

    def __call__(self, line: str) -> bool:
        if BUILT.search(line):
            return True
        if "eager while compiling" in line:
            self.eager_first = True
        return not self.eager_first and bool(STEP_LOGGED.search(line))


@dataclass(frozen=True)
class RunSpec:
    """One training run of the benchmark and how to evaluate it."""

    preset: str
    set_name: str
    task: str
    variant: str
    seed: int
    data: str
    """The ``--data`` spec."""
    overrides: tuple[str, ...]
    """Every ``--set`` of the run: the set's, the call's, the variant's, the seed and step count."""
    eval_args: tuple[str, ...]
    run_dir: Path

    @property
    def label(self) -> str:
        return f"{self.preset}/{self.set_name}/{self.variant}/seed{self.seed}"

    def train_command(self) -> list[str]:
        sets = [arg for item in self.overrides for arg in ("--set", item)]
        return [sys.executable, "-m", "diffscale", "train", "--preset", self.preset, "--data", self.data,
                "--out", str(self.run_dir), *sets]

    def eval_command(self, count: int | None) -> list[str]:
        return [sys.executable, "-m", "diffscale", "eval", str(self.run_dir), "--json", *self.eval_args,
                *(["--count", str(count)] if count else [])]


@dataclass(frozen=True)
class Slots:
    """Where processes run: ``gpus`` (one slot each) or, with none, ``jobs`` CPU slots sharing
    ``cores``."""

    gpus: tuple[str, ...] = ()
    jobs: int = 1
    cores: int = 1

    @property
    def count(self) -> int:
        return len(self.gpus) or self.jobs

    def env(self, slot: int) -> dict[str, str]:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(name, None)  # each run is a single process of its own
        # a CPU slot hides the GPUs: a run there must not pick one up by itself
        env["CUDA_VISIBLE_DEVICES"] = self.gpus[slot] if self.gpus else ""
        if not self.gpus:
            env.setdefault("OMP_NUM_THREADS", str(max(1, self.cores // self.jobs)))
        return env


def run_logged(command: list[str], env: dict[str, str], log: Path, budget_s: float | None,
               on_line: Callable[[str], None] | None = None) -> tuple[int, float, str]:
    """Run ``command`` with its output appended to ``log``; at ``budget_s`` ask it to stop (SIGTERM:
    diffscale checkpoints and exits 85). With ``on_line``, stderr joins stdout and each line also goes
    there as it comes: ``diffscale train`` reports its steps on stderr when stdout is not a terminal
    (stdout keeps the run folder). Returns (exit code, seconds, the last line read)."""
    start = time.perf_counter()
    last = ""
    with open(log, "a") as out:
        out.write(f"$ {' '.join(command)}\n")
        out.flush()
        with subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                              stderr=out if on_line is None else subprocess.STDOUT, text=True) as process:
            assert process.stdout is not None
            try:
                with _stop_at(process, budget_s):
                    for line in process.stdout:
                        out.write(line)
                        last = line.strip() or last
                        if on_line is not None:
                            out.flush()  # the log holds the line before anyone acts on it
                            on_line(line)
                    process.wait()
            except BaseException:
                process.kill()
                raise
    return process.returncode, time.perf_counter() - start, last


@contextlib.contextmanager
def _stop_at(process: subprocess.Popen, seconds: float | None) -> Iterator[None]:
    """SIGTERM to ``process`` after ``seconds`` (None: never), SIGKILL ``GRACE_S`` later, unless it ended."""
    timers = [] if seconds is None else [threading.Timer(seconds, process.send_signal, (signal.SIGTERM,)),
                                         threading.Timer(seconds + GRACE_S, process.kill)]
    for timer in timers:
        timer.daemon = True
        timer.start()
    try:
        yield
    finally:
        for timer in timers:
            timer.cancel()


def train_and_eval(spec: RunSpec, env: dict[str, str], *, budget_s: float | None, evaluate: bool,
                   eval_count: int | None, on_line: Callable[[str], None] | None = None) -> dict:
    """Train ``spec`` (afresh: an unfinished folder is removed; its output lines also to ``on_line``),
    evaluate it when it trained to an end; returns what happened (exit codes, seconds, the eval's
    JSON record or its failure)."""
    if spec.run_dir.exists():
        shutil.rmtree(spec.run_dir)
    log = spec.run_dir.with_name(spec.run_dir.name + ".log")
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    code, seconds, _ = run_logged(spec.train_command(), env, log, budget_s, on_line)
    done: dict = {"exit_code": code, "train_s": round(seconds, 1), "log": str(log), "eval": None}
    if code in INTERRUPTED_CODES or (code == EXIT_REQUEUE and (budget_s is None or seconds < budget_s)):
        # stopped by SIGINT, or checkpointed on a signal that was not the budget's: the call is being
        # stopped. Said here, not left to the main thread's KeyboardInterrupt: a process-directed SIGINT
        # may land on a worker thread, and the main thread, blocked on an unfinished run, then hears of it
        # only when that run ends (on a GPU host the stopped runs went on to evaluate for minutes and the
        # call was killed)
        interrupted.set()
    if not evaluate or code not in TRAINED_TO_AN_END:
        return done
    return done | evaluate_trained(spec, env, log, eval_count)


def evaluate_trained(spec: RunSpec, env: dict[str, str], log: Path, eval_count: int | None) -> dict:
    """``diffscale eval`` of a run trained to its end (output appended to ``log``): the outcome's
    evaluation keys (the JSON record, seconds and exit code, or why there is no score)."""
    done: dict = {"eval": None}
    if interrupted.is_set():  # a stopping call starts no evaluation
        done["eval_error"] = EVAL_CUT_OFF
        return done
    eval_code, eval_s, last = run_logged(spec.eval_command(eval_count), env, log, None)
    done["eval_s"], done["eval_code"] = round(eval_s, 1), eval_code
    try:
        done["eval"] = json.loads(last) if eval_code == 0 else None
    except json.JSONDecodeError:
        done["eval"] = None
    if done["eval"] is None:
        # the call's SIGINT reaches the evaluation too, and may end it in another way than 130 (a
        # traceback from wherever it landed): while the call stops, an evaluation that failed was cut off
        cut = eval_code in INTERRUPTED_CODES or interrupted.is_set()
        done["eval_error"] = EVAL_CUT_OFF if cut else f"diffscale eval exited {eval_code} (see {log})"
    return done


def in_slots(items: list[T], slots: Slots, work: Callable[[T, dict[str, str], str], R]) -> list[R]:
    """``work(item, env, where)`` for every item, ``slots.count`` at a time, each given a free slot's
    environment and ``where`` it runs (`` on GPU N``, or empty on a CPU); results in ``items``' order."""
    free: queue.Queue[int] = queue.Queue()
    for slot in range(slots.count):
        free.put(slot)

    def one(item: T) -> R:
        slot = free.get()
        try:
            return work(item, slots.env(slot), f" on GPU {slots.gpus[slot]}" if slots.gpus else "")
        finally:
            free.put(slot)

    with ThreadPoolExecutor(max_workers=slots.count) as pool:
        try:
            results = list(pool.map(one, items))
        except KeyboardInterrupt:
            interrupted.set()
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    if interrupted.is_set():  # a run stopped by the call's signal, which the main thread did not hear
        raise KeyboardInterrupt
    return results


class CompileLeaders:
    """Runs that compile the same step (one preset, set and variant): the first to claim it leads,
    the others wait until its compiled step is in the kernel cache (``KernelsReady``), or its end."""

    def __init__(self) -> None:
        self._ready: dict[tuple[str, str, str], threading.Event] = {}
        self._lock = threading.Lock()

    def claim(self, spec: RunSpec) -> tuple[bool, threading.Event]:
        """(whether ``spec`` leads, the event set once its step is compiled)."""
        key = (spec.preset, spec.set_name, spec.variant)
        with self._lock:
            if key in self._ready:
                return False, self._ready[key]
            self._ready[key] = threading.Event()
            return True, self._ready[key]


def run_all(specs: list[RunSpec], slots: Slots, finish: Callable[[RunSpec, dict], dict],
            say: Callable[[str], None], *, stagger: bool = False, **options: object) -> list[dict]:
    """Every spec trained and evaluated (``train_and_eval(..., **options)``) in slots;
    ``finish(spec, outcome)`` turns each outcome into the run's record, which is kept as
    ``result.json`` in its folder. With ``stagger``, runs of one step start once the first of them
    has its compiled step in the kernel cache (``CompileLeaders``). Records come back in the order
    of ``specs``; a run a SIGINT cut short has none."""
    interrupted.clear()
    leaders = CompileLeaders() if stagger else None

    def one(spec: RunSpec, env: dict[str, str], where: str) -> dict:
        kept = spec.run_dir / "result.json"
        if kept.is_file():
            earlier = json.loads(kept.read_text())
            if options.get("evaluate") and scoreless_with_weights(earlier, spec.run_dir):
                return score_kept(spec, earlier, env, where, finish, say,
                                  options.get("eval_count"))  # type: ignore[arg-type]
            say(f"{spec.label}: kept from an earlier call ({kept})")
            return earlier
        leads, ready = leaders.claim(spec) if leaders else (False, None)
        if ready is not None and not leads and not ready.is_set():
            say(f"{spec.label}: waits for the first run of its step to compile it")
            while not ready.wait(1.0) and not interrupted.is_set():
                pass
        if interrupted.is_set():  # the call is stopping: no run starts, nor one that waited (its leader, stopped,
            return {}             # released it: on a GPU host it trained on and the call was killed at its limit)
        say(f"{spec.label}: training{where}")
        watch = KernelsReady()

        def release_when_cached(line: str) -> None:
            if ready is not None and watch(line):
                ready.set()

        try:
            outcome = train_and_eval(spec, env, on_line=release_when_cached if leads else None,
                                     **options)  # type: ignore[arg-type]
        finally:
            if leads and ready is not None:
                ready.set()  # a leader that failed before its first step releases the others too
        if interrupted.is_set() or {outcome["exit_code"], outcome.get("eval_code")} & set(INTERRUPTED_CODES):
            if outcome["exit_code"] != 0:  # 85 here: the signal stopped the training (checkpointed) mid-run
                say(f"{spec.label}: interrupted, not kept (the next call trains it again)")
                return {}
            # trained to its end: its loss curve still answers whether it collapsed
            cut = outcome.get("eval_error") == EVAL_CUT_OFF
            say(f"{spec.label}: trained; " + ("its evaluation was cut off, kept without its score" if cut
                                              else "kept, the call was interrupted after its training"))
        return keep(spec, finish(spec, outcome), say)

    return [record for record in in_slots(specs, slots, one) if record]


def keep(spec: RunSpec, record: dict, say: Callable[[str], None]) -> dict:
    """``record`` kept as the run's ``result.json`` and its summary said."""
    kept = spec.run_dir / "result.json"
    kept.parent.mkdir(parents=True, exist_ok=True)  # a run that failed before making its folder
    kept.write_text(json.dumps(record, indent=1))
    say(f"{spec.label}: {record['summary']}")
    return record


def score_kept(spec: RunSpec, earlier: dict, env: dict[str, str], where: str,
               finish: Callable[[RunSpec, dict], dict], say: Callable[[str], None], eval_count: int | None) -> dict:
    """A run an earlier call on this machine trained and was stopped in evaluating: its weights are
    still here, so it is scored now instead of trained again. Its new record, or ``earlier`` when
    this call is stopped too."""
    if interrupted.is_set():
        return earlier
    say(f"{spec.label}: trained by an earlier call, its evaluation cut off: evaluating it{where}")
    outcome = {key: earlier[key] for key in ("exit_code", "train_s", "log")}
    outcome |= evaluate_trained(spec, env, Path(earlier["log"]), eval_count)
    if outcome.get("eval_error") == EVAL_CUT_OFF:
        say(f"{spec.label}: its evaluation was cut off again, kept without its score")
        return earlier
    return keep(spec, finish(spec, outcome), say)


def scoreless_with_weights(record: dict, run_dir: Path) -> bool:
    """Whether a kept run lost its evaluation to a stopping call and its checkpoints are still in
    ``run_dir`` (the same machine: carried records come without weights)."""
    from diffscale.runtime.checkpoint import list_checkpoints  # torch, only where a run is scored again

    return record.get("eval_error") == EVAL_CUT_OFF and bool(list_checkpoints(run_dir))
