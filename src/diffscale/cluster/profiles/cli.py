"""The ``cluster list|show|discover`` verbs: the bundled and discovered profiles, and a profile
written from the live scheduler (registered by :mod:`diffscale.cluster.cli`)."""

from __future__ import annotations

import argparse
import re

from diffscale.errors import UserError
from diffscale.io.paths import file_target

PROFILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
"""A discovered profile's name: also its file name and what --cluster is given."""


def cmd_cluster_list(args: argparse.Namespace) -> int:
    from diffscale.cluster import tables as report
    from diffscale.cluster.profiles.loading import available, load_profile

    report.print_profile_list([load_profile(str(path)) for path in available().values()])
    return 0


def cmd_cluster_show(args: argparse.Namespace) -> int:
    from diffscale.cluster import tables as report
    from diffscale.cluster.profiles.loading import load_profile

    report.print_profile(load_profile(args.name))
    return 0


def cmd_cluster_discover(args: argparse.Namespace) -> int:
    import shutil

    from diffscale.cluster.jobs.scheduler import run
    from diffscale.cluster.profiles.discover import discover
    from diffscale.cluster.profiles.loading import dump_profile, profile_from_dict, profile_to_dict, user_dir
    from diffscale.cluster.profiles.types import SchedulerKind

    if not PROFILE_NAME.fullmatch(args.name):
        raise UserError(f"--name '{args.name}' is not a usable profile name",
                        "use letters, digits and _ . - (starting with a letter or digit), e.g. --name mycluster")
    out = file_target(args.out if args.out else user_dir() / f"{args.name}.yaml", "--out", example="cluster.yaml")
    kind = args.scheduler
    if kind is None:
        if shutil.which("scontrol") and run(["scontrol", "ping"], check=False).returncode == 0:
            kind = "slurm"
        elif shutil.which("qconf") and run(["qconf", "-sql"], check=False).returncode == 0:
            kind = "sge"
        else:
            raise UserError("no scheduler answers here (scontrol ping / qconf -sql failed)",
                            "run discover on the cluster's login node, or pass --scheduler")
    profile = discover(args.name, SchedulerKind(kind), lambda argv: run(argv).stdout)
    # round-trip through the loader: what we write is exactly what plan will accept
    text = dump_profile(profile)
    profile_from_dict(profile_to_dict(profile), source="discovered profile")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(f"# Discovered from the live {kind} scheduler by `diffscale cluster discover`.\n"
                   "# Check it: unknown facts are null; add setup lines (module load ...) and NCCL env.\n" + text)
    print(f"wrote {out} ({len(profile.partitions)} partition(s): {', '.join(p.name for p in profile.partitions)})")
    return 0
