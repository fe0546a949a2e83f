"""``OnlineTrainer``: train a field model on samples a running simulation pushes, inside the
simulation's own process (or, from a spool directory, in another job).

It is diffscale's run state and optimizer step (``RunState``, ``StepRunner``) fed from a replay
buffer: the same network, EMA, precision, compilation and checkpoints as ``diffscale train``.
``push`` only checks and copies the arrays into a host-side queue (no lock, a handful of
array operations), so the simulation never waits on training; ``train_for`` (or the
background thread) moves what was pushed into the buffer and trains.

Example (runs as is on a CPU)::

    import numpy as np
    from diffscale.online import OnlineTrainer
    from diffscale.config.presets import get_preset

    cfg = get_preset("field-icon")
    trainer = OnlineTrainer("runs/online", cfg, policy="fifo", capacity=3840, ready_at=800)
    rng = np.random.default_rng(0)
    for step in range(20):                      # the simulation's output steps
        cond, x = rng.normal(size=(80, 7)), rng.normal(size=(80, 256))
        trainer.push(cond, x, sim_time=600.0 * step)
        if trainer.ready():
            trainer.train_for(steps=50)          # or seconds=2.0
    fine = trainer.sample(cond[:4], n_members=16, steps=50)   # (4, 16, 256)
    trainer.checkpoint()

Or let it train in a background thread between pushes, so the simulation never waits::

    trainer.start()                              # trains whenever the buffer is ready
    for step in range(20, 40):
        trainer.push(rng.normal(size=(80, 7)), rng.normal(size=(80, 256)), sim_time=600.0 * step)
    trainer.stop()                               # after the round in progress

The run directory is locked while a trainer holds it (``close()`` frees it, as does the end of
the process); a second trainer there is refused. A new ``OnlineTrainer`` on the same run
directory resumes from its newest checkpoint: weights, EMA, optimizer, statistics, buffer
contents and position, RNG states and the simulation time.
A larger ``capacity`` keeps the buffer's rows and fills up after them. A run directory that
``diffscale train`` wrote from other data (a file, a spool) is refused, never rewritten.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console

from diffscale.config import RunConfig, write_yaml
from diffscale.diffusion.inference import sampling_network
from diffscale.errors import UserError
from diffscale.online.checks import check_online_run, check_same_model, check_sizes, whole
from diffscale.online.sampling import EnsembleSampler
from diffscale.runtime import checkpoint as ckpt
from diffscale.runtime.resources import check_fits
from diffscale.runtime.runlock import RunLock
from diffscale.tasks.fields.buffer import BufferPolicy, BufferSpec, as_arrays, buffer_policy, chunk_times
from diffscale.tasks.fields.spool import SpoolReader
from diffscale.tasks.fields.task import FieldTask
from diffscale.training.build import build_run, join
from diffscale.training.state import RunState

BACKGROUND_SWITCH_INTERVAL_S = 0.0002
"""The interpreter's thread switch interval while ``start`` trains in the background."""


