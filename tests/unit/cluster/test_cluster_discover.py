"""discover's parsers on outputs captured from the test SLURM and Grid Engine; what they
produce must load back through the profile loader (what plan reads)."""

from __future__ import annotations

import json

import yaml

from diffscale.cluster.profiles.discover import sge_profile, slurm_profile
from diffscale.cluster.profiles.loading import dump_profile, profile_from_dict
from diffscale.cluster.profiles.types import GpuScope

from cluster_fixtures import FIXTURES


def test_slurm_partitions_from_scontrol():
    p = slurm_profile("t", (FIXTURES / "scontrol-partitions.txt").read_text(),
                      (FIXTURES / "scontrol-nodes.txt").read_text())
    assert [x.name for x in p.partitions] == ["cpu", "gpu", "short"] and p.default_partition == "cpu"
    short = p.partition("short")
    assert (short.cpus_per_node, short.mem_per_node_gb, short.gpus_per_node, short.max_time_s) == (4, 8.0, 2, 60)
    assert p.partition("cpu").max_time_s is None
    # what a job without --time gets: DefaultTime, or MaxTime where DefaultTime is NONE
    assert (p.partition("cpu").default_time, short.default_time) == ("UNLIMITED", "00:01:00")
    partitions = (FIXTURES / "scontrol-partitions.txt").read_text()
    partitions = partitions.replace("DefaultTime=NONE", "DefaultTime=01:00:00", 1)
    cpu = slurm_profile("t", partitions, (FIXTURES / "scontrol-nodes.txt").read_text()).partition("cpu")
    assert cpu.default_time == "01:00:00"
    assert profile_from_dict(yaml.safe_load(dump_profile(p))).partition("cpu").default_time == "UNLIMITED"
    assert profile_from_dict(yaml.safe_load(dump_profile(p))).partition("short").max_time_s == 60


def test_sge_queue_pes_and_gpu_complex_from_qconf():
    outputs = json.loads((FIXTURES / "qconf-outputs.json").read_text())
    p = sge_profile("t", lambda argv: outputs[" ".join(argv)])
    assert (p.sge.pe_single_host, p.sge.pe_multi_host, p.sge.gpu_scope, p.sge.notify_s) == \
        ("smp", "mpi", GpuScope.JOB, 5)
    q = p.partition("all.q")
    assert (q.submit_name, q.gpus_per_node, q.cpus_per_node, q.max_time_s) == ("all.q", 2, 2, None)
    assert q.default_time == "UNLIMITED"  # h_rt INFINITY: a job without -l h_rt runs unlimited
    assert profile_from_dict(yaml.safe_load(dump_profile(p))).sge.pe_multi_host == "mpi"
