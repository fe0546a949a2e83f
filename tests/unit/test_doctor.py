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
    "nonfinite-skipped.jsonl": ("nonfinite-skipped", "5 optimizer steps", "optim.lr"),
    "data-bound.json": ("data-bound", "busy only 31% of the time and 58%", "--recipe fast"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_captured_log_is_recognised(name):
    rule, cause, fix = CASES[name]
    findings = {f.rule: f for f in diagnose(gather(str(LOGS / name)))}
    assert rule in findings, f"{name}: found {sorted(findings)}"
    assert cause in findings[rule].cause
    assert fix in findings[rule].fix
    assert findings[rule].origin == str(LOGS / name)


def test_every_rule_has_a_captured_log():
    rules = {r.name for r in signatures.TEXT_RULES} | {r.name for r in signatures.RECORD_RULES}
    assert rules == {rule for rule, _, _ in CASES.values()}


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
    for section, name in sorted(named):
        assert name in {f.name for f in dataclasses.fields(getattr(cfg, section))}, f"{section}.{name}"
    assert not any("data.workers" in f"{r.cause} {r.fix}" for r in rules)
