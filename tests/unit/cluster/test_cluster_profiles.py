"""Profile loading and the validation messages a user sees for a broken profile."""

from __future__ import annotations

import pytest
import yaml

from diffscale.cluster.profiles.loading import available, dump_profile, load_profile, profile_from_dict, profile_to_dict
from diffscale.cluster.profiles.types import GpuScope, SchedulerKind
from diffscale.errors import UserError

BUNDLED = ("bu-scc", "purdue-gilbreth", "uchicago-midway3", "dkrz-levante", "nyu-torch")


@pytest.mark.parametrize("name", BUNDLED)
def test_bundled_profiles_load_cite_their_docs_and_round_trip(name):
    profile = load_profile(name)
    assert profile.docs and all(url.startswith("https://") for url in profile.docs)
    again = profile_from_dict(yaml.safe_load(dump_profile(profile)))
    assert profile_to_dict(again) == profile_to_dict(profile)


def test_documented_facts():
    bu = load_profile("bu-scc")
    assert bu.scheduler is SchedulerKind.SGE and bu.sge.pe_single_host == "omp" and bu.sge.pe_multi_host is None
    assert all(p.max_time_s == 48 * 3600 for p in bu.partitions)
    assert dict(bu.partition("any-gpu").resources) == {"gpu_c": "7.0"}
    assert bu.sets_cuda_visible_devices is True
    gil = load_profile("purdue-gilbreth").partition("a100-80gb")
    assert (gil.gpus_per_node, gil.cpus_per_node, gil.max_time_s, gil.gpu_memory_gb) == (4, 64, 48 * 3600, 80)
    mid = load_profile("uchicago-midway3").partition("hcn1-gpu")
    assert (mid.gpus_per_node, mid.gpu_type, mid.cpus_per_node, mid.max_time_s) == (4, "L40S", 32, 2 * 86400)
    lev = load_profile("dkrz-levante").partition("gpu")
    assert (lev.cpus_per_node, lev.gpus_per_node, lev.constraint) == (64, None, "a100_80")
    nyu = load_profile("nyu-torch")
    assert (nyu.partition("l40s").gpus_per_node, nyu.partition("l40s").mem_per_node_gb) == (4, 256)
    assert nyu.partition("h200").gpu_type == "H200"
    # Torch routes by request: no partition names, the GPU family as a node feature
    assert [(p.submit_name, p.constraint) for p in nyu.partitions] == [(None, "l40s"), (None, "h200")]


def test_sites_that_charge_projects_require_an_account():
    required = {name: [req.fact.value for req in load_profile(name).required] for name in BUNDLED}
    assert required == {"bu-scc": [], "purdue-gilbreth": ["account"], "uchicago-midway3": [],
                        "dkrz-levante": ["account"], "nyu-torch": ["account"]}
    assert "`my_slurm_accounts`" in load_profile("nyu-torch").required[0].how


def test_required_as_a_plain_list():
    p = profile_from_dict(_base(required=["account", "time"]))
    assert [(r.fact.value, r.how) for r in p.required] == [("account", None), ("time", None)]


def test_every_bundled_profile_is_listed():
    assert set(BUNDLED) <= set(available())


def _base(**over):
    data = {"name": "x", "scheduler": "slurm", "partitions": {"p": {"gpus_per_node": 4, "max_time": "1-00:00:00"}}}
    data.update(over)
    return data


@pytest.mark.parametrize("data,message", [
    (_base(schedular="slurm"), "cluster profile t.yaml: schedular is not a known field (did you mean 'scheduler'?) -- "
                               "valid fields: name, title, scheduler"),
    (_base(scheduler="pbs"),
     "cluster profile t.yaml: scheduler 'pbs' is not one of slurm, sge -- use one of: slurm, sge"),
    (_base(partitions={}), "cluster profile t.yaml: partitions must map at least one partition name to its facts"),
    (_base(partitions={"p": {"gpus_per_node": "four"}}),
     "cluster profile t.yaml: partitions.p.gpus_per_node must be a whole number >= 0 or null (unknown), got 'four' -- "
     "write e.g. gpus_per_node: 4, or null when the site does not document it"),
    (_base(partitions={"p": {"max_time": "two days"}}),
     "cluster profile t.yaml: partitions.p.max_time 'two days' is not a wall time"),
    (_base(partitions={"p": {"gpu_request": "gpu"}}),
     "cluster profile t.yaml: partitions.p.gpu_request 'gpu' is not one of gpus-per-node, gres"),
    (_base(partitions={"p": {"qos": "a b"}}),
     "cluster profile t.yaml: partitions.p.qos 'a b' has characters a scheduler option cannot carry"),
    (_base(default_partition="q"), "cluster profile t.yaml: default_partition 'q' is not one of the partitions"),
    (_base(scheduler="sge"), "cluster profile t.yaml: sge names no parallel environment"),
    (_base(sge={"pe_single_host": "smp"}), "cluster profile t.yaml: sge is only for scheduler: sge"),
    (_base(partitions={"l40s": {"submit_name": None}, "h200": {"submit_name": None, "constraint": "h200"}}),
     "cluster profile t.yaml: partitions.l40s sets none of submit_name, constraint or gres_type, so a job script "
     "could not tell it from the other partitions -- set submit_name, constraint or gres_type to what the site's "
     "documentation says selects it"),
    (_base(partitions={"a": {"submit_name": "gpu"}, "b": {"submit_name": "gpu"}}),
     "cluster profile t.yaml: partitions.b is selected exactly like partitions.a (--partition=gpu)"),
    (_base(scheduler="sge", sge={"pe_single_host": "smp"}, partitions={"any": {"submit_name": None}, "a40": {
        "submit_name": None, "resources": {"gpu_type": "A40"}}}),
     "cluster profile t.yaml: partitions.any sets none of submit_name or resources"),
    (_base(required=["acount"]), "cluster profile t.yaml: required.acount 'acount' is not one of account, qos, time "
                                 "(did you mean 'account'?)"),
    (_base(required="account"), "cluster profile t.yaml: required must be a list of facts or a mapping"),
])
def test_validation_messages_name_file_field_and_fix(data, message):
    with pytest.raises(UserError) as err:
        profile_from_dict(data, source="t.yaml")
    assert err.value.message.startswith(message)


def test_unknown_cluster_and_partition_messages():
    with pytest.raises(UserError) as err:
        load_profile("purdue-gilbret")
    assert err.value.cause == "unknown cluster 'purdue-gilbret' (did you mean 'purdue-gilbreth'?)"
    with pytest.raises(UserError) as err:
        load_profile("purdue-gilbreth").partition("a100")
    assert err.value.message.startswith("cluster 'purdue-gilbreth' has no partition 'a100' (did you mean 'a100-80gb'?)")


def test_user_profiles_dir_shadows_and_adds(tmp_path, monkeypatch):
    monkeypatch.setenv("DIFFSCALE_CLUSTERS_DIR", str(tmp_path))
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump(_base(name="mine")))
    assert load_profile("mine").partition("p").max_time_s == 86400


def test_sge_section():
    p = profile_from_dict(_base(scheduler="sge",
                                sge={"pe_single_host": "smp", "gpu_scope": "slot", "notify": "00:00:30"}))
    assert p.sge.gpu_scope is GpuScope.SLOT and p.sge.notify_s == 30
