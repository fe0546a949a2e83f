"""Grid Engine job scripts: a pure function of a JobSpec.

Ranks are started by ``python -m torch.distributed.run`` (torchrun), which sets RANK,
LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT for every process:

* one host: ``--standalone --nproc_per_node=G`` (a PE with allocation ``$pe_slots``);
* several hosts: one launcher per host of PE_HOSTFILE (duplicate host lines merged),
  started locally on the first host and with ``qrsh -inherit HOST`` on the others (the
  PE needs control_slaves TRUE), each with ``--nnodes=N --node_rank=K``; master = the
  first host, port 20000 + JOB_ID % 20000. The script waits for every launcher and
  fails when any fails.

Resilience: a soft limit ``-l s_rt`` = h_rt - lead sends SIGUSR1 to the job before the
hard limit; ``-notify`` sends SIGUSR2 at h_rt itself (both measured on SoGE 8.1.9). Only
the soft limit leaves time to act: a job stopped at h_rt is recorded "failed 37" and is
never rescheduled, whatever it exits with. torchrun is told to pass both signals on to its
workers (TORCHELASTIC_SIGNALS_TO_HANDLE; they run in sessions of their own), so every rank
checkpoints.
torchrun reports a worker's exit 85 as its own exit 1, so the script also treats "failed
after the warning signal" as checkpointed. Then it submits a continuation job held on
itself (a rescheduled rerun would inherit the h_rt clock), until max_restarts, or, in a
``-hold_jid`` segment chain, ends so that the next segment resumes.
"""

from __future__ import annotations

import hashlib

from diffscale.cluster.jobs.race import claim_snippet
from diffscale.cluster.jobs.records import CONTINUATIONS
from diffscale.cluster.profiles.types import GpuScope
from diffscale.cluster.scripts.jobspec import Continuation, JobSpec
from diffscale.cluster.scripts.launcher import Launcher
from diffscale.cluster.scripts.shellparts import (
    REQUEUE_NOTE,
    end_marker,
    header,
    outside_stop,
    preamble,
    python_choice,
    python_word,
    q,
    wait_for,
    words,
)
from diffscale.cluster.scripts.timefmt import hms
from diffscale.runtime.signals import EXIT_REQUEUE

EXIT_RESCHEDULE = 99  # Grid Engine: a job exiting 99 is rescheduled (with -r y)


def log_path(job_name: str, job_id: str) -> str:
    """The log of a job (stdout and stderr joined by -j y), relative to the run directory."""
    return f"logs/{job_name}.o{job_id}"


def slots(spec: JobSpec) -> int:
    return spec.nodes * spec.ranks_per_node * spec.cpus_per_rank


def pe_name(spec: JobSpec) -> str | None:
    assert spec.sge is not None
    return spec.sge.pe_single_host if spec.nodes == 1 and spec.sge.pe_single_host else spec.sge.pe_multi_host


def gpu_amount(spec: JobSpec) -> str | None:
    """The number in ``-l gpus=N`` for the profile's accounting of the GPU complex."""
    assert spec.sge is not None
    if not spec.gpus_per_node:
        return None
    scope = spec.sge.gpu_scope
    if scope is GpuScope.JOB:
        return str(spec.gpus_per_node * spec.nodes)
    if scope is GpuScope.HOST:
        return str(spec.gpus_per_node)
    per_slot = spec.gpus_per_node / (spec.ranks_per_node * spec.cpus_per_rank)
    return str(int(per_slot)) if per_slot.is_integer() else f"{per_slot:.3f}".rstrip("0")