class OnlineTrainer:
    """Train ``cfg``'s field model in ``run_dir`` on pushed samples (see the module docstring).

    ``policy``/``capacity``: which samples the buffer keeps and how many. ``ready_at``: samples
    the buffer must hold before training starts (default: full; at least one batch); the
    normalisation statistics are taken from the buffer at that moment and kept for the rest of
    the run. ``force``: take the run directory's lock from a trainer on another host that has ended.
    """

    def __init__(self, run_dir: str | Path, cfg: RunConfig, *, policy: str | BufferPolicy = "fifo",
                 capacity: int = 3840, ready_at: int | None = None, console: Console | None = None,
                 force: bool = False) -> None:
        if cfg.task != "fields":
            raise UserError(f"online training needs a fields config (this one is task {cfg.task})",
                            "start from a field preset, e.g. get_preset('field-icon')")
        check_sizes(capacity, ready_at, max(2, cfg.effective_batch(1)))
        spec = BufferSpec(buffer_policy(policy), int(capacity))
        cfg = copy.deepcopy(cfg)
        cfg.data.source = spec.source
        self.run_dir = Path(run_dir)
        self.console = console or Console(stderr=True)
        # Always one process, whatever launcher started the simulation around it (srun, mpirun); on a
        # CPU, beside the simulation's ranks, on the cores they leave.
        ctx, policy_ = join(cfg, self.console, one_process=True)
        state = ckpt.load_latest(self.run_dir, log=self._say)

        def prepare(run_state: RunState) -> None:  # before anything in the run directory is written
            if state is not None:
                check_same_model(state, run_state.task.signature(), self.run_dir)
            check_online_run(self.run_dir, state)

        # Draws from what the buffer holds now; this class fills it (push, follow) between rounds.
        run = build_run(cfg, self.run_dir, ctx, policy_, console=self.console, say=self._say, checkpoint=state,
                        prepare=prepare)
        self.run_state, self.runner = run.state, run.runner
        task = self.run_state.task
        assert isinstance(task, FieldTask) and task.buffer is not None
        self.task, self.buffer = task, task.buffer
        self.ready_at = spec.capacity if ready_at is None else int(ready_at)
        if state is not None:
            self._say(f"resumed from step {state.step}: {self.buffer.describe()}")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._lock = RunLock(self.run_dir, who="OnlineTrainer").acquire(force=force, say=self._say)
        self._unlock = weakref.finalize(self, self._lock.release)  # also when dropped or at exit
        write_yaml(cfg, self.run_dir / "config.yaml")
        self._pending: deque[tuple[np.ndarray, np.ndarray, float]] = deque()
        """Pushed, not yet in the buffer: push appends, ``_ingest_now`` (under ``_busy``) pops."""
        self._busy = threading.RLock()  # one of train / ingest / sample / checkpoint at a time
        self._callers = threading.Condition()
        self._waiting = 0
        """API calls waiting for ``_busy``: background training lets them in first (see ``_turn``)."""
        self._thread: threading.Thread | None = None
        self._switch_interval = sys.getswitchinterval()
        self._halt = threading.Event()
        self.error: BaseException | None = None
        """What ended background training, if anything did (``stop`` raises it)."""
        self.dropped_rows = 0
        self.spool: SpoolReader | None = None
        self._sampler: EnsembleSampler | None = None

    def _say(self, text: str) -> None:
        self.console.print(f"diffscale online: {text}", highlight=False)

    # -- feeding ---------------------------------------------------------------------------
    def push(self, cond: Any, x: Any, sim_time: float) -> None:
        """Hand over one output step's samples: cond (n, C), x (n, D) or (n, D, K), numpy or torch.

        Copies and returns at once (training happens in ``train_for``). Rows with NaN or inf are
        dropped and counted (``dropped_rows``); arrays of the wrong shape raise ``UserError``."""
        try:
            time_ = float(sim_time)
        except (TypeError, ValueError):
            raise UserError(f"push's sim_time={sim_time!r} is not a number",
                            "pass the simulation time of the output step, e.g. sim_time=600.0") from None
        if not math.isfinite(time_):
            raise UserError(f"push's sim_time={sim_time!r} is not a finite number",
                            "pass the simulation time of the output step, e.g. sim_time=600.0")
        c, v, dropped = as_arrays(cond, x, self.task.cond_dim, self.task.x_shape)
        if dropped:
            self.dropped_rows += dropped
            self._say(f"warning: dropped {dropped} pushed rows holding NaN or inf at sim_time {time_:g} "
                      f"({self.dropped_rows} so far)")
        self._pending.append((c, v, time_))  # deque.append is atomic: no lock to wait for

    def follow(self, spool_dir: str | Path) -> None:
        """Also read every file a ``SpoolWriter`` puts in ``spool_dir`` (decoupled mode)."""
        self.spool = SpoolReader(Path(spool_dir), self.task.cond_dim, self.task.x_shape, next=self.buffer.cursor,
                                 given_by="OnlineTrainer.follow")

    @contextlib.contextmanager
    def _turn(self) -> Iterator[None]:
        """Hold ``_busy`` for an API call. A lock is not fair: background training, releasing it
        after a round and taking it again at once, could keep a waiting caller out for rounds.
        Counted in ``_waiting``, the caller gets it at the next round boundary instead."""
        with self._callers:
            self._waiting += 1
        try:
            self._busy.acquire()
        finally:
            with self._callers:
                self._waiting -= 1
                self._callers.notify_all()
        try:
            yield
        finally:
            self._busy.release()

    def _ingest_now(self) -> None:
        """Move pushed and spooled samples into the buffer (on the training device); under ``_busy``."""
        pushed = [self._pending.popleft() for _ in range(len(self._pending))]  # what was there now, in order
        chunks = [(torch.from_numpy(c), torch.from_numpy(v), chunk_times(len(c), t)) for c, v, t in pushed]
        if self.spool is not None:
            skipped = len(self.spool.skipped)
            for chunk in self.spool.poll():
                chunks.append((chunk.cond, chunk.x, chunk.sim_time))
                self.dropped_rows += chunk.dropped_rows
            for reason in self.spool.skipped[skipped:]:
                self._say(f"warning: skipped spool file {reason}")
            self.buffer.cursor = self.spool.next
        for c, v, times in chunks:
            if len(c):
                self.buffer.add(c, v, times)
        if not self.task.stats_fitted and self.buffer.size >= self.ready_at:
            self.task.fit_statistics()

    def ready(self) -> bool:
        """Whether the buffer holds ``ready_at`` samples (counting what was pushed since the last call)."""
        with self._turn():
            return self._ready_now()

    def _ready_now(self) -> bool:  # under ``_busy``
        self._ingest_now()
        return self.task.stats_fitted and self.buffer.size >= self.ready_at

    # -- training and sampling ---------------------------------------------------------------
    def train_for(self, steps: int | None = None, seconds: float | None = None) -> dict[str, Any]:
        """Train ``steps`` optimizer steps, or for ``seconds`` of wall time (whichever is given);
        returns the round's metrics (also appended to ``run_dir/metrics.jsonl``). While the buffer
        is not ready it trains nothing and the record says how full the buffer is."""
        if (steps is None) == (seconds is None):
            raise UserError("train_for needs steps or seconds (one of them)", "call train_for(steps=100) or "
                            "train_for(seconds=2.0)")
        if steps is not None and not whole(steps, 1):
            raise UserError(f"train_for's steps={steps!r} is not a whole number of at least 1",
                            "pass steps=1 or more (optimizer steps to train), or seconds=")
        if seconds is not None and not (isinstance(seconds, (int, float, np.floating)) and 0 < seconds < math.inf):
            raise UserError(f"train_for's seconds={seconds!r} is not a positive number of seconds",
                            "pass seconds= more than 0 (wall time to train), or steps=")
        with self._turn():
            return self._train_round(None if steps is None else int(steps), seconds)

    def _train_round(self, steps: int | None, seconds: float | None) -> dict[str, Any]:
        if not self._ready_now():
            record = {"kind": "online", "waiting": True, "step": self.run_state.step, "buffer": self.buffer.size,
                      "ready_at": self.ready_at, "pushes": self.buffer.pushes, "time": time.time()}
            self._say(f"waiting for data: buffer {self.buffer.size}/{self.ready_at} samples "
                      f"({self.buffer.pushes} pushes)")
            return self._log(record)
        started, first, lr = time.perf_counter(), self.run_state.step, float("nan")
        deadline = started + seconds if seconds is not None else float("inf")
        while (steps is None or self.run_state.step - first < steps) and time.perf_counter() < deadline:
            lr = self.runner.step()
        window = self.runner.drain_metrics(self.run_state.ctx)
        self.run_state.nonfinite_total += window.nonfinite
        elapsed = time.perf_counter() - started
        done = self.run_state.step - first
        return self._log({"kind": "online", "step": self.run_state.step, "steps": done, "loss": window.loss,
                          "grad_norm": window.grad_norm, "lr": lr, "seconds": elapsed,
                          "samples_per_s": done * self.runner.effective / max(elapsed, 1e-9),
                          "buffer": self.buffer.size, "pushes": self.buffer.pushes,
                          "sim_time": self.buffer.latest_time(), "nonfinite_skipped": self.run_state.nonfinite_total,
                          "dropped_rows": self.dropped_rows, "time": time.time()})

    def _log(self, record: dict[str, Any]) -> dict[str, Any]:
        with open(self.run_dir / "metrics.jsonl", "a") as fh:
            fh.write(json.dumps(record) + "\n")
        return record

    def sample(self, cond: Any, n_members: int, steps: int, *, seed: int = 0) -> np.ndarray:
        """Ensembles from the EMA weights: cond (N, C), or (C,) for one cell -> (N, n_members,
        D[, K]) in data units (N = 1 for one cell). ``steps``: DDIM steps, 1 to the model's
        diffusion steps (``diffusion.num_train_timesteps``).

        ``seed`` (0 to 2**63 - 1) fixes the start noise (the same ensemble on every device).
        Numbering calls by output step (0, 1, 2, ...) is fastest: the next seed's noise is drawn
        while this call runs. A condition holding NaN or inf gives NaN members for that cell."""
        if not self.task.stats_fitted:
            raise UserError("sampling was asked for before the model trained on any data",
                            "push data and train (ready() must be true) before sampling")
        dim = self.task.cond_dim
        fix = f"pass an N x {dim} array of numbers (one row per cell), or {dim} numbers for one cell"
        try:
            c = np.asarray(cond.detach().to("cpu", torch.float32).numpy() if isinstance(cond, torch.Tensor) else cond)
        except ValueError:
            raise UserError("conditions with rows of different lengths do not fit this model", fix) from None
        if c.shape == (dim,):
            c = c[None]
        if c.ndim != 2 or c.shape[1] != dim or c.shape[0] == 0 or c.dtype.kind not in "iuf":
            raise UserError(f"conditions of shape {c.shape} ({c.dtype}) do not fit this model", fix)
        limit = self.task.diffusion.num_timesteps
        if not whole(steps, 1, limit):
            raise UserError(f"sample's steps={steps!r} is not a whole number from 1 to {limit}",
                            f"pass steps from 1 to {limit} (the model's diffusion steps)")
        if not whole(n_members, 1):
            raise UserError(f"sample's n_members={n_members!r} is not a whole number of at least 1",
                            "pass n_members=1 or more (ensemble members per cell)")
        if not whole(seed, 0, 2**63 - 1):
            raise UserError(f"sample's seed={seed!r} is not a whole number from 0 to 2**63 - 1",
                            "pass seed= an integer in that range, e.g. the output step's number")
        members = c.shape[0] * int(n_members)
        check_fits(members * math.prod(self.task.x_shape) * 4 * 2, f"sample's {c.shape[0]} x {n_members} members",
                   "ask for fewer members per call (n_members=, or fewer cells at a time)")
        with self._turn():  # never the weights of half an optimizer step
            if self._sampler is None:  # the EMA as sampling runs it, reading its weights as they are now
                network = sampling_network(self.run_state.ema, self.run_state.cfg.runtime, live=True)
                self._sampler = EnsembleSampler(self.task, network)
            return self._sampler(c, int(n_members), int(steps), int(seed))

    @property
    def sampler(self) -> EnsembleSampler | None:
        """What ``sample`` runs (after its first call): its ``last_split`` says where a call's
        host time went."""
        return self._sampler

    def checkpoint(self) -> Path:
        """Write a checkpoint now (atomically); returns its folder."""
        with self._turn():
            self._ingest_now()  # pushed samples are kept too
            self.run_state.save(self.runner.batcher)
            return ckpt.list_checkpoints(self.run_dir)[-1]

    # -- background training -------------------------------------------------------------------
    def start(self, steps_per_round: int = 20, switch_interval_s: float = BACKGROUND_SWITCH_INTERVAL_S) -> None:
        """Train in a background thread whenever the buffer is ready, ``steps_per_round`` steps at
        a time, until ``stop``. ``push`` stays a copy; ``sample`` and ``checkpoint`` wait for the
        round in progress. An error ends training, not the simulation (``stop`` raises it).
        ``switch_interval_s``: the interpreter's thread switch interval until ``stop`` (longer
        ones are kept)."""
        if not whole(steps_per_round, 1):
            raise UserError(f"start's steps_per_round={steps_per_round!r} is not a whole number of at least 1",
                            "pass steps_per_round=1 or more (optimizer steps between two chances to sample, "
                            "checkpoint or stop)")
        if self._thread is not None:
            return
        self._halt.clear()
        # push() runs on the simulation's thread and needs the GIL, which the training thread
        # hands over only every sys.getswitchinterval() (5 ms by default) while it runs Python
        # between launches: a shorter interval while training runs bounds push's wait.
        self._switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(min(self._switch_interval, switch_interval_s))

        def run() -> None:
            try:
                while not self._halt.is_set():
                    with self._callers:  # a round boundary: API calls waiting for the lock go first
                        self._callers.wait_for(lambda: self._waiting == 0)
                    with self._busy:
                        ready = self._ready_now()
                        if ready:
                            self._train_round(steps_per_round, None)
                    if not ready:
                        self._halt.wait(0.1)  # nothing to train on yet: poll again soon
            except BaseException as exc:  # kept for stop(): the simulation's thread decides
                self.error = exc
                self._say(f"error: background training stopped: {exc}")

        self._thread = threading.Thread(target=run, name="diffscale-online", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop background training and free the run directory for another trainer; raises what
        ended background training early, if anything did."""
        try:
            self.stop()
        finally:
            self._unlock()

    def stop(self) -> None:
        """End background training after its current round; raises what ended it early, if anything."""
        if self._thread is not None:
            self._halt.set()
            self._thread.join()
            self._thread = None
            sys.setswitchinterval(self._switch_interval)
        if self.error is not None:
            error, self.error = self.error, None
            raise error
