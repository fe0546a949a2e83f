"""SLURM job scripts: a pure function of a JobSpec.

One task per GPU (``--ntasks-per-node`` = GPUs per node), every task started by ``srun``
(never a bare ``python`` for more than one task): each process then reads SLURM_PROCID /
SLURM_LOCALID / SLURM_NTASKS / SLURM_NODEID, and MASTER_ADDR / MASTER_PORT exported
here (the first host of the allocation; 20000 + job id % 20000). Lightning and torch's
``env://`` read the same variables, so a user's own command gets the same wiring.

Resilience: ``--signal=B:USR2@LEAD`` warns the batch shell LEAD seconds before the time
limit; the trap passes the signal to the srun step, which delivers it to every task, so
every rank checkpoints. On exit 85 the script requeues its own job (``--requeue``)
with a max-restarts guard, or, in a segment chain, ends and lets the next segment
(``--dependency=afterany:``) resume.
"""

from __future__ import annotations

from diffscale.cluster.jobs.race import claim_snippet
from diffscale.cluster.profiles.types import GpuRequest
from diffscale.cluster.scripts.jobspec import Continuation, JobSpec
from diffscale.cluster.scripts.launcher import Launcher
from diffscale.cluster.scripts.shellparts import (
    REQUEUE_NOTE,
    end_marker,
    header,
    outside_stop,
    preamble,
    python_word,
    wait_for,
    words,
)
from diffscale.cluster.scripts.timefmt import hms
from diffscale.runtime.signals import EXIT_REQUEUE

LOG_PATTERN = "logs/%x-%j.out"


def log_path(job_name: str, job_id: str) -> str:
    """The log of a job, relative to the run directory."""
    return LOG_PATTERN.replace("%x", job_name).replace("%j", job_id)


def directives(spec: JobSpec) -> list[str]:
    d = [f"--job-name={spec.job_name}", f"--nodes={spec.nodes}", f"--ntasks-per-node={spec.ranks_per_node}"]
    if spec.gpus_per_node:
        typed = f"{spec.gres_type}:{spec.gpus_per_node}" if spec.gres_type else str(spec.gpus_per_node)
        if spec.gpu_request is GpuRequest.GRES:
            d.append(f"--gres=gpu:{typed}")
        else:
            d.append(f"--gpus-per-node={typed}")
    d.append(f"--cpus-per-task={spec.cpus_per_rank}")
    if spec.mem_per_node_gb is not None:
        d.append(f"--mem={spec.mem_per_node_gb}G")
    if spec.time_s is not None:
        d.append(f"--time={hms(spec.time_s)}")
    for flag, value in (("partition", spec.partition), ("account", spec.account), ("qos", spec.qos),
                        ("constraint", spec.constraint)):
        if value:
            d.append(f"--{flag}={value}")
    d += [f"--output={LOG_PATTERN}", "--open-mode=append"]
    if spec.signal:
        d.append(f"--signal=B:{spec.signal}@{spec.signal_lead_s}")
    d.append("--requeue")
    return ["#SBATCH " + x for x in d]


def render(spec: JobSpec) -> str:
    lines = header(spec.title, "Submit it from the run directory (diffscale submit does): logs/ is relative to it.")
    lines += directives(spec)
    greeting = "echo \"diffscale: job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}) on $SLURM_JOB_NODELIST\""
    # srun starts the interpreter itself only for a diffscale run (a user's command names its own)
    chosen = spec.python_from_setup and bool(spec.argv) and spec.argv[0] == spec.python
    lines += preamble(spec.run_dir, greeting, spec.race, "scancel --name=", spec.setup, spec.env, claim_snippet,
                      spec.command_env, python=spec.python if chosen else None)
    lines += ["", *_rendezvous(spec)]
    command = f"{python_word(spec.python, True)} {words(spec.argv[1:])}" if chosen else words(spec.argv)
    step = (f"srun --kill-on-bad-exit=1 --nodes={spec.nodes} --ntasks-per-node={spec.ranks_per_node} "
            f"--cpus-per-task={spec.cpus_per_rank} {command} &")
    lines.append("")
    if spec.signal:
        lines += [
            f"# --signal=B:{spec.signal} reaches only this shell; srun passes it on to every task so",
            "# every rank checkpoints before the time limit.",
            "step_pid=",
            "got_signal=0",
            "forward_signal() {",
            "    got_signal=1",
            f"    echo \"diffscale: got SIG{spec.signal} (time limit near): passing it to every rank\"",
            f"    [ -n \"$step_pid\" ] && kill -{spec.signal} \"$step_pid\" 2>/dev/null",
            "}",
            f"trap forward_signal {spec.signal}",
        ]
    lines += outside_stop(spec.end_marker_dir)
    lines += [
        "# One task per GPU, all started by srun (srun >= 22.05 needs --cpus-per-task again).",
        step,
        "step_pid=$!",
        *wait_for("step_pid", "rc"),
    ]
    if not spec.signal:
        lines.append("got_signal=0")
    lines += ["", *end_marker(spec.end_marker_dir), *_exit_handling(spec)]
    return "\n".join(lines) + "\n"


