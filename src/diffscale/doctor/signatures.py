"""Failure signatures: a table of small typed rules, each a pattern, a cause and a fix.

A :class:`TextRule` matches log and scheduler-record text (regular expressions; named
groups fill the cause's ``{placeholders}``). A :class:`RecordRule` looks at numeric
records (metrics.jsonl lines, benchmark JSON). The fix names the config change or flag
that removes the cause -- the words a user acts on.

Message texts come from the tools that print them: SLURM 22.05 slurmstepd / srun /
slurmctld, Grid Engine qacct, PyTorch (c10d TCPStore, ProcessGroupNCCL watchdog,
DataLoader, CUDA caching allocator) and diffscale's own errors.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence


@dataclass(frozen=True)
class Finding:
    """One recognised signature: why the job failed and what to change."""

    rule: str
    title: str
    cause: str
    fix: str
    origin: str
    """Where the evidence was read (a file path, ``scontrol show job 12``, ...)."""
    evidence: str
    """The matching line (or a short summary for record rules)."""


def _fill(template: str, groups: Mapping[str, Any]) -> str:
    """Fill ``{name}`` from the match; a group the matching pattern lacks reads "?"."""
    return template.format_map(defaultdict(lambda: "?", {k: v for k, v in groups.items() if v is not None}))


@dataclass(frozen=True)
class TextRule:
    name: str
    title: str
    patterns: tuple[str, ...]
    """Any of these (regex, searched line by line) marks the signature."""
    cause: str
    fix: str
    requires: tuple[str, ...] = ()
    """Every one of these must also occur somewhere in the same text (e.g. qacct's exit_status next to failed)."""
    flags: int = 0
    _compiled: tuple[re.Pattern, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_compiled", tuple(re.compile(p, self.flags) for p in self.patterns))

    def match(self, origin: str, text: str) -> Finding | None:
        if any(not re.search(r, text, self.flags | re.M) for r in self.requires):
            return None
        for line in text.splitlines():
            for pattern in self._compiled:
                m = pattern.search(line)
                if m:
                    groups = m.groupdict()
                    return Finding(self.name, self.title, _fill(self.cause, groups), _fill(self.fix, groups),
                                   origin, line.strip()[:300])
        return None


@dataclass(frozen=True)
class RecordRule:
    name: str
    title: str
    test: Callable[[Sequence[Mapping[str, Any]]], Mapping[str, Any] | None]
    """Records of one file -> values for the templates when the signature is present, else None."""
    cause: str
    fix: str
    evidence: str

    def match(self, origin: str, records: Sequence[Mapping[str, Any]]) -> Finding | None:
        values = self.test(records)
        if values is None:
            return None
        return Finding(self.name, self.title, _fill(self.cause, values), _fill(self.fix, values), origin,
                       _fill(self.evidence, values))


# ----------------------------------------------------------------------------- text rules

HOST_OOM = "host-oom"

TEXT_RULES: tuple[TextRule, ...] = (
    TextRule(
        HOST_OOM, "host memory exhausted (OOM kill)",
        (r"Detected (?P<n>\d+) oom[-_]kill event", r"oom[-_]kill event", r"JobState=OUT_OF_MEMORY",
         r"\|OUT_OF_MEMORY\|", r"Out of memory: Killed process", r"Memory cgroup out of memory"),
        "the job used more host RAM than it was given and the kernel killed it (oom-kill)",
        "ask for more host memory (diffscale submit --mem GiB, or #SBATCH --mem), or use less of it: fewer "
        "ranks per node (--gpus-per-node, with more --nodes; each rank holds its own copy of the data), fewer "
        "images (--set data.max_items=N), or a smaller preset or train.batch_per_gpu",
    ),
    TextRule(
        "dataloader-killed", "a data-loader worker was killed",
        (r"DataLoader worker \(pid[^)]*\) (?:exited unexpectedly|is killed by signal: (?P<sig>[\w ]+))",),
        "a data-loader worker process died ({sig}); a worker killed by SIGKILL ('Killed') is almost always "
        "the host running out of memory",
        "start fewer loader workers (your DataLoader's num_workers; diffscale bench: --plain-workers), each "
        "of which holds a copy of the data, or ask for more host memory (diffscale submit --mem GiB)",
    ),
    TextRule(
        "cuda-oom", "GPU memory exhausted (CUDA out of memory)",
        (r"CUDA out of memory\.? Tried to allocate (?P<size>[\d.]+ [KMGT]iB)", r"CUDA out of memory",
         r"torch\.(?:cuda\.)?OutOfMemoryError"),
        "the GPU ran out of memory (tried to allocate {size})",
        "lower train.batch_per_gpu and raise train.grad_accum to keep the effective batch "
        "(e.g. --set train.batch_per_gpu=32 --set train.grad_accum=2), or use --precision bf16",
    ),
    TextRule(
        "nccl-timeout", "a collective timed out (NCCL watchdog)",
        (r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(?P<seq>\d+), OpType=(?P<op>\w+)"
         r".*?Timeout\(ms\)=(?P<ms>\d+)",
         r"Watchdog caught collective operation timeout", r"NCCL watchdog thread terminated",
         r"ProcessGroupNCCL.*[Tt]imeout at NCCL work", r"NCCL communicator was aborted"),
        "one rank waited {ms} ms in a collective ({op}, #{seq}) that another rank never joined: a rank "
        "hung, crashed, or runs different code (e.g. work only on rank 0 while the others wait)",
        "look for the first error of the rank that stopped (diffscale logs RUN_DIR); if a slow step is "
        "expected (first compile, a long save), raise runtime.collective_timeout_s; check the network "
        "between nodes (NCCL_DEBUG=INFO)",
    ),
    TextRule(
        "rendezvous-short", "fewer ranks joined than expected",
        (r"only (?P<joined>\d+) of (?P<world>\d+) ranks joined",
         r"(?P<joined>\d+)/(?P<world>\d+) clients joined"),
        "only {joined} of {world} ranks reached the rendezvous: the others were never started, or started "
        "with another MASTER_ADDR/MASTER_PORT",
        "start one process per GPU on every node (SLURM: #SBATCH --ntasks-per-node = GPUs per node and "
        "`srun` before the command; torchrun: --nnodes/--node_rank on each host); `diffscale plan` shows "
        "a script that does; raise runtime.join_timeout_s only if nodes start slowly",
    ),
    TextRule(
        "srun-missing", "ranks not started by srun",
        (r"srun: (?:command )?not found",),
        "the job ran the training without srun, so only one process started where one per GPU was needed",
        "start the command with `srun` inside the batch script (diffscale submit writes such a script)",
    ),
    TextRule(
        "tasks-gpus-mismatch", "tasks per node do not match GPUs per node",
        (r"local rank (?P<rank>\d+) has no GPU: only (?P<gpus>\d+) visible",
         r"invalid device ordinal", r"CUDA error: invalid device ordinal"),
        "more processes were started on a node than it has GPUs visible (local rank {rank}, {gpus} GPUs)",
        "make tasks per node equal GPUs per node (#SBATCH --ntasks-per-node=G with --gpus-per-node=G; "
        "diffscale submit --gpus-per-node G does both)",
    ),
    TextRule(
        "more-processors", "step asks for more CPUs than the allocation",
        (r"More processors requested than permitted",),
        "an srun step asked for more tasks x CPUs than the job's allocation holds",
        "give srun the job's own --ntasks-per-node and --cpus-per-task (srun >= 22.05 does not inherit "
        "--cpus-per-task), or ask the job for more CPUs; `diffscale plan` shows a consistent script",
    ),
    TextRule(
        "slurm-time-limit", "SLURM time limit reached",
        (r"\*\*\* JOB (?P<job>\d+) ON (?P<node>\S+) CANCELLED AT \S+ DUE TO TIME LIMIT",
         r"CANCELLED AT \S+ DUE TO TIME LIMIT", r"JobState=TIMEOUT", r"\|TIMEOUT\|"),
        "the job reached its time limit and SLURM killed it before it checkpointed",
        "submit with diffscale submit (it adds --signal=B:USR2@LEAD and --requeue, and the run checkpoints "
        "and continues in the next job); with your own script, add #SBATCH --signal=B:USR2@120 "
        "and resume with --resume auto, or ask for more --time",
    ),
    TextRule(
        "sge-h-rt", "Grid Engine h_rt limit reached",
        (r"^failed\s+37\b", r"qmaster enforced h_rt"),
        "the job reached its h_rt limit and Grid Engine killed it (qacct: failed 37, exit_status 137)",
        "submit with diffscale submit (it asks for a soft limit -l s_rt before h_rt; on its SIGUSR1 the run "
        "checkpoints and continues in a new job held on this one); with your own script, add "
        "#$ -l s_rt=<h_rt minus a few minutes>, checkpoint on SIGUSR1 and resubmit, or ask for a longer -l h_rt",
        requires=(r"^exit_status\s+137\b",),
    ),
    TextRule(
        "sge-h-rt-checkpointed", "checkpointed at h_rt, but not rescheduled",
        (r"^failed\s+37\b",),
        "the run checkpointed on the -notify warning and exited 99, but the job had already reached h_rt; "
        "Grid Engine records that as failed 37 and does not reschedule it",
        "submit again to continue from the checkpoint (diffscale submit ... resumes); scripts written by "
        "this diffscale ask for a soft limit (-l s_rt < h_rt: SIGUSR1 before h_rt) and continue in a new job",
        requires=(r"^exit_status\s+99\b",),
    ),
    TextRule(
        "nonfinite-stop", "the loss stayed non-finite (NaN/Inf)",
        (r"the loss stayed non-finite at step (?P<step>\d+)",
         r"the loss was non-finite for (?P<n>\d+) steps in a row at step (?P<step>\d+)"),
        "the loss was NaN/Inf at step {step} and rolling back did not help",
        "lower optim.lr (e.g. --set optim.lr=1e-4), keep optim.grad_clip on (1.0), use --precision bf16 or "
        "fp32 instead of fp16, and check the data for NaNs",
    ),
    TextRule(
        "nonfinite-rollback", "non-finite loss, rolled back",
        (r"non-finite loss for (?P<n>\d+) steps in a row at step (?P<step>\d+): rolled back to step (?P<to>\d+)",),
        "the loss was NaN/Inf for {n} steps in a row at step {step}; the run rolled back to step {to} with "
        "the learning rate halved",
        "if it recurs, lower optim.lr and keep optim.grad_clip on; use --precision bf16 instead of fp16",
    ),
    TextRule(
        "nan-loss", "NaN loss",
        (r"\bloss[ =:]+nan\b", r"Loss is nan", r"loss is NaN"),
        "the loss became NaN",
        "lower optim.lr, keep optim.grad_clip on (1.0), use --precision bf16 or fp32 instead of fp16",
        flags=re.I,
    ),
)


# ----------------------------------------------------------------------------- record rules

LOW_GPU_UTIL = 50.0       # percent
DATA_WAIT_SHARE = 0.3     # share of step time spent waiting for the next batch


def _nonfinite(records: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    counted = [r for r in records if isinstance(r.get("nonfinite_skipped"), (int, float))]
    if not counted or counted[-1]["nonfinite_skipped"] <= 0:
        return None
    first = next(r for r in counted if r["nonfinite_skipped"] > 0)
    return {"n": int(counted[-1]["nonfinite_skipped"]), "first": first.get("step", "?"),
            "last": counted[-1].get("step", "?")}


def _data_bound(records: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    for r in records:
        util, wait = r.get("gpu_util"), r.get("data_wait_share")
        if isinstance(util, (int, float)) and isinstance(wait, (int, float)) and util < LOW_GPU_UTIL \
                and wait > DATA_WAIT_SHARE:
            return {"util": f"{util:.0f}", "wait": f"{wait:.0%}", "what": r.get("recipe") or r.get("preset") or "run"}
    return None


RECORD_RULES: tuple[RecordRule, ...] = (
    RecordRule(
        "nonfinite-skipped", "non-finite steps skipped", _nonfinite,
        "{n} optimizer steps had a non-finite loss or gradient and were skipped (first by step {first})",
        "a few are harmless with fp16; many mean the learning rate is too high: lower optim.lr, keep "
        "optim.grad_clip on, prefer --precision bf16",
        "metrics.jsonl: nonfinite_skipped={n} at step {last}",
    ),
    RecordRule(
        "data-bound", "GPU idle, waiting for data", _data_bound,
        "the GPU was busy only {util}% of the time and {wait} of each step waited for data ({what})",
        "use --recipe fast (data on the GPU, as diffscale train keeps it) or, for a CPU loader, more loader "
        "workers (diffscale bench --plain-workers, your DataLoader's num_workers); keep the data on a local disk",
        "gpu_util={util}%, data_wait_share={wait}",
    ),
)


def match_text(origin: str, text: str) -> list[Finding]:
    return [f for rule in TEXT_RULES if (f := rule.match(origin, text))]


def match_records(origin: str, records: Sequence[Mapping[str, Any]]) -> list[Finding]:
    return [f for rule in RECORD_RULES if (f := rule.match(origin, records))]
