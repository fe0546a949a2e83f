from diffscale.runtime.resources import GIB, cpus_for_rank, host_memory, worker_budget


def test_auto_workers_follow_the_cpus_of_the_rank():
    budget = worker_budget(-1, cpus=16, host_bytes=512 * GIB, ranks_on_host=4)
    assert budget.workers == 8  # capped
    assert worker_budget(-1, cpus=4, host_bytes=512 * GIB, ranks_on_host=4).workers == 3


def test_the_oom_killed_job_gets_fewer_workers():
    # 4 GPUs x 8 workers on a 256 GiB node, each process holding a 6 GiB data set
    budget = worker_budget(8, cpus=16, host_bytes=256 * GIB, ranks_on_host=4, data_bytes=6 * GIB)
    assert budget.workers == 7  # (64 - 3 - 6) // 7 = 7 < 8
    assert budget.reason == "8 requested, 7 fit: 4 ranks share 256 GiB (~7.0 GiB per worker)"
    assert worker_budget(8, cpus=16, host_bytes=64 * GIB, ranks_on_host=4, data_bytes=6 * GIB).workers == 1
    assert worker_budget(8, cpus=16, host_bytes=16 * GIB, ranks_on_host=4, data_bytes=6 * GIB).workers == 0


def test_the_node_model_counts_ranks_workers_and_their_copies_of_the_data():
    # the arithmetic a user command's loader will need: ranks x (rank + workers x worker)
    node = host_memory(4, workers=8, data_bytes=6 * GIB)
    assert node.node_bytes == 4 * ((3 + 6) + 8 * (1 + 6)) * GIB
    assert node.describe() == "4 ranks x (1 rank ~9.0 GiB + 8 loader workers x ~7.0 GiB) = 260 GiB"
    assert node.workers_that_fit(256 * GIB) == 7
    assert node.workers_that_fit(30 * GIB) == -1  # not even the ranks alone
    assert node.ranks_that_fit(256 * GIB) == 3


def test_resident_data_ranks_start_no_workers():
    node = host_memory(4, data_bytes=64 * GIB)
    assert node.describe() == "4 ranks x ~67.0 GiB = 268 GiB"
    assert node.ranks_that_fit(256 * GIB) == 3


def test_cpus_for_rank_reads_the_scheduler():
    assert cpus_for_rank(4, {"SLURM_CPUS_PER_TASK": "12"}) == 12
    assert cpus_for_rank(2, {"NSLOTS": "1"}) == 1


def test_the_memory_line_s_terms_multiply_to_its_total():
    # 5.14 and 7.34 GiB print as 5.1 and 7.3: the total is theirs, 4 x (5.1 + 8 x 7.3) = 254
    node = host_memory(4, workers=8, rank_bytes=int(5.14 * GIB), worker_bytes=int(7.34 * GIB))
    assert node.describe() == "4 ranks x (1 rank ~5.1 GiB + 8 loader workers x ~7.3 GiB) = 254 GiB"
    assert node.node_bytes / GIB > 255  # the checks keep the exact figure


def test_cpu_threads_leave_the_cores_other_processes_keep_busy(monkeypatch):
    import os

    from diffscale.runtime import resources

    cores = len(os.sched_getaffinity(0))
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    monkeypatch.delenv("NSLOTS", raising=False)
    for busy, expected in [(0.0, cores), (cores - 1, 1), (cores + 3, 1)]:
        monkeypatch.setattr(resources, "busy_elsewhere", lambda busy=busy: busy)
        assert resources.free_cpu_threads(1) == expected
    monkeypatch.setattr(resources, "busy_elsewhere", lambda: 0.0)
    assert resources.free_cpu_threads(cores * 2) == 1  # ranks share the free cores, each at least one
    assert resources.busy_elsewhere() >= 0  # read from this machine's /proc/stat


STAT = """cpu  400 0 100 1500 0 0 0 0 0 0
cpu0 100 0 0 900 0 0 0 0 0 0
cpu1 300 0 100 600 0 0 0 0 0 0
intr 12345
"""
STAT_LATER = """cpu  700 0 100 1700 0 0 0 0 0 0
cpu0 100 0 0 1000 0 0 0 0 0 0
cpu1 400 0 100 700 0 0 0 0 0 0
"""


def test_busy_cores_count_only_the_cpus_this_process_may_use():
    from diffscale.runtime.resources import busy_cores, cpu_times

    # cpu0 was idle for the interval (100 of 100 ticks), cpu1 busy half of it (100 of 200)
    assert busy_cores(cpu_times(STAT, {0, 1}), cpu_times(STAT_LATER, {0, 1})) == 0.5
    assert busy_cores(cpu_times(STAT, {0}), cpu_times(STAT_LATER, {0})) == 0.0  # cpu1's neighbour job is not ours
    assert cpu_times("cpu  1 2 3 4 5 6 7 8\n", {0}) is None  # no per-CPU lines: the caller falls back


def test_a_spinning_process_on_the_only_allowed_core_counts_as_busy():
    """Real processes: a spinner and the measurement share one core."""
    import os
    import subprocess
    import sys

    cpu = min(os.sched_getaffinity(0))
    pin = f"import os; os.sched_setaffinity(0, {{{cpu}}})"
    spinner = subprocess.Popen([sys.executable, "-c", f"{pin}\nwhile True: pass"])
    try:
        out = subprocess.run([sys.executable, "-c", f"{pin}\nimport time; time.sleep(0.5)\n"
                              "from diffscale.runtime.resources import busy_elsewhere; print(busy_elsewhere())"],
                             capture_output=True, text=True, timeout=120, check=True)
    finally:
        spinner.kill()
        spinner.wait()
    assert float(out.stdout) >= 0.5  # the core is the spinner's (and any other load's), not free


def test_runtime_cpu_threads_sets_the_threads_a_cpu_run_uses(tmp_path):
    import torch

    from diffscale.cli import main

    from helpers import micro_args

    before = torch.get_num_threads()
    asked = 2 if before == 1 else 1  # not what the process has already
    try:
        assert main(["train", "--out", str(tmp_path / "run"), "--set", f"runtime.cpu_threads={asked}",
                     *micro_args(steps=2)]) == 0
        assert torch.get_num_threads() == asked
    finally:
        torch.set_num_threads(before)
