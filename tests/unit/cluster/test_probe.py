"""diffscale probe: a real command measured from /proc, progress lines, and the bad inputs."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from diffscale.cli import main
from diffscale.cluster.probe.result import load, parse_progress

TRAINER = textwrap.dedent("""
    import multiprocessing as mp, sys, time
    def worker(mib):
        data = bytearray(mib * 2**20)
        for i in range(0, len(data), 4096): data[i] = 1
        time.sleep(60)
    if __name__ == "__main__":
        blob = bytearray(64 * 2**20)
        for i in range(0, len(blob), 4096): blob[i] = 1
        workers = [mp.get_context("fork").Process(target=worker, args=(32,)) for _ in range(2)]
        for w in workers: w.start()
        for k in range(1, 1000):
            sys.stderr.write(f"\\rEpoch 0:  {k}%|#   | {k}/100 [00:01<00:06, 8.91it/s, v_num=0]")
            time.sleep(0.1)
""")


@pytest.mark.parametrize("line,rate,total", [
    ("Epoch 0:  45%|####5     | 45/100 [00:05<00:06, 8.91it/s, v_num=0]", 8.91, 100),
    ("Epoch 3:  12%|#2        | 12/100 [00:18<02:12, 1.52s/it, loss=0.3]", 1 / 1.52, 100),
    ("45it [00:05, 8.91it/s]", 8.91, None),
    ("Epoch 0/9  45/100 0:00:05 • 0:00:06 8.91it/s v_num: 0", 8.91, 100),
])
def test_progress_lines_give_steps_per_second(line, rate, total):
    found = parse_progress(line)
    assert found is not None and found.steps_per_s == pytest.approx(rate) and found.total == total


def test_a_non_progress_line_is_none():
    assert parse_progress("GPU available: True (cuda), used: True") is None


def test_a_real_command_is_measured_per_process(tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text(TRAINER)
    assert main(["probe", "--seconds", "5", "--out", str(tmp_path / "run"), "--", sys.executable, str(script)]) == 0
    result = load(tmp_path / "run")
    assert result.ended == "limit" and result.steps_per_s == pytest.approx(8.91)
    assert result.measure.startswith("PSS")  # this kernel has smaps_rollup
    assert len(result.workers) == 2 and result.workers_at_once == 2
    # each worker touched 32 MiB of its own; the main process's 64 MiB are shared copy-on-write
    assert all(w.uss_bytes is not None and w.uss_bytes >= 30 * 2**20 for w in result.workers)
    assert result.tree_peak_bytes >= 64 * 2**20 + 2 * 30 * 2**20
    assert result.gpu_bytes is None and result.gpu_note.startswith("not measured")
    out = capsys.readouterr().out
    assert "memory measure: PSS" in out and "children (loader workers): 2 seen, 2 at once" in out
    assert json.loads((tmp_path / "run" / "probe.json").read_text())["version"] == 1
    # plan of the same run directory reads the probe stored there, without --probe
    assert main(["plan", "--cluster", "nyu-torch", "--account", "a", "--out", str(tmp_path / "run"), "--",
                 sys.executable, str(script)]) == 0
    said = "".join(capsys.readouterr().out.split())  # the table wraps long cells
    assert f"probe{tmp_path / 'run' / 'probe.json'}(PSS)" in said


@pytest.mark.parametrize("argv,message", [
    (["no-such-trainer-xyz", "--epochs", "1"], "command 'no-such-trainer-xyz' not found: it is not on PATH"),
    ([sys.executable, "-c", "print('ready')"], "the command exited at once (exit 0 after"),
    ([sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"], "the command failed (exit 3 after"),
    ([sys.executable, "-c", "import time; time.sleep(30)"], "the command printed nothing in 5 s"),
])
def test_bad_commands_are_one_line_and_exit_2(tmp_path, capsys, argv, message):
    assert main(["probe", "--seconds", "5", "--out", str(tmp_path / "run"), "--", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run" / "probe.json").exists()


@pytest.mark.parametrize("args,message", [
    (["--seconds", "7200", "--", "python", "t.py"], "--seconds 7200 is out of range: a probe runs 5 to 1800 s"),
    (["--"], "nothing to probe"),
])
def test_bad_probe_flags(tmp_path, capsys, args, message):
    assert main(["probe", "--out", str(tmp_path / "r"), *args]) == 2
    assert message in capsys.readouterr().err


def test_a_probe_job_over_the_partition_limit_is_refused(tmp_path, capsys):
    from cluster_fixtures import FIXTURES

    profile = str(FIXTURES / "slurm-test.yaml")
    assert main(["probe", "--cluster", profile, "--partition", "short", "--seconds", "60", "--out",
                 str(tmp_path / "r"), "--", "python", "t.py"]) == 2
    assert "a probe of 60 s needs a 360 s job, over partition 'short''s limit of 60 s" in capsys.readouterr().err


def test_the_probe_file_must_be_readable(tmp_path, capsys):
    bad = tmp_path / "probe.json"
    bad.write_text("{\"version\": 9}")
    assert main(["plan", "--cluster", "nyu-torch", "--probe", str(bad), "--out", str(tmp_path / "r"), "--",
                 "python", "t.py"]) == 2
    assert "is not a probe result this diffscale can read (version 9" in capsys.readouterr().err


def _fake_process(proc, pid: int, ppid: int, rss_kib: int, pss_kib: int | None) -> None:
    base = proc / str(pid)
    base.mkdir(parents=True, exist_ok=True)
    (base / "status").write_text(f"Name:\tpython\nPPid:\t{ppid}\nVmRSS:\t{rss_kib} kB\nThreads:\t2\n")
    (base / "cmdline").write_bytes(b"python\0train.py\0")
    (base / "stat").write_text(f"{pid} (python) S {ppid} 1 1 0\n")
    rollup = base / "smaps_rollup"
    if pss_kib is None:
        rollup.unlink(missing_ok=True)
    else:
        rollup.write_text(f"Rss:\t{rss_kib} kB\nPss:\t{pss_kib} kB\nPrivate_Clean:\t0 kB\nPrivate_Dirty:\t10 kB\n")


def test_a_worker_exiting_mid_sample_does_not_flip_the_memory_measure(tmp_path):
    from diffscale.cluster.probe.procfs import MEASURE_PSS, TreeWatch

    proc = tmp_path / "proc"
    _fake_process(proc, 100, 1, rss_kib=900_000, pss_kib=500_000)
    _fake_process(proc, 101, 100, rss_kib=800_000, pss_kib=200_000)
    watch = TreeWatch(100, proc)
    watch.sample()
    _fake_process(proc, 101, 100, rss_kib=800_000, pss_kib=None)  # exiting: status still there, smaps_rollup gone
    watch.sample()
    assert watch.measure == MEASURE_PSS
    assert watch.peaks[101].memory == 200_000 * 1024  # its RSS never mixed in
    assert watch.tree_peak == 700_000 * 1024
    rss_only = TreeWatch(101, proc)  # a kernel without smaps_rollup: RSS throughout
    rss_only.sample()
    assert rss_only.measure.startswith("RSS") and rss_only.peaks[101].memory == 800_000 * 1024