def soft_limit_s(spec: JobSpec) -> int:
    """When SIGUSR1 warns the job: the signal lead before h_rt, but never in its first half."""
    assert spec.time_s is not None
    return max(spec.time_s - spec.signal_lead_s, spec.time_s // 2)


def directives(spec: JobSpec) -> list[str]:
    assert spec.sge is not None
    d = [f"-N {spec.job_name}", "-S /bin/bash", "-cwd", "-j y", "-o logs/"]
    pe = pe_name(spec)
    if pe:
        d.append(f"-pe {pe} {slots(spec)}")
    if spec.time_s is not None:
        d.append(f"-l h_rt={hms(spec.time_s)}")
        if spec.signal:
            d.append(f"-l s_rt={hms(soft_limit_s(spec))}")
    amount = gpu_amount(spec)
    if amount is not None:
        d.append(f"-l {spec.sge.gpu_resource}={amount}")
    for name, value in spec.resources:
        d.append(f"-l {name}={value}")
    if spec.account:
        d.append(f"-P {spec.account}")
    if spec.partition:
        d.append(f"-q {spec.partition}")
    if spec.signal:
        d.append("-notify")
    d.append("-r y")
    if spec.sge.export_env:
        d.append("-V")
    return ["#$ " + x for x in d]


def render(spec: JobSpec) -> str:
    lines = header(spec.title, "Submit it from the run directory (diffscale submit does): logs/ is relative to it.")
    lines += directives(spec)
    greeting = "echo \"diffscale: job $JOB_ID on $(hostname) (restarted: ${RESTARTED:-0})\""
    lines += preamble(spec.run_dir, greeting, spec.race, "qdel", spec.setup, spec.env, claim_snippet,
                      spec.command_env, python=spec.python if spec.python_from_setup else None)
    lines += [""]
    signal_env: list[tuple[str, str]] = []
    if spec.signal:
        assert spec.sge is not None
        notify = str(spec.sge.notify_s or 60)
        signal_env = [("TORCHELASTIC_SIGNALS_TO_HANDLE", _signals(spec)), ("PET_SIGNALS_TO_HANDLE", _signals(spec)),
                      ("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", notify), ("PET_SHUTDOWN_TIMEOUT", notify)]
        lines += [
            "# s_rt sends SIGUSR1 (and -notify SIGUSR2 at h_rt) to every process group of the job, on",
            "# every host. torchrun's workers run in sessions of their own, so torchrun must pass the",
            "# signals on (and give them time to checkpoint before it kills them).",
            *(f"export {k}={q(v)}" for k, v in signal_env),
        ]
    if spec.launcher is Launcher.LIGHTNING:
        lines += [
            "# A Lightning Trainer: torchrun's RANK / LOCAL_RANK / WORLD_SIZE / GROUP_RANK select Lightning's",
            "# TorchElasticEnvironment (Grid Engine has none of its own); nothing else is set by hand.",
            f"# The Trainer must say devices={spec.ranks_per_node} and num_nodes={spec.nodes} (Lightning checks both).",
        ]
    if spec.nodes == 1:
        start = _start_one_host(spec)
    else:
        setup, start = _start_per_host(spec, signal_env)
        lines += setup
    lines += [
        "",
        "got_signal=0",
        "pids=()",
    ]
    if spec.signal:
        lines += [
            "trap 'got_signal=1; echo \"diffscale: got the time-limit warning: every rank checkpoints\"' "
            f"{' '.join(_trapped(spec))}",
        ]
    lines += ["", *outside_stop(spec.end_marker_dir), *start, "",
              "# Wait for every launcher; the job fails when any fails.", "rc=0",
              "for pid in \"${pids[@]}\"; do", *["    " + w for w in wait_for("pid", "one")],
              "    if [ \"$one\" -ne 0 ] && [ \"$rc\" -eq 0 ]; then rc=$one; fi", "done"]
    lines += ["", *end_marker(spec.end_marker_dir), *_exit_handling(spec)]
    return "\n".join(lines) + "\n"


def _start_one_host(spec: JobSpec) -> list[str]:
    return [
        "# One host: torchrun starts one process per GPU and picks a free rendezvous port.",
        f"{python_word(spec.python, spec.python_from_setup)} -m torch.distributed.run --standalone --nnodes=1 "
        f"--nproc_per_node={spec.ranks_per_node} "
        f"{words(spec.torchrun_args)} &",
        "pids=($!)",
    ]


def _start_per_host(spec: JobSpec, signal_env: list[tuple[str, str]]) -> tuple[list[str], list[str]]:
    """The hosts from PE_HOSTFILE and a launcher file (set-up lines), then one torchrun per host."""
    launcher = "\n".join([
        f"cd {q(spec.run_dir)} || exit 2",
        *python_choice(spec.python if spec.python_from_setup else None, spec.setup),
        *(f"export {k}={q(v)}" for k, v in list(spec.command_env) + list(spec.env) + signal_env),
        f"exec {python_word(spec.python, spec.python_from_setup)} -m torch.distributed.run --nnodes={spec.nodes} "
        "--node_rank=\"$1\" "
        f"--nproc_per_node={spec.ranks_per_node} --master_addr=\"$2\" --master_port=\"$3\" {words(spec.torchrun_args)}",
    ])
    eof = "DIFFSCALE_LAUNCHER_" + hashlib.sha1(launcher.encode("utf-8", "surrogateescape")).hexdigest()[:12]
    setup = [
        "# Hosts of the job from PE_HOSTFILE (`host slots queue cpus` lines; a host may appear",
        "# once per queue instance: merge them). Master = the first host.",
        "mapfile -t HOSTS < <(awk '!seen[$1]++ {print $1}' \"$PE_HOSTFILE\")",
        f"if [ \"${{#HOSTS[@]}}\" -ne {spec.nodes} ]; then",
        f"    echo \"diffscale: the PE gave ${{#HOSTS[@]}} hosts, this job needs {spec.nodes}:\" >&2; "
        "cat \"$PE_HOSTFILE\" >&2",
        "    exit 2",
        "fi",
        "MASTER_ADDR=\"${HOSTS[0]}\"",
        "MASTER_PORT=$((20000 + JOB_ID % 20000))",
        "# The per-host launcher, a file in the run directory: qrsh -inherit starts remote tasks",
        "# in the job's working directory but with neither this shell's variables nor, on some",
        "# sites, its argument quoting -- so the remote command line is only plain words.",
        "launcher=\".diffscale-launch-$JOB_ID.sh\"",
        f"cat >\"$launcher\" <<'{eof}'",
        launcher,
        eof,
    ]
    start = [
        "# One torchrun per host: locally on the first, through qrsh -inherit (tight integration,",
        "# the PE's control_slaves) on the others.",
        "pids=()",
        "for k in \"${!HOSTS[@]}\"; do",
        "    if [ \"$k\" -eq 0 ]; then",
        "        /bin/bash \"$launcher\" \"$k\" \"$MASTER_ADDR\" \"$MASTER_PORT\" &",
        "    else",
        "        qrsh -inherit -nostdin \"${HOSTS[$k]}\" "
        "/bin/bash \"$launcher\" \"$k\" \"$MASTER_ADDR\" \"$MASTER_PORT\" &",
        "    fi",
        "    pids+=($!)",
        "done",
    ]
    return setup, start


def _trapped(spec: JobSpec) -> list[str]:
    """USR1 from the soft limit s_rt, plus the configured -notify signal."""
    return list(dict.fromkeys(["USR1", str(spec.signal)]))


def _signals(spec: JobSpec) -> str:
    return ",".join(["SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT"] + [f"SIG{s}" for s in _trapped(spec)])


def _checkpointed_test() -> str:
    return f"[ \"$rc\" -eq {EXIT_REQUEUE} ] || {{ [ \"$got_signal\" -eq 1 ] && [ \"$rc\" -ne 0 ]; }}"


def _exit_handling(spec: JobSpec) -> list[str]:
    if spec.continuation is Continuation.NONE:
        return ["echo \"diffscale: command exited with $rc\"", "exit \"$rc\""]
    note = [REQUEUE_NOTE,
            "# torchrun reports a worker's exit 85 as 1, so failing after the warning counts too."]
    if spec.continuation is Continuation.CHAIN:
        return note + [
            "# This job is one segment of a chain: the next segment (-hold_jid) resumes.",
            f"if {_checkpointed_test()}; then",
            "    echo \"diffscale: checkpointed; the next segment continues the run\"",
            "    exit 0",
            "fi",
            "echo \"diffscale: command exited with $rc\"",
            "exit \"$rc\"",
        ]
    cont_log = log_path(spec.job_name, "$next")
    return note + [
        "# A rescheduled rerun (-r y, exit 99) keeps this run's h_rt clock and is stopped at the",
        "# same limit (measured on SoGE 8.1.9): the run continues in a new job instead, held until",
        "# this one has ended, and listed in continuations.tsv for status/logs/cancel. The restart",
        "# count lives in the run directory.",
        f"if {_checkpointed_test()}; then",
        "    count_file=\"$RUN_DIR/.restarts\"",
        "    restarts=$(cat \"$count_file\" 2>/dev/null || echo 0)",
        f"    if [ \"$restarts\" -lt {spec.max_restarts} ]; then",
        "        echo $((restarts + 1)) >\"$count_file\"",
        f"        if next=$(qsub -terse -hold_jid \"$JOB_ID\" {q(spec.script_file)}) && [ -n \"$next\" ]; then",
        f"            printf '%s\\t%s\\t%s\\n' \"$next\" \"$JOB_ID\" \"{cont_log}\" >>\"$RUN_DIR/{CONTINUATIONS}\"",
        "            echo \"diffscale: checkpointed; continuation job $next submitted "
        f"(restart $((restarts + 1)) of {spec.max_restarts})\"",
        "            exit 0",
        "        fi",
        "        echo \"diffscale: qsub of the continuation failed; "
        "rescheduling this job inside its h_rt instead\" >&2",
        f"        exit {EXIT_RESCHEDULE}",
        "    fi",
        "    echo \"diffscale: checkpointed, but the run was already continued $restarts times "
        f"(max {spec.max_restarts}); submit again to continue\" >&2",
        f"    exit {EXIT_REQUEUE}",
        "fi",
        "echo \"diffscale: command exited with $rc\"",
        "exit \"$rc\"",
    ]