def _rendezvous(spec: JobSpec) -> list[str]:
    if spec.launcher is Launcher.LIGHTNING:
        return [
            "# A Lightning Trainer: its SLURMEnvironment reads SLURM_NTASKS / SLURM_PROCID / SLURM_LOCALID /",
            "# SLURM_NODEID of the srun tasks below and derives MASTER_ADDR/PORT from the allocation.",
            "# Nothing is set by hand; values inherited from the submitting shell would override it.",
            "unset MASTER_ADDR MASTER_PORT RANK LOCAL_RANK WORLD_SIZE NODE_RANK GROUP_RANK",
            f"# The Trainer must say devices={spec.ranks_per_node} and num_nodes={spec.nodes} (Lightning checks both).",
        ]
    return [
        "# Rendezvous of every rank: the first host of the allocation, a port derived from the",
        "# job id (diffscale, Lightning and torch env:// all read MASTER_ADDR/MASTER_PORT).",
        "MASTER_ADDR=\"$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)\"",
        "export MASTER_ADDR",
        "export MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))",
    ]


def _checkpointed_test() -> str:
    # srun --kill-on-bad-exit ends the other tasks once the first exits 85, so srun may
    # report their SIGTERM (143) instead: failing after the warning counts as checkpointed.
    return f"[ \"$rc\" -eq {EXIT_REQUEUE} ] || {{ [ \"$got_signal\" -eq 1 ] && [ \"$rc\" -ne 0 ]; }}"


def _exit_handling(spec: JobSpec) -> list[str]:
    if spec.continuation is Continuation.NONE:
        return ["echo \"diffscale: command exited with $rc\"", "exit \"$rc\""]
    if spec.continuation is Continuation.CHAIN:
        return [
            REQUEUE_NOTE,
            "# This job is one segment of a chain: the next segment (afterany dependency) resumes.",
            f"if {_checkpointed_test()}; then",
            "    echo \"diffscale: checkpointed; the next segment continues the run\"",
            "    exit 0",
            "fi",
            "echo \"diffscale: command exited with $rc\"",
            "exit \"$rc\"",
        ]
    return [
        REQUEUE_NOTE,
        "# Requeue this job (same id; SLURM_RESTART_COUNT counts the restarts) unless the",
        "# max-restarts guard says the run keeps getting stopped without finishing.",
        f"if {_checkpointed_test()}; then",
        "    restarts=\"${SLURM_RESTART_COUNT:-0}\"",
        f"    if [ \"$restarts\" -lt {spec.max_restarts} ]; then",
        "        echo \"diffscale: checkpointed; requeueing job $SLURM_JOB_ID "
        f"(restart $((restarts + 1)) of {spec.max_restarts})\"",
        "        if scontrol requeue \"$SLURM_JOB_ID\"; then",
        "            # a requeued job waits for a begin time in the future; start it as soon as nodes allow",
        "            scontrol update JobId=\"$SLURM_JOB_ID\" StartTime=now 2>/dev/null || true",
        "            exit 0",
        "        fi",
        "        echo \"diffscale: scontrol requeue failed; submit the run again to continue\" >&2",
        "    else",
        "        echo \"diffscale: checkpointed, but the job was already restarted $restarts times "
        f"(max {spec.max_restarts}); submit again to continue\" >&2",
        "    fi",
        "fi",
        "echo \"diffscale: command exited with $rc\"",
        "exit \"$rc\"",
    ]
