from diffscale.runtime.resources import GIB, cpus_for_rank, worker_budget


def test_auto_workers_follow_the_cpus_of_the_rank():
    budget = worker_budget(-1, cpus=16, host_memory=512 * GIB, ranks_on_host=4)
    assert budget.workers == 8  # capped
    assert worker_budget(-1, cpus=4, host_memory=512 * GIB, ranks_on_host=4).workers == 3


def test_the_oom_killed_job_gets_fewer_workers():
    # 4 GPUs x 8 workers on a 256 GB node, each process holding a 6 GiB data set
    budget = worker_budget(8, cpus=16, host_memory=256 * GIB, ranks_on_host=4, data_bytes=6 * GIB)
    assert budget.workers == 7  # (64 - 3 - 6) // 7 = 7 < 8
    assert "8 requested, 7 fit" in budget.reason
    assert worker_budget(8, cpus=16, host_memory=64 * GIB, ranks_on_host=4, data_bytes=6 * GIB).workers == 1


def test_cpus_for_rank_reads_the_scheduler():
    assert cpus_for_rank(4, {"SLURM_CPUS_PER_TASK": "12"}) == 12
    assert cpus_for_rank(2, {"NSLOTS": "1"}) == 1
