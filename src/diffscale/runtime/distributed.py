"""The process group, read from whichever launcher started us.

One process is simply the world-size-1 case: every caller uses the same
:class:`DistContext` API whether the run has one rank or 64. Launchers understood:

* ``torchrun``: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT.
  Grid Engine jobs use it too: their script reads PE_HOSTFILE (first host = master)
  and starts one torchrun per host with its node rank (diffscale.cluster.scripts.sge).
* SLURM tasks started by ``srun``: SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS,
  SLURM_NODEID, first host of SLURM_JOB_NODELIST, port derived from SLURM_JOB_ID.

Model code never imports this module: DDP is applied from the outside by the trainer.
"""

from __future__ import annotations

import datetime
import itertools
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

# Before any process group exists: this module's functions take ``group=group.WORLD`` as default
# arguments, which capture the group that exists when it is first imported (DDP imports it). Imported
# after init_process_group it would keep the group alive past destroy_process_group, and with it
# gloo's worker threads, which can then still be releasing a collective's tensors while the
# interpreter finalises: they need the GIL then, and the process aborts ("terminate called
# without an active exception").
import torch.distributed.nn.functional  # noqa: F401

from diffscale.errors import UserError

PORT_BASE = 20000
PORT_SPAN = 20000


def port_from_job_id(job_id: str | int) -> int:
    """A rendezvous port every task of one job derives alike, distinct between jobs."""
    digits = re.sub(r"\D", "", str(job_id)) or "0"
    return PORT_BASE + int(digits) % PORT_SPAN


_HOSTLIST_SEPARATORS = ", \t"


def _hostlist_tokens(spec: str) -> list[str]:
    """Split a hostlist at commas and blanks outside brackets, as SLURM's tokenizer does
    (``a[1,3],b`` is two tokens, not three)."""
    tokens: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in spec:
        if ch in _HOSTLIST_SEPARATORS and depth == 0:
            if current:
                tokens.append("".join(current))
                current = []
            continue
        depth += (ch == "[") - (ch == "]")
        current.append(ch)
    if current:
        tokens.append("".join(current))
    return tokens


def _range_values(body: str, token: str) -> list[str]:
    """``01-03,7`` -> ``01 02 03 7``: each number as wide as its range's first bound (SLURM's rule)."""
    values: list[str] = []
    for item in body.split(","):
        lo, dash, hi = item.partition("-")
        if not lo.isdigit() or (dash and (not hi.isdigit() or int(hi) < int(lo))):
            raise ValueError(f"'{token}' is not a SLURM hostlist ('{item}' is no number or range)")
        values += [f"{i:0{len(lo)}d}" for i in range(int(lo), int(hi if dash else lo) + 1)]
    return values


def expand_hostlist(spec: str) -> list[str]:
    """Expand a SLURM hostlist into host names, in SLURM's order.

    The forms SLURM documents: ``node1,node[2-5,12]``, ``tux[0-5,12,20-25]``, zero-padded
    ``gpu[001-016]``, and several bracket groups in one name (``rack[0-1]_blade[01-02]``,
    ``a[1-2]-b[01-02]``), which expand as a product with the first group varying slowest --
    as SLURM's hostlist.c expands the prefix's range around the last group. Raises
    ValueError on what SLURM would reject (``a[3-1]``, ``a[x]``).
    """
    hosts: list[str] = []
    for token in _hostlist_tokens(spec):
        parts = re.split(r"\[([^\[\]]*)\]", token)  # literal, range, literal, ..., literal
        if any(ch in part for part in parts[0::2] for ch in "[]"):
            raise ValueError(f"'{token}' is not a SLURM hostlist (unbalanced brackets)")
        choices = [[part] if i % 2 == 0 else _range_values(part, token) for i, part in enumerate(parts)]
        hosts += ["".join(combo) for combo in itertools.product(*choices)]
    return hosts


def slurm_hostnames(nodelist: str) -> list[str]:
    """Hosts of a SLURM hostlist: ``scontrol show hostnames`` where SLURM is installed (SLURM
    itself is the authority on its syntax), :func:`expand_hostlist` where it is not."""
    if shutil.which("scontrol"):
        try:
            proc = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                                  timeout=30, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError):
            proc = None
        if proc is not None and proc.returncode == 0 and proc.stdout.split():
            return proc.stdout.split()
    return expand_hostlist(nodelist)


def _first_host(nodelist: str, hostnames: Callable[[str], list[str]]) -> str:
    try:
        hosts = hostnames(nodelist)
    except ValueError as exc:
        raise UserError(f"cannot read the job's node list: {exc}",
                        "export MASTER_ADDR in the job script (diffscale's scripts take the first line of "
                        "`scontrol show hostnames \"$SLURM_JOB_NODELIST\"`)") from exc
    return hosts[0] if hosts else "127.0.0.1"


