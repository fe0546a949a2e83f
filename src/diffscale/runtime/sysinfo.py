"""The system a run runs on, as the report users attach to a question: GPUs (memory, compute
capability, NVLink/PCIe topology), CPU, RAM, the scheduler job and its limits, the versions of
the CUDA stack and libraries, and the environment variables that change how training runs.

:func:`collect` gathers it as plain data (kept in ``RUN_DIR/system.json`` by ``train``, shown by
``diffscale report``); :func:`markdown` renders it for ``diffscale env``. Works on CPU-only
machines and outside any job; nothing here needs a GPU or a scheduler.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

from diffscale.io.atomic import write_text

Rows = list[tuple[str, str]]

ENV_PREFIXES = ("CUDA_", "NCCL_", "TORCH", "PYTORCH_", "OMP_", "MKL_", "DIFFSCALE_", "HF_", "NVIDIA_",
                "MASTER_", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "PYTHONUNBUFFERED",
                "CUBLAS_", "CUDNN_", "TRITON_", "MLFLOW_", "WANDB_MODE", "WANDB_PROJECT")
_SECRET = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH", re.IGNORECASE)

SLURM_VARS = (("job id", "SLURM_JOB_ID"), ("job name", "SLURM_JOB_NAME"), ("partition", "SLURM_JOB_PARTITION"),
              ("account", "SLURM_JOB_ACCOUNT"), ("QOS", "SLURM_JOB_QOS"), ("nodes", "SLURM_JOB_NUM_NODES"),
              ("node list", "SLURM_JOB_NODELIST"), ("tasks", "SLURM_NTASKS"),
              ("tasks per node", "SLURM_NTASKS_PER_NODE"), ("CPUs per task", "SLURM_CPUS_PER_TASK"),
              ("CPUs on this node", "SLURM_CPUS_ON_NODE"), ("GPUs on this node", "SLURM_GPUS_ON_NODE"),
              ("GPUs per node", "SLURM_GPUS_PER_NODE"), ("job GPUs", "SLURM_JOB_GPUS"),
              ("memory per node (MB)", "SLURM_MEM_PER_NODE"), ("memory per CPU (MB)", "SLURM_MEM_PER_CPU"),
              ("restarts", "SLURM_RESTART_COUNT"))
SGE_VARS = (("job id", "JOB_ID"), ("job name", "JOB_NAME"), ("queue", "QUEUE"), ("slots", "NSLOTS"),
            ("hosts", "NHOSTS"), ("parallel environment", "PE"), ("PE host file", "PE_HOSTFILE"),
            ("project", "SGE_PROJECT"), ("task id", "SGE_TASK_ID"))


def _run(argv: list[str], timeout: float = 10.0) -> str | None:
    """A tool's output, or None when it is missing, fails or hangs."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _host_rows() -> tuple[Rows, Rows]:
    import psutil

    from diffscale.version import __version__

    host = [("host", socket.gethostname()), ("OS", platform.platform()), ("Python", platform.python_version()),
            ("diffscale", __version__)]
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    memory = psutil.virtual_memory()
    cpu = [("CPU model", _cpu_model()), ("physical cores", str(psutil.cpu_count(logical=False) or "?")),
           ("logical CPUs", str(os.cpu_count() or "?")), ("CPUs this process may use", str(usable)),
           ("RAM", f"{memory.total / 2**30:.1f} GiB ({memory.available / 2**30:.1f} GiB available)")]
    return host, cpu


def _gpu_possible() -> bool:
    """Whether this machine may have a GPU PyTorch can use: without one, ``env`` reports without
    importing torch (seconds on a login node). torch already loaded (``train``) is always asked."""
    import sys

    if "torch" in sys.modules or sys.platform == "darwin":  # darwin: Apple MPS needs torch to tell
        return True
    return bool(list(Path("/dev").glob("nvidia[0-9]*"))) or shutil.which("nvidia-smi") is not None


def _gpu_rows() -> Rows:
    if not _gpu_possible():
        return [("GPUs", "no GPU (no NVIDIA device or nvidia-smi on this machine)")]
    import torch

    if not torch.cuda.is_available():
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            return [("GPUs", "no NVIDIA GPU; Apple MPS is available")]
        return [("GPUs", "no GPU (CUDA is not available to PyTorch)")]
    rows = [("GPUs", str(torch.cuda.device_count()))]
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        rows.append((f"GPU {i}", f"{props.name}, {props.total_memory / 2**30:.1f} GiB, "
                                 f"compute capability {props.major}.{props.minor}, {props.multi_processor_count} SMs"))
    driver = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    if driver:
        rows.append(("NVIDIA driver", driver.splitlines()[0]))
    return rows


