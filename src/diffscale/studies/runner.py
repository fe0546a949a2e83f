"""``sweep run``: the elements worked through on this machine, one at a time or one per GPU, each a
normal run directory (a diffscale run resumes from its newest checkpoint), with the same state
files a submitted sweep has. An element already done is skipped, so running again continues."""

from __future__ import annotations

import os
import queue
import shutil
import subprocess
import sys
import threading
from pathlib import Path

from diffscale.errors import UserError
from diffscale.studies.expand import Element
from diffscale.studies.plan import SweepPlan, compile_cache_dir
from diffscale.studies.state import ElementRecord, ElementState, element_state, read_states, record

LOCAL_LOG = "logs/local.out"
"""An element's output when ``sweep run`` runs it, relative to its run directory."""


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


def run_one(plan: SweepPlan, position: int, gpu: str | None) -> ElementState:
    """Run one element to its end; its output appended to its run directory's logs/local.out."""
    element = plan.elements[position]
    log = Path(element.run_dir) / LOCAL_LOG
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as out:
        out.write(f"diffscale: sweep element {element.index} on {'GPU ' + gpu if gpu else 'this machine'}\n")
        out.flush()
        try:
            rc = subprocess.run(element_argv(plan, element), cwd=element.run_dir, env=element_env(plan, position, gpu),
                                stdout=out, stderr=subprocess.STDOUT).returncode
        except OSError as exc:
            out.write(f"{exc}\n")
            rc = 127
        out.write(f"diffscale: command exited with {rc}\n")
    if rc == 0:
        return ElementState(element.index, "done", exit_code=0)
    from diffscale.studies.state import failure_reason

    return ElementState(element.index, "failed", failure_reason(Path(element.run_dir)), exit_code=rc)


def _todo(plan: SweepPlan) -> list[int]:
    recorded = read_states(plan.sweep_dir)
    todo = []
    for position, e in enumerate(plan.elements):
        row = ElementRecord(e.index, dict(e.values), e.run_dir)
        if element_state(row, recorded.get(e.index), None, False).state != "done":
            todo.append(position)
    return todo


def run_elements(plan: SweepPlan, slots: list[str | None]) -> int:
    """Every element not yet done, ``len(slots)`` at a time. Exit 0 when all are done, 1 otherwise."""
    todo = _todo(plan)
    print(f"sweep {plan.definition.name}: {len(plan.elements) - len(todo)} of {len(plan.elements)} element(s) "
          f"done; running {len(todo)} here, {len(slots)} at a time", flush=True)
    work: queue.Queue[int] = queue.Queue()
    for position in todo:
        work.put(position)
    lock = threading.Lock()
    failed: list[int] = []

    def worker(gpu: str | None) -> None:
        while True:
            try:
                position = work.get_nowait()
            except queue.Empty:
                return
            index = plan.elements[position].index
            with lock:
                record(plan.sweep_dir, ElementState(index, "running", f"here{' on GPU ' + gpu if gpu else ''}"))
            result = run_one(plan, position, gpu)
            with lock:
                record(plan.sweep_dir, result)
                if result.state == "failed":
                    failed.append(index)
                print(f"{plan.elements[position].label}: {result.state}"
                      f"{' -- ' + result.reason if result.reason else ''}", flush=True)

    threads = [threading.Thread(target=worker, args=(gpu,)) for gpu in slots]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failed:
        print(f"{len(failed)} element(s) failed: `diffscale sweep status {plan.sweep_dir}` says why; "
              f"`diffscale sweep run {plan.sweep_dir}` runs them again")
        return 1
    print(f"all {len(plan.elements)} element(s) done: diffscale sweep collect {plan.sweep_dir}")
    return 0
