"""``diffscale cluster discover``: write a profile from what the live scheduler reports.

SLURM: ``scontrol show partition -o`` and ``scontrol show node -o`` (sinfo's columns are
summaries; scontrol gives every node's CPUs, memory and GRES). Grid Engine: ``qconf -sql``
/ ``-sq Q`` (queues: slots, h_rt, notify, PEs), ``-spl`` / ``-sp PE`` (allocation rule,
control_slaves), ``-sc`` (is ``gpus`` consumable, per slot or per job), ``-sel`` / ``-se H``
(GPUs, cores and memory of each host).

A partition's figures are the smallest over its nodes, so a job planned against them
fits any node the scheduler may pick. The parsers are pure (captured outputs are tested).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import TypedDict

from diffscale.cluster.profiles.types import ClusterProfile, GpuRequest, GpuScope, Partition, SchedulerKind, SgeSettings
from diffscale.cluster.scripts.timefmt import parse_duration
from diffscale.runtime.job_end import parse_scontrol_line

Runner = Callable[[Sequence[str]], str]


def _min(values: list[int]) -> int | None:
    return min(values) if values else None


def _gres_gpus(gres: str) -> tuple[int, str | None]:
    """``gpu:2`` / ``gpu:a100:4(S:0-1)`` / ``gpu:a100:2,gpu:v100:2`` -> (count, type)."""
    total, kinds = 0, set()
    for item in gres.split(","):
        parts = re.sub(r"\(.*?\)", "", item).split(":")
        if parts[0] != "gpu" or len(parts) < 2:
            continue
        count = parts[-1]
        if count.isdigit():
            total += int(count)
            if len(parts) == 3:
                kinds.add(parts[1])
    return total, (kinds.pop() if len(kinds) == 1 else None)


def slurm_profile(name: str, partitions_text: str, nodes_text: str) -> ClusterProfile:
    nodes = {}
    for line in nodes_text.splitlines():
        if line.startswith("NodeName="):
            fields = parse_scontrol_line(line)
            nodes[fields["NodeName"]] = fields
    parts = []
    default = None
    for line in partitions_text.splitlines():
        if not line.startswith("PartitionName="):
            continue
        f = parse_scontrol_line(line)
        pname = f["PartitionName"]
        members = [n for n in nodes.values() if pname in n.get("Partitions", "").split(",")]
        cpus = [int(n["CPUTot"]) for n in members if n.get("CPUTot", "").isdigit()]
        mems = [int(n["RealMemory"]) / 1024 for n in members if n.get("RealMemory", "").isdigit()]
        gres = [_gres_gpus(n.get("Gres", "")) for n in members]
        gpus = _min([g for g, _ in gres])
        types = {t for _, t in gres if t}
        # a job never gets more nodes than the partition holds, whatever MaxNodes says
        limits = [int(v) for v in (f.get("MaxNodes", ""), f.get("TotalNodes", "")) if v.isdigit()]
        if f.get("Default") == "YES":
            default = pname
        note = None if f.get("State", "UP") == "UP" else f"state {f.get('State')} when discovered"
        parts.append(Partition(
            name=pname,
            submit_name=pname,
            gpus_per_node=int(gpus) if gpus is not None else None,
            gpu_type=types.pop() if len(types) == 1 else None,
            gres_type=None,
            cpus_per_node=min(cpus) if cpus else None,
            mem_per_node_gb=round(min(mems), 1) if mems else None,
            max_time_s=parse_duration(f.get("MaxTime", "UNLIMITED"), what="MaxTime"),
            # a job without --time gets DefaultTime, or MaxTime where there is none
            default_time=f.get("MaxTime", "UNLIMITED") if f.get("DefaultTime", "NONE") == "NONE" else f["DefaultTime"],
            max_nodes=min(limits) if limits else None,
            gpu_request=GpuRequest.GPUS_PER_NODE,
            note=note,
        ))
    return ClusterProfile(name=name, title=f"{name} (discovered)", scheduler=SchedulerKind.SLURM,
                          partitions=tuple(parts), default_partition=default,
                          docs=("written by `diffscale cluster discover` from scontrol show partition/node",))


def parse_qconf_block(text: str) -> dict[str, str]:
    """``key   value`` lines (``qconf -sq/-sp/-se``), continuation lines joined."""
    fields: dict[str, str] = {}
    key = None
    for line in text.splitlines():
        if not line.strip():
            continue
        if line[0].isspace() and key:
            fields[key] += " " + line.strip().rstrip("\\").strip()
            continue
        parts = line.split(None, 1)
        key = parts[0]
        fields[key] = parts[1].rstrip("\\").strip() if len(parts) > 1 else ""
    return fields


def _kv_list(text: str) -> dict[str, str]:
    """``gpus=2,mem_total=7.7G`` -> dict (NONE -> empty)."""
    out = {}
    for item in re.split(r"[,\s]+", text or ""):
        if "=" in item:
            k, v = item.split("=", 1)
            out[k] = v
    return out


def _mem_gb(value: str) -> float | None:
    match = re.fullmatch(r"([\d.]+)([KMGT]?)", value.strip())
    if not match:
        return None
    scale = {"": 1e-9, "K": 1 / 1024 ** 2, "M": 1 / 1024, "G": 1.0, "T": 1024.0}[match.group(2)]
    return round(float(match.group(1)) * scale, 1)


class _Host(TypedDict):
    gpus: int
    cpus: int | None
    mem: float | None


def sge_profile(name: str, run: Runner) -> ClusterProfile:
    queues = [q for q in run(["qconf", "-sql"]).split() if q]
    pes = {pe: parse_qconf_block(run(["qconf", "-sp", pe])) for pe in run(["qconf", "-spl"]).split() if pe}
    complexes = [line.split() for line in run(["qconf", "-sc"]).splitlines() if line and not line.startswith("#")]
    gpu_resource, scope = None, GpuScope.JOB
    for cols in complexes:
        if len(cols) >= 6 and cols[0] in ("gpus", "gpu") and cols[5] in ("YES", "JOB", "HOST"):
            gpu_resource = cols[0]
            scope = {"YES": GpuScope.SLOT, "JOB": GpuScope.JOB, "HOST": GpuScope.HOST}[cols[5]]
            break
    hosts: dict[str, _Host] = {}
    for host in run(["qconf", "-sel"]).split():
        block = parse_qconf_block(run(["qconf", "-se", host]))
        values = _kv_list(block.get("complex_values", ""))
        load = _kv_list(block.get("load_values", ""))
        hosts[host] = {
            "gpus": int(values[gpu_resource]) if gpu_resource and values.get(gpu_resource, "").isdigit() else 0,
            "cpus": int(load["num_proc"]) if load.get("num_proc", "").isdigit() else None,
            "mem": _mem_gb(load["mem_total"]) if "mem_total" in load else None,
        }
    single = multi = None
    for pe, f in pes.items():
        rule = f.get("allocation_rule", "")
        if rule == "$pe_slots" and single is None:
            single = pe
        elif rule in ("$fill_up", "$round_robin") and f.get("control_slaves", "").upper() == "TRUE" and multi is None:
            multi = pe
    parts = []
    notify = None
    for queue in queues:
        q = parse_qconf_block(run(["qconf", "-sq", queue]))
        members = [h for h in hosts if h in q.get("hostlist", "") or q.get("hostlist", "") in ("@allhosts",)]
        members = members or list(hosts)
        slot_numbers = [int(x) for x in re.findall(r"(?:^|[,=\s])(\d+)(?=[,\]\s]|$)", q.get("slots", ""))]
        cpus = [c for h in members if (c := hosts[h]["cpus"])]
        if slot_numbers:
            cpus = [min(c, max(slot_numbers)) for c in cpus] or [max(slot_numbers)]
        gpus = [hosts[h]["gpus"] for h in members]
        mems = [m for h in members if (m := hosts[h]["mem"])]
        h_rt = q.get("h_rt", "INFINITY")
        notify = notify or parse_duration(q["notify"], what="notify") if q.get("notify") else notify
        parts.append(Partition(
            name=queue.replace("@", "-"),
            submit_name=queue,
            gpus_per_node=min(gpus) if gpus else None,
            gpu_type=None,
            cpus_per_node=min(cpus) if cpus else None,
            mem_per_node_gb=min(mems) if mems else None,
            max_time_s=None if h_rt.upper() == "INFINITY" else parse_duration(h_rt, what="h_rt"),
            default_time="UNLIMITED" if h_rt.upper() == "INFINITY" else h_rt,  # a job without -l h_rt gets the queue's
            max_nodes=len(members) or None,  # a job spans at most the queue's hosts
        ))
    sge = SgeSettings(pe_single_host=single, pe_multi_host=multi, gpu_resource=gpu_resource or "gpus", gpu_scope=scope,
                      notify_s=notify)
    return ClusterProfile(name=name, title=f"{name} (discovered)", scheduler=SchedulerKind.SGE,
                          partitions=tuple(parts), default_partition=parts[0].name if parts else None, sge=sge,
                          docs=("written by `diffscale cluster discover` from qconf",))


def discover(name: str, kind: SchedulerKind, run: Runner) -> ClusterProfile:
    if kind is SchedulerKind.SLURM:
        return slurm_profile(name, run(["scontrol", "show", "partition", "-o"]),
                             run(["scontrol", "show", "node", "-o"]))
    return sge_profile(name, run)
