"""Failure signatures of the job around the training: memory and time limits, how ranks were
started, submission refusals, the node's disk and ports, and the job's Python environment.

Message texts come from the tools that print them: SLURM 22.05 slurmstepd / srun / sbatch /
slurmctld, Grid Engine qsub / qacct, the Linux kernel, CPython and PyTorch's c10d TCPStore.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from diffscale.doctor.rules import TextRule

HOST_OOM = "host-oom"

_SUBMIT_ADVICE = (
    # (words of the refusal, lower case; first match wins) -> what to change
    ("policy", "stay within the account's and QOS's limits: fewer GPUs or nodes, or a shorter --time "
               "(`sacctmgr show qos` lists the limits)"),
    ("account", "pass --account with an account you belong to (SLURM: `sacctmgr show assoc user=$USER "
                "format=account,partition,qos` lists them; the pair account/partition must be allowed)"),
    ("project", "pass --account with a Grid Engine project you belong to (`qconf -sprjl` lists projects)"),
    ("partition", "pass --partition with a partition of the profile that exists for you (`sinfo -s` lists "
                  "them), or fix the profile's submit_name"),
    ("queue", "fix the profile's submit_name for that partition (`qconf -sql` lists the queues)"),
    ("qos", "pass --qos with a QOS the partition allows for your account (`sacctmgr show assoc user=$USER "
            "format=account,partition,qos`)"),
    ("gres", "fix the profile's gres_type / gpu_request (`sinfo -o \"%P %G\"` shows each partition's GPUs)"),
    ("feature", "fix the profile's constraint (`sinfo -o \"%P %f\"` shows the node features)"),
    ("time limit", "ask for a --time within the partition's limit (`sinfo -o \"%P %l\"`), or leave --time out "
                   "so plan splits the run into segments"),
    ("node configuration", "ask for no more GPUs, CPUs or memory per node than a node of the partition has "
                           "(`diffscale plan` checks this against the profile)"),
    ("resource", "drop or fix the resource request the site does not know (the profile's resources)"),
)


def _submit_advice(values: Mapping[str, str], lines: Sequence[str], index: int) -> Mapping[str, str]:
    why = (values.get("why") or "").lower()
    advice = next((fix for words, fix in _SUBMIT_ADVICE if words in why),
                  "change the request the message names; `diffscale plan` prints the script with its checks")
    return {"advice": advice}


def _disk(values: Mapping[str, str], lines: Sequence[str], index: int) -> Mapping[str, str]:
    quota = "quota" in lines[index].lower() or values.get("errno") == "122"
    where = f" ({values['path']})" if values.get("path") else ""
    return {"what": ("the disk quota was exceeded" if quota else "the file system ran out of space") + where}


def _port(values: Mapping[str, str], lines: Sequence[str], index: int) -> Mapping[str, str]:
    return {"port_text": f"port {values['port']}" if values.get("port") else "its port"}


RANK_KILLED = "rank-killed"
_SIGNALS = {"Killed": "SIGKILL", "Terminated": "SIGTERM"}
_STEP_ENDED = re.compile(r"tasks? [\d,-]+: Exited with exit code|srun: (?:Terminating|forcing job termination)|"
                         r"\*\*\* (?:STEP|JOB) \S+ .*CANCELLED")
_RANK_EXITED = re.compile(r"exitcode\s*:\s*[1-9]")
_ROOT_CAUSE = "Root Cause (first observed failure)"


def _killed_rank(values: Mapping[str, str], lines: Sequence[str], index: int) -> Mapping[str, str] | None:
    """Who was killed, by what -- unless something ended first (a rank's own exit, a cancelled step:
    then this kill is the launcher ending the others, not the cause). torchrun lists the workers it
    ended itself, or that ended after the first, under "Failures:" (before the root cause, in any
    order: a rank whose peer was killed can exit 1 there) and the one that ended first under "Root
    Cause": only that one counts, whatever its "Failures:" list holds."""
    before = lines[:index]
    if any(_STEP_ENDED.search(line) for line in before):
        return None
    if values.get("task") is not None:
        if any(_RANK_EXITED.search(line) for line in before):
            return None
        return {"who": f"rank {values['task']} on {values['host']}", "what": _SIGNALS[values["how"]]}
    if any(_ROOT_CAUSE in line for line in lines[index + 1:]):
        return None
    if not any(_ROOT_CAUSE in line for line in before) and any(_RANK_EXITED.search(line) for line in before):
        return None
    near = lines[max(0, index - 6):index]
    rank = next((m.group(1) for line in reversed(near) if (m := re.search(r"\brank\s*:\s*(\d+)", line))), None)
    host = next((m.group(1) for line in reversed(near) if (m := re.search(r"\bhost\s*:\s*(\S+)", line))), None)
    who = f"rank {rank}" if rank else f"the rank of PID {values['pid']}"
    return {"who": f"{who} on {host}" if host else who, "what": values["sig"]}