def _torch_rows() -> Rows:
    import torch

    rows = [("PyTorch", torch.__version__),
            ("CUDA (PyTorch built with)", str(torch.version.cuda or "none (CPU build)"))]
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    rows.append(("cuDNN", str(cudnn) if cudnn else "none"))
    try:
        nccl = torch.cuda.nccl.version() if torch.cuda.is_available() else None
    except Exception:  # a build without NCCL
        nccl = None
    rows.append(("NCCL", ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl or "none")))
    return rows


def _software_rows() -> Rows:
    import importlib.metadata

    if not _gpu_possible():
        try:
            torch_version = importlib.metadata.version("torch")
        except importlib.metadata.PackageNotFoundError:
            torch_version = "not installed"
        rows = [("PyTorch", torch_version), ("CUDA, cuDNN, NCCL", "not checked (no GPU on this machine)")]
    else:
        rows = _torch_rows()
    for package in ("diffusers", "numpy", "safetensors", "triton", "nvidia-ml-py", "wandb", "mlflow-skinny", "mlflow"):
        try:
            rows.append((package, importlib.metadata.version(package)))
        except importlib.metadata.PackageNotFoundError:
            continue
    return rows


def scheduler_rows(env: dict[str, str] | os._Environ[str] = os.environ) -> Rows:
    """The job this process runs in and its limits, from the scheduler's environment variables."""
    if "SLURM_JOB_ID" in env:
        rows = [("scheduler", "SLURM")] + [(label, env[var]) for label, var in SLURM_VARS if var in env]
        if env.get("SLURM_JOB_END_TIME", "").isdigit():
            end = datetime.datetime.fromtimestamp(int(env["SLURM_JOB_END_TIME"]))
            rows.append(("time limit ends", end.isoformat(timespec="seconds")))
        return rows
    if "JOB_ID" in env and ("SGE_ROOT" in env or "SGE_CELL" in env or "PE_HOSTFILE" in env):
        rows = [("scheduler", "Grid Engine")] + [(label, env[var]) for label, var in SGE_VARS if var in env]
        rows += [(f"resource {k[len('SGE_HGR_'):]}", v) for k, v in sorted(env.items()) if k.startswith("SGE_HGR_")]
        return rows
    return [("scheduler", "none (not inside a SLURM or Grid Engine job)")]


def env_rows(env: dict[str, str] | os._Environ[str] = os.environ) -> Rows:
    """Variables that change how training runs; anything that looks like a secret is left out."""
    return [(k, v) for k, v in sorted(env.items()) if k.startswith(ENV_PREFIXES) and not _SECRET.search(k)]


def collect() -> dict[str, Any]:
    """Everything above as plain data: ``{"collected_at", "sections": [{"title", "rows"}], "topology"}``."""
    host, cpu = _host_rows()
    sections = [("Host", host), ("GPUs", _gpu_rows()), ("CPU and memory", cpu), ("Scheduler job", scheduler_rows()),
                ("Software", _software_rows()), ("Environment", env_rows() or [("(none set)", "")])]
    return {"collected_at": datetime.datetime.now().isoformat(timespec="seconds"),
            "sections": [{"title": title, "rows": [list(r) for r in rows]} for title, rows in sections],
            "topology": _run(["nvidia-smi", "topo", "-m"])}


def write_system(path: Path) -> None:
    """Record the system in ``path`` (JSON); a failure to gather it never stops training."""
    try:
        facts = collect()
    except Exception as exc:  # an odd driver or /proc: the run matters more than its report
        facts = {"collected_at": datetime.datetime.now().isoformat(timespec="seconds"), "sections": [],
                 "topology": None, "error": f"{type(exc).__name__}: {exc}"}
    write_text(path, json.dumps(facts, indent=1))


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown(facts: dict[str, Any]) -> str:
    """The Markdown document of ``diffscale env``."""
    lines = [f"# System report ({facts.get('collected_at', '?')})", ""]
    for section in facts.get("sections", []):
        lines += [f"## {section['title']}", "", "| | |", "|---|---|"]
        lines += [f"| {_cell(k)} | {_cell(v)} |" for k, v in section["rows"]]
        lines.append("")
        if section["title"] == "GPUs":
            lines += ["### Topology (`nvidia-smi topo -m`)", ""]
            topology = facts.get("topology")
            lines += ["```", topology, "```", ""] if topology else ["not available (no nvidia-smi here)", ""]
    return "\n".join(lines)
