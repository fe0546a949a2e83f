"""`diffscale doctor` on captured logs: every signature of the table, each from a real-world snippet."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from diffscale.cli import main
from diffscale.config import RunConfig
from diffscale.doctor import diagnose, signatures
from diffscale.doctor.sources import gather

LOGS = Path(__file__).parent / "fixtures" / "logs"

# fixture file -> (rule, words the cause must contain, words the fix must contain)
CASES = {
    "host-oom.log": ("host-oom", "more host RAM than it was given", "--mem"),
    "slurm-out-of-memory.scontrol": ("host-oom", "oom-kill", "fewer ranks per node"),
    "dataloader-killed.log": ("dataloader-killed", "died (Killed)", "num_workers"),
    "cuda-oom.log": ("cuda-oom", "tried to allocate 2.25 GiB", "train.batch_per_gpu"),
    "nccl-timeout.log": ("nccl-timeout", "waited 1800000 ms in a collective (ALLREDUCE, #80452)",
                         "runtime.collective_timeout_s"),
    "rendezvous-diffscale.log": ("rendezvous-short", "only 4 of 16 ranks", "--ntasks-per-node"),
    "rendezvous-torch.log": ("rendezvous-short", "only 1 of 16 ranks", "srun"),
    "srun-missing.log": ("srun-missing", "without srun", "`srun`"),
    "tasks-gpus-mismatch.log": ("tasks-gpus-mismatch", "local rank 4, 4 GPUs", "--gpus-per-node G"),
    "more-processors.log": ("more-processors", "more tasks x CPUs", "--cpus-per-task"),
    "slurm-time-limit.log": ("slurm-time-limit", "time limit", "--signal=B:USR2@120"),
    "sge-h-rt.qacct": ("sge-h-rt", "failed 37, exit_status 137", "-l s_rt"),
    "sge-h-rt-checkpointed.qacct": ("sge-h-rt-checkpointed", "does not reschedule it", "-l s_rt < h_rt"),
    "nonfinite-stop.log": ("nonfinite-stop", "at step 3600", "optim.lr"),
    "nonfinite-rollback.log": ("nonfinite-rollback", "rolled back to step 3000", "optim.lr"),
    "nan-loss.log": ("nan-loss", "NaN", "optim.grad_clip"),
    "divergence-restore.log": ("divergence-restore", "went back to step 300", "optim.lr"),
    "divergence-stop.log": ("divergence-stop", "the loss diverged at step 32 (the loss 1.95", "optim.lr"),
    # a coupled trainer whose simulation ended too soon or failed
    "simulation-too-short.log": ("simulation-too-short", "ended (cancelled) after 160 samples in 2 output steps, "
                                 "fewer than the 3840", "--couple SPOOL_DIR:N (or --data spool:DIR:N) with N at "
                                 "most 160"),
    "simulation-failed.log": ("simulation-failed", "failed (exit status 3) after 52 output steps",
                              "diffscale logs RUN_DIR --job SIMULATION_JOB_ID"),
    "nonfinite-skipped.jsonl": ("nonfinite-skipped", "5 optimizer steps", "optim.lr"),
    "data-bound.json": ("data-bound", "busy only 31% of the time and 58%", "--recipe fast"),
    # NCCL, the network, the GPUs
    "nccl-heartbeat.log": ("nccl-timeout", "until NCCL's watchdog gave up after 480 s", "collective_timeout_s"),
    "nccl-system-error.log": ("nccl-system-error", "NCCL's last error: socketStartConnect: Connect to "
                              "10.2.1.17<43611> failed : Software caused connection abort", "NCCL_SOCKET_IFNAME"),
    "nccl-unhandled-alone.log": ("nccl-system-error", "NCCL_DEBUG=INFO shows which call", "NCCL_DEBUG=INFO"),
    "nccl-ib-errors.log": ("network-transport", "transport retry counter was exceeded", "--exclude=NODE"),
    "xid-79.log": ("gpu-hardware", "the GPU has fallen off the bus (Xid 79) on PCI:0000:c1:00", "--exclude=NODE"),
    "illegal-memory-access.log": ("illegal-memory-access", "touched memory it does not own",
                                  "CUDA_LAUNCH_BLOCKING=1"),
    "driver-too-old.log": ("cuda-driver-too-old", "driver (it supports CUDA up to 11.4) is older",
                           "download.pytorch.org/whl/cu118"),
    # the job around the training
    "address-in-use.log": ("address-in-use", "could not listen on port 29500", "20000 + job id % 20000"),
    "disk-quota.log": ("disk-full", "the disk quota was exceeded (/home/jdoe/.triton/cache/", "TRITON_CACHE_DIR"),
    "disk-full.log": ("disk-full", "the file system ran out of space (/scratch/jdoe/runs/xl/checkpoints/",
                      "fewer checkpoints kept, caches"),  # a user's own train.py: no diffscale setting named
    "module-not-found.log": ("python-import", "could not import torch: the job does not run in the environment",
                             "--python /path/to/env/bin/python"),
    "shared-library-missing.log": ("shared-library-missing", "could not load libcudart.so.11.0",
                                   "module load cuda"),
    "sbatch-invalid-account.txt": ("submit-rejected", "refused it at submission (Invalid account or "
                                   "account/partition combination specified)", "sacctmgr show assoc"),
    "sbatch-invalid-partition.txt": ("submit-rejected", "(Invalid partition name specified)", "sinfo -s"),
    "sbatch-invalid-qos.txt": ("submit-rejected", "(Invalid qos specification)", "pass --qos"),
    "qsub-unknown-queue.txt": ("submit-rejected", "unknown queue \"gpu.q\"", "qconf -sql"),
    # users' own Lightning trainers, and the schedulers' accounting
    "lightning-hang-rank0.log": ("lightning-rendezvous-hang", "called itself global rank 0 (8 times)",
                                 "--ntasks-per-node=<devices per node>"),
    "lightning-hang-no-srun.log": ("lightning-rendezvous-hang", "only global ranks 0, 1, 2, 3 of 16 joined",
                                   "`srun python my_trainer.py`"),
    "lightning-hang-one-member.log": ("lightning-rendezvous-hang", "the other nodes never started: no srun -- one "
                                      "process (global rank 0 of 8) joined", "`srun python my_trainer.py`"),
    # one of two ranks killed (kill -9) under srun on the test SLURM (2026-11-29): the other rank's gloo
    # "Connection reset by peer" traceback comes first in the log and is its consequence
    "rank-killed-srun.log": ("rank-killed", "rank 1 on n1 was killed (SIGKILL) while it trained",
                             "diffscale sweep submit DIR --failed"),
    # the same under torchrun on the test Grid Engine: torchrun lists the rank it then ended (SIGTERM)
    # under "Failures:" before the root cause
    "rank-killed-torchrun.log": ("rank-killed", "rank 1 on localhost was killed (SIGKILL) while it trained",
                                 "resumes from its newest checkpoint"),
    # the same when the surviving rank exited 1 (its gloo "Connection reset by peer") before torchrun ended
    # it: "Failures:" lists it with exit code 1 above the root cause, the killed rank (CI, 2026-11-29)
    "rank-killed-torchrun-peer-exited.log": ("rank-killed", "rank 1 on localhost was killed (SIGKILL) while it "
                                             "trained", "resumes from its newest checkpoint"),
    "segfault.log": ("segfault", "a process died of signal 11 (segmentation fault)", "PYTHONFAULTHANDLER=1"),
    "abort-at-exit.log": ("abort-at-exit", "a process aborted (SIGABRT) as its interpreter exited",
                          "torch.distributed.destroy_process_group()"),
    "sacct-oom.sacct": ("sacct-limit", "ReqMem 256.0 GiB (256G), largest task MaxRSS 251.3 GiB (step 48377.batch) "
                        "= 98% of it", "--mem"),
    "sacct-timeout.sacct": ("sacct-limit", "Elapsed 2-00:00:12 of Timelimit 2-00:00:00, 12 s past it", "--time"),
    "qacct-h-vmem.qacct": ("qacct-limit", "the memory limit (h_vmem) -- failed 0, exit_status 137, maxvmem 15.8 GiB "
                           "of h_vmem 16.0 GiB (99%)", "-l h_vmem"),
    # a local trainer killed from outside: its trainer.json as the doctor reads it (state seen from its host)
    "trainer-killed.jsonl": ("trainer-killed", "the trainer (pid 81234 on gpu17, started 2026-11-27 09:14:02) is "
                             "gone without recording how it ended", "'Killed process 81234'"),
    # the program's own error, when nothing else explains the log
    "python-traceback.log": ("python-traceback", "RuntimeError: Given groups=1, weight of size [64, 3, 3, 3], "
                             "expected input[32, 1, 64, 64] to have 3 channels, but got 1 channels instead "
                             "(raised in _conv_forward, /home/jdoe/.venv/lib/python3.11/site-packages/torch/nn/"
                             "modules/conv.py:549; last line of the program's own code: /home/jdoe/ddpm/model.py:44, "
                             "in forward)", "not of the cluster"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_captured_log_is_recognised(name):
    rule, cause, fix = CASES[name]
    findings: dict[str, object] = {}
    for f in diagnose(gather(str(LOGS / name))):
        findings.setdefault(f.rule, f)  # a rule's first finding
    assert rule in findings, f"{name}: found {sorted(findings)}"
    assert cause in findings[rule].cause
    assert fix in findings[rule].fix
    assert findings[rule].origin == str(LOGS / name)


def test_every_rule_has_a_captured_log():
    assert signatures.RULE_NAMES == {rule for rule, _, _ in CASES.values()}


def _rules(name: str) -> list[str]:
    return [f.rule for f in diagnose(gather(str(LOGS / name)))]


def test_every_network_fault_of_a_job_is_reported_in_log_order():
    """A job whose InfiniBand link failed: the retry-exceeded error (the cause), the flushed
    requests it left, the port error and NCCL losing the peer are each reported, first first."""
    findings = [f for f in diagnose(gather(str(LOGS / "nccl-ib-errors.log"))) if f.rule == "network-transport"]
    causes = [f.cause for f in findings]
    assert len(causes) == 4, causes
    assert "transport retry counter was exceeded" in causes[0]
    assert "work requests flushed" in causes[1]
    assert "an InfiniBand port of this node reported 'port error'" in causes[2]
    assert "NCCL lost a peer" in causes[3]
    assert [f.line for f in findings] == sorted(f.line for f in findings)


def test_an_unhandled_system_error_is_reported_with_the_network_error_behind_it():
    assert _rules("nccl-system-error.log") == ["nccl-system-error", "network-transport"]
    transport = next(f for f in diagnose(gather(str(LOGS / "nccl-system-error.log"))) if f.rule == "network-transport")
    assert "Software caused connection abort" in transport.cause


def test_a_gpu_that_fell_off_the_bus_is_a_hardware_fault_before_the_launch_failure():
    assert _rules("xid-79.log") == ["gpu-hardware", "illegal-memory-access"]


def test_a_known_cause_hides_the_traceback_it_raised():
    # the traceback of a CUDA error or a missing module is explained, not repeated as "an exception"
    for name in ("illegal-memory-access.log", "module-not-found.log", "address-in-use.log", "disk-full.log"):
        assert "python-traceback" not in _rules(name), name


def test_the_workers_traceback_wins_over_torchruns_summary():
    (finding,) = diagnose(gather(str(LOGS / "python-traceback.log")))
    assert "ChildFailedError" not in finding.cause
    assert finding.evidence.startswith("RuntimeError: Given groups=1")


def test_an_address_in_use_without_a_port_still_reads_well(tmp_path):
    log = tmp_path / "uv.log"
    log.write_text("torch.distributed.DistNetworkError: failed to listen: EADDRINUSE\n")
    (finding,) = diagnose(gather(str(log)))
    assert "could not listen on its port:" in finding.cause


def test_cli_prints_cause_fix_and_evidence(capsys):
    assert main(["doctor", str(LOGS / "slurm-time-limit.log")]) == 0
    out = capsys.readouterr().out
    assert "SLURM time limit reached" in out
    assert "  cause: the job reached its time limit and SLURM killed it before it checkpointed" in out
    assert "  fix:   submit with diffscale submit (it adds --signal=B:USR2@LEAD and --requeue" in out
    assert "*** JOB 1288 ON gpu-a003 CANCELLED AT 2024-05-02T03:14:07 DUE TO TIME LIMIT ***" in out


def test_nothing_recognised_exits_1_and_says_what_it_read(capsys):
    assert main(["doctor", str(LOGS / "clean.log")]) == 1
    out = capsys.readouterr().out
    assert "no known failure signature found in:" in out and str(LOGS / "clean.log") in out


def test_nothing_recognised_shows_the_last_error_and_the_last_lines(capsys):
    log = LOGS / "unrecognised-error.log"
    assert main(["doctor", str(log)]) == 1
    out = capsys.readouterr().out
    # the program's own error, not srun's echo of the task's exit
    assert (f"last error in {log}: faces-loader: error: shard 17 of /scratch/jdoe/data/faces is truncated "
            "(expected 4096 records, found 1210)") in out
    assert f"last 8 lines of {log}:" in out
    assert "  | diffscale: command exited with 3" in out and "  | srun: Terminating StepId=4471234.0" in out


def test_h_rt_needs_the_killed_exit_status_of_the_same_run(tmp_path):
    # failed 37 with exit 0 of another run is no h_rt kill: the pair must come from one record
    text = (LOGS / "sge-h-rt.qacct").read_text().replace("137                  (Killed)", "0")
    (tmp_path / "other.qacct").write_text(text)
    assert "sge-h-rt" not in {f.rule for f in diagnose(gather(str(tmp_path / "other.qacct")))}


def test_run_dir_reads_logs_and_metrics(tmp_path, capsys):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "diffscale-tiny-12.out").write_text((LOGS / "cuda-oom.log").read_text())
    cut = '{"step": 25'  # a line cut by a kill
    (tmp_path / "metrics.jsonl").write_text((LOGS / "nonfinite-skipped.jsonl").read_text() + cut)
    assert main(["doctor", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "(2 sources read)" in out
    assert "GPU memory exhausted (CUDA out of memory)" in out and "non-finite steps skipped" in out


def test_run_dir_with_jobs_unknown_to_any_scheduler_says_so(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "nobin"))  # no scontrol/qacct: a laptop with a copied run dir
    (tmp_path / "jobs.json").write_text(json.dumps({"submissions": [{
        "scheduler": "slurm", "cluster": "x", "submitted_at": "now", "run_dir": str(tmp_path), "what": "w",
        "jobs": [{"job_id": "77", "name": "n", "shape": "1x1", "partition": "cpu", "script": "s",
                  "log": "logs/n-77.out"}]}]}))
    assert main(["doctor", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "not read: slurm job 77: no scheduler record here" in out


def test_a_target_that_is_nothing_is_a_user_error(capsys):
    assert main(["doctor", "no-such-thing"]) == 2
    assert ("error: 'no-such-thing' is neither a run directory, a log file nor a job id -- pass RUN_DIR"
            in capsys.readouterr().err)


def test_every_config_field_a_fix_names_exists():
    # advice must name knobs a user can set: `--set data.workers=2` outlived its field once
    cfg = RunConfig()
    rules = [*signatures.TEXT_RULES, *signatures.RECORD_RULES]
    pattern = re.compile(r"(?<![\w.])(data|train|optim|runtime|diffusion|model)\.(\w+)")
    named = {m.groups() for r in rules for m in pattern.finditer(f"{r.cause} {r.fix}")}
    assert ("data", "max_items") in named and ("train", "batch_per_gpu") in named
    for section, name in sorted(named):  # data.workers came back with the streaming path: checked here too
        assert name in {f.name for f in dataclasses.fields(getattr(cfg, section))}, f"{section}.{name}"
    assert ("data", "workers") in named


def test_a_lightning_job_whose_ranks_all_joined_is_no_hang():
    assert "lightning-rendezvous-hang" not in _rules("lightning-joined.log")


def test_qacct_of_a_job_stopped_at_h_rt_names_the_time_limit():
    found = {f.rule: f for f in diagnose(gather(str(LOGS / "sge-h-rt.qacct")))}
    assert "the time limit (h_rt)" in found["qacct-limit"].cause and "ran 172802 s" in found["qacct-limit"].cause


def test_sizes_in_every_form_the_schedulers_print():
    from diffscale.doctor.rules_accounting import size_bytes

    # sacct (MaxRSS, ReqMem per node / per CPU) and qacct (maxvmem with a byte unit)
    assert size_bytes("251.30G") == int(251.30 * 2**30) and size_bytes("256Gn") == 256 * 2**30
    assert size_bytes("4Gc") == 4 * 2**30 and size_bytes("4000M") == 4000 * 2**20
    assert size_bytes("291.723MB") == int(291.723 * 2**20) and size_bytes("0.000B") == 0
    assert size_bytes("lots") is None


def test_a_time_limit_after_a_hang_is_its_consequence_with_no_advice_of_more_time():
    findings = {f.rule: f for f in diagnose(gather(str(LOGS / "lightning-hang-one-member.log")))}
    assert list(findings) == ["lightning-rendezvous-hang", "slurm-time-limit"]
    limit = findings["slurm-time-limit"]
    assert limit.title == "SLURM time limit reached (a consequence of the hang)"
    assert limit.cause == ("the job hung (Lightning hung at start-up (rendezvous incomplete)) and sat idle until its "
                           "time limit ended it")
    assert "requeue" not in limit.fix.replace("no requeue", "") and "--time" not in limit.fix
    # without a hang, the time limit keeps its own advice
    alone = {f.rule: f for f in diagnose(gather(str(LOGS / "slurm-time-limit.log")))}
    assert "--requeue" in alone["slurm-time-limit"].fix


def test_a_job_id_s_time_limit_comes_after_the_hang_that_caused_it():
    """`doctor JOBID` reads scontrol's record (TIMEOUT) before the job's log (the hang): the
    cause is still listed first, so 'fix the hang above' points at it."""
    from diffscale.doctor.sources import Evidence

    log = LOGS / "lightning-hang-one-member.log"
    ev = Evidence(texts=[("scontrol show job 48214", "JobId=48214 JobState=TIMEOUT Reason=TimeLimit ExitCode=0:0"),
                         (str(log), log.read_text())])
    assert [f.rule for f in diagnose(ev)][:2] == ["lightning-rendezvous-hang", "slurm-time-limit"]


def test_a_running_job_s_silent_log_is_diagnosed_as_a_hang(tmp_path):
    import os
    import time

    log = tmp_path / "job-48214.out"
    log.write_text((LOGS / "lightning-hang-running.log").read_text())
    assert "lightning-rendezvous-hang" not in _rules_of(log)  # written just now: still starting, perhaps
    os.utime(log, (time.time() - 1200, time.time() - 1200))
    hang = next(f for f in diagnose(gather(str(log))) if f.rule == "lightning-rendezvous-hang")
    assert hang.cause.startswith("1 of 8 ranks reached Lightning's rendezvous and the log has been silent for 20 min "
                                 "since (the job is still running, hung): the other nodes never started: no srun")
    assert hang.fix.endswith("cancel this job, it will not recover")


def _rules_of(path: Path) -> list[str]:
    return [f.rule for f in diagnose(gather(str(path)))]


def test_a_user_s_own_trainer_gets_no_diffscale_flags():
    user = next(f for f in diagnose(gather(str(LOGS / "cuda-oom-user.log"))) if f.rule == "cuda-oom")
    assert "--set" not in user.fix and "--precision" not in user.fix
    assert user.fix.startswith("lower the batch size per GPU in your script")
    ours = next(f for f in diagnose(gather(str(LOGS / "cuda-oom.log"))) if f.rule == "cuda-oom")
    assert "--set train.batch_per_gpu=32" in ours.fix