TEXT_RULES: tuple[TextRule, ...] = (
    TextRule(
        RANK_KILLED, "a rank was killed from outside",
        (r"srun: error: (?P<host>\S+): tasks? (?P<task>[\d,-]+): (?P<how>Killed|Terminated)\s*$",
         r"traceback\s*:\s*Signal \d+ \((?P<sig>SIGKILL|SIGTERM)\) received by PID (?P<pid>\d+)"),
        "{who} was killed ({what}) while it trained; the other ranks' errors after it (a connection reset or "
        "closed by the peer) follow from that, not from the program",
        "find what killed it: the kernel's OOM killer (dmesg on the node; the doctor names an oom-kill it sees), "
        "a person or a cleanup script (kill, scancel of a step); then submit again -- a diffscale run resumes from "
        "its newest checkpoint (a sweep element: diffscale sweep submit DIR --failed)",
        derive=_killed_rank,
    ),
    TextRule(
        HOST_OOM, "host memory exhausted (OOM kill)",
        (r"Detected (?P<n>\d+) oom[-_]kill event", r"oom[-_]kill event", r"JobState=OUT_OF_MEMORY",
         r"\|OUT_OF_MEMORY\|", r"Out of memory: Killed process", r"Memory cgroup out of memory"),
        "the job used more host RAM than it was given and the kernel killed it (oom-kill)",
        "ask for more host memory (diffscale submit --mem GiB, or #SBATCH --mem), or use less of it: fewer "
        "ranks per node (--gpus-per-node, with more --nodes; each rank holds its own copy of the data), fewer "
        "images (--set data.max_items=N), or a smaller preset or train.batch_per_gpu",
        user_fix="ask for more host memory (#SBATCH --mem, or diffscale submit --mem GiB), or use less of it: fewer "
                 "ranks per node, fewer DataLoader workers (num_workers; each holds its own copy of what the "
                 "dataset loaded) or a smaller batch; `diffscale probe -- COMMAND` measures one rank",
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
        "submit-rejected", "the scheduler refused the job",
        (r"(?:sbatch|srun|salloc): error: (?:Batch job submission failed|Unable to allocate resources): (?P<why>.+)",
         r"Unable to run job: (?P<why>.+)"),
        "the job never ran: the scheduler refused it at submission ({why})",
        "{advice}",
        derive=_submit_advice, every=True,
    ),
    TextRule(
        "disk-full", "out of disk space or quota",
        (r"\[Errno (?P<errno>28|122)\] (?:No space left on device|Disk quota exceeded)(?:: '(?P<path>[^']+)')?",
         r"No space left on device", r"Disk quota exceeded", r"\bENOSPC\b", r"\bEDQUOT\b",
         r"PytorchStreamWriter failed writing file"),
        "{what}: the job could not write its checkpoints, logs or caches",
        "free space, or write elsewhere: the run directory on scratch (--out /scratch/...), fewer checkpoints "
        "kept (--set train.keep_checkpoints=1), caches off a small $HOME (DIFFSCALE_CACHE_DIR, TRITON_CACHE_DIR, "
        "TORCHINDUCTOR_CACHE_DIR, HF_HOME in the profile's env:), TMPDIR on scratch when /tmp is full; "
        "the site's quota tool (quota -s, myquota) shows what is left",
        user_fix="free space, or write elsewhere: checkpoints and logs on scratch, fewer checkpoints kept, caches "
                 "off a small $HOME (DIFFSCALE_CACHE_DIR, TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR, HF_HOME), "
                 "TMPDIR on scratch when /tmp is full; the site's quota tool (quota -s, myquota) shows what is left",
        derive=_disk, by_pattern=True,
    ),
    TextRule(
        "address-in-use", "the rendezvous port was taken",
        (r"failed to bind to (?:\[[^\]]*\]|[\w.:-]+?):(?P<port>\d+) \(errno: 98",
         r"port: (?P<port>\d+), useIpv6: \w+, code: -98", r"\bEADDRINUSE\b", r"[Aa]ddress already in use"),
        "the rank that hosts the rendezvous could not listen on {port_text}: another job or process on that "
        "node already uses it (typically two jobs on one node with the default MASTER_PORT 29500)",
        "give every job its own port: derive it from the job id as diffscale's scripts do (MASTER_PORT = "
        "20000 + job id % 20000), or let torchrun pick one (--standalone on one node, --rdzv-endpoint=HOST:0); "
        "never hard-code 29500 in a job script",
        derive=_port,
    ),
    TextRule(
        "python-import", "the job's Python lacks a module",
        (r"ModuleNotFoundError: No module named '(?P<module>[^']+)'",
         r"ImportError: cannot import name '(?P<name>[^']+)' from '(?P<module>[^']+)'"),
        "the job's Python could not import {module}: the job does not run in the environment it was "
        "installed in (a job starts a fresh shell: no conda activate, no module load, no venv), or that "
        "environment has another version of it",
        "run the job with the environment's interpreter (diffscale plan/submit --python /path/to/env/bin/python) "
        "or activate it in the profile's setup: (`module load ...`, `source /path/to/env/bin/activate`); "
        "check with `which python; python -c 'import {module}'` in an interactive job on that partition",
    ),
    TextRule(
        "shared-library-missing", "a shared library is missing on the node",
        (r"(?:ImportError|OSError): (?P<lib>[\w.+-]+\.so[\w.]*): cannot open shared object file",),
        "a package could not load {lib}: the library it was built against (often a CUDA or compiler "
        "module) is not present or not loaded on the compute node",
        "load it in the profile's setup: (e.g. `module load cuda/12.4`), or install wheels that bundle their "
        "CUDA libraries (pip's torch does); `ldd` on the failing extension shows what it needs",
    ),
    TextRule(
        "segfault", "a process crashed in native code (segmentation fault)",
        (r"Fatal Python error: Segmentation fault", r"Segmentation fault", r"\bSIGSEGV\b",
         r"(?:signal|Signals\.SIG)(?: |SEGV)?\b11\b|exit(?:ed with exit)? code:? 139\b|exitcode\s*:\s*-11\b"),
        "a process died of signal 11 (segmentation fault): a crash in compiled code -- a CUDA/NCCL library, an "
        "extension built for another torch or CUDA, or a data library -- not a Python error, so no traceback",
        "run again with PYTHONFAULTHANDLER=1 (or python -X faulthandler) to print the Python stack at the crash; "
        "check that torch, CUDA and compiled extensions come from one environment on every node (pip list / conda "
        "list on a compute node); with several ranks, the first rank that crashed is the one to read",
        by_pattern=True,
    ),
    TextRule(
        "abort-at-exit", "a process aborted as Python exited (threads still running)",
        (r"terminate called without an active exception",),
        "a process aborted (SIGABRT) as its interpreter exited, after its Python code had ended: native threads "
        "were still running then -- most often those of a torch.distributed process group never destroyed, whose "
        "gloo or NCCL threads outlive the interpreter; the scheduler records the job as failed even where the "
        "training finished",
        "diffscale's runs end their process group themselves: a diffscale run that shows this is a bug to report, "
        "with this log; checkpoints written before the abort are whole (--resume auto continues from them)",
        user_fix="end the script with `torch.distributed.destroy_process_group()` once training is done (after "
        "`trainer.fit(...)` with Lightning: `if torch.distributed.is_initialized(): "
        "torch.distributed.destroy_process_group()`), so the group's threads stop before Python exits",
    ),
)