@dataclass(frozen=True)
class LaunchInfo:
    """Who this process is in the job, as told by the launcher's environment."""

    launcher: str
    """``single``, ``torchrun`` or ``slurm``."""
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    master_source: str = "single process"
    agent_store: bool = False
    """torchrun's agent already serves the TCP store at MASTER_ADDR:MASTER_PORT; every rank is a client."""
    attempt: int = 0
    """torchrun restart count; keys in a reused agent store are namespaced by it."""


def detect_launch(env: Mapping[str, str] | None = None,
                  hostnames: Callable[[str], list[str]] = slurm_hostnames) -> LaunchInfo:
    """Read the launcher's environment (pass ``env`` to test recorded ones). ``hostnames``
    expands a SLURM node list; it runs only when a SLURM job did not export MASTER_ADDR."""
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        world = int(env["WORLD_SIZE"])
        local_world = int(env.get("LOCAL_WORLD_SIZE", world))
        rank = int(env["RANK"])
        return LaunchInfo(
            launcher="torchrun",
            rank=rank,
            local_rank=int(env.get("LOCAL_RANK", 0)),
            world_size=world,
            local_world_size=local_world,
            node_rank=int(env.get("GROUP_RANK", rank // max(local_world, 1))),
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=int(env.get("MASTER_PORT", 29500)),
            master_source="MASTER_ADDR/MASTER_PORT from torchrun",
            agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true",
            attempt=int(env.get("TORCHELASTIC_RESTART_COUNT", "0") or 0),
        )
    # srun sets SLURM_STEP_ID; the batch script itself (no srun) must stay one process.
    if "SLURM_PROCID" in env and "SLURM_STEP_ID" in env and int(env.get("SLURM_NTASKS", "1")) > 1:
        world = int(env["SLURM_NTASKS"])
        nodes = int(env.get("SLURM_JOB_NUM_NODES", env.get("SLURM_NNODES", "1")))
        tasks_per_node = env.get("SLURM_NTASKS_PER_NODE", "")
        counted = re.match(r"\d+", tasks_per_node)
        local_world = int(counted.group()) if counted else max(world // max(nodes, 1), 1)
        if "MASTER_ADDR" in env:
            addr, source = env["MASTER_ADDR"], "MASTER_ADDR set in the job"
        else:
            nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST", "")
            addr = _first_host(nodelist, hostnames) if nodelist else "127.0.0.1"
            source = "first host of SLURM_JOB_NODELIST"
        if "MASTER_PORT" in env:
            port = int(env["MASTER_PORT"])
        else:
            port = port_from_job_id(env.get("SLURM_JOB_ID", "0"))
            source += ", port from SLURM_JOB_ID"
        return LaunchInfo(
            launcher="slurm",
            rank=int(env["SLURM_PROCID"]),
            local_rank=int(env.get("SLURM_LOCALID", 0)),
            world_size=world,
            local_world_size=local_world,
            node_rank=int(env.get("SLURM_NODEID", 0)),
            master_addr=addr,
            master_port=port,
            master_source=source,
        )
    return LaunchInfo(launcher="single")


@dataclass
class DistContext:
    """The process group of this run; world size 1 needs no process group at all."""

    info: LaunchInfo
    device: torch.device
    backend: str = ""
    _initialised: bool = field(default=False, repr=False)
    _before_shutdown: list[Callable[[], None]] = field(default_factory=list, repr=False)

    @property
    def rank(self) -> int:
        return self.info.rank

    @property
    def world_size(self) -> int:
        return self.info.world_size

    @property
    def local_rank(self) -> int:
        return self.info.local_rank

    @property
    def is_main(self) -> bool:
        return self.info.rank == 0

    @property
    def distributed(self) -> bool:
        return self.info.world_size > 1

    def barrier(self) -> None:
        if self._initialised:
            if self.backend == "nccl":
                dist.barrier(device_ids=[self.device.index or 0])
            else:
                dist.barrier()

    def all_mean(self, tensor: torch.Tensor) -> torch.Tensor:
        """Average a tensor over ranks (identity for one process)."""
        if self._initialised:
            tensor = tensor.clone()
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
            tensor /= self.world_size
        return tensor

    def broadcast(self, tensor: torch.Tensor) -> torch.Tensor:
        """Rank 0's ``tensor`` on every rank (each rank passes one of the same shape and dtype),
        on the device it came from. Identity for one process."""
        if not self._initialised:
            return tensor
        on = tensor.to(self.device).contiguous()  # NCCL moves CUDA tensors only, gloo CPU ones
        dist.broadcast(on, src=0)
        return on.to(tensor.device)

    def any_true(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is true on any rank (used for stop signals)."""
        if not self._initialised:
            return flag
        value = torch.tensor([1.0 if flag else 0.0], device=self.device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return bool(value.item() > 0)

    def gather_rows(self, rows: torch.Tensor, per_rank: int) -> torch.Tensor:
        """Concatenate every rank's rows (at most ``per_rank`` each; the last ranks may hold
        fewer) in rank order, on the CPU. Identity for one process."""
        if not self._initialised:
            return rows.cpu()
        padded = torch.zeros((per_rank,) + tuple(rows.shape[1:]), dtype=rows.dtype, device=self.device)
        padded[:rows.shape[0]] = rows.to(self.device)
        counts = torch.tensor([rows.shape[0]], device=self.device)
        all_counts = [torch.zeros_like(counts) for _ in range(self.world_size)]
        parts = [torch.empty_like(padded) for _ in range(self.world_size)]
        dist.all_gather(all_counts, counts)
        dist.all_gather(parts, padded)
        return torch.cat([p[:int(n.item())].cpu() for p, n in zip(parts, all_counts, strict=True)])

    def before_shutdown(self, release: Callable[[], None]) -> None:
        """Call ``release`` before the process group goes: a CUDA graph that recorded NCCL
        collectives holds its communicator, whose destruction then waits for it for ever."""
        self._before_shutdown.append(release)

    def shutdown(self) -> None:
        while self._before_shutdown:
            self._before_shutdown.pop()()
        if self._initialised:
            dist.destroy_process_group()
            self._initialised = False


def _hang_hint(info: LaunchInfo) -> str:
    if info.launcher == "slurm":
        return ("a multi-node SLURM job needs one task per GPU started by srun "
                "(#SBATCH --ntasks-per-node = GPUs per node, and `srun` before the command)")
    return ("every host must start its launcher: torchrun --nnodes N --node_rank K on each host "
            "(Grid Engine: one qrsh -inherit per host from PE_HOSTFILE); check MASTER_ADDR/MASTER_PORT "
            "reach the first host")


def init_distributed(info: LaunchInfo, device: torch.device, *, join_timeout_s: float,
                     collective_timeout_s: float) -> DistContext:
    """Join the process group, or fail with a diagnosis when not every rank arrives in time."""
    ctx = DistContext(info=info, device=device)
    if info.world_size == 1:
        return ctx
    backend = "nccl" if device.type == "cuda" else "gloo"
    store_timeout = datetime.timedelta(seconds=join_timeout_s)
    try:
        store = dist.TCPStore(
            info.master_addr, info.master_port, info.world_size,
            is_master=info.rank == 0 and not info.agent_store,
            timeout=store_timeout, wait_for_workers=False, use_libuv=False,
        )
    except (RuntimeError, OSError) as exc:
        raise UserError(
            f"rank {info.rank} could not reach the rendezvous at {info.master_addr}:{info.master_port} "
            f"({info.master_source}): {str(exc).splitlines()[0]}",
            _hang_hint(info),
        ) from exc
    # Count arrivals ourselves so a hang names how many ranks joined.
    key = f"diffscale/joined/{info.attempt}"
    store.add(key, 1)
    deadline = time.monotonic() + join_timeout_s
    joined = int(store.add(key, 0))
    while joined < info.world_size:
        if time.monotonic() > deadline:
            raise UserError(
                f"only {joined} of {info.world_size} ranks joined after {join_timeout_s:.0f} s "
                f"(launcher: {info.launcher}, master {info.master_addr}:{info.master_port})",
                _hang_hint(info),
            )
        time.sleep(0.05)
        joined = int(store.add(key, 0))
    bind: dict[str, Any] = {"device_id": device} if backend == "nccl" else {}
    dist.init_process_group(
        backend=backend, store=dist.PrefixStore(f"diffscale/pg/{info.attempt}", store),
        rank=info.rank, world_size=info.world_size,
        timeout=datetime.timedelta(seconds=collective_timeout_s),
        **bind,
    )
    ctx.backend = backend
    ctx._initialised = True
    return ctx


def alone_as_rank_zero(info: LaunchInfo, device: torch.device) -> DistContext:
    """Rank 0 of ``info.world_size`` ranks in a process group of this process alone: a process that
    builds one rank's step of a distributed run by itself (a background compile) wraps the network
    in DDP as every rank does, and its collectives return at once. Only what one rank's step calls
    is meant to run in it (``all_mean`` would divide by the run's world size, ``gather_rows`` fail)."""
    ctx = DistContext(info=info, device=device)
    if info.world_size == 1:
        return ctx
    backend = "nccl" if device.type == "cuda" else "gloo"
    bind: dict[str, Any] = {"device_id": device} if backend == "nccl" else {}
    dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1, **bind)
    ctx.backend = backend
    ctx._initialised = True
    return ctx
