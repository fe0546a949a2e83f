"""Profiles and paths shared by the cluster unit tests (imported as a module: conftest.py is not)."""

from __future__ import annotations

from pathlib import Path

from diffscale.cluster.profile_io import load_profile
from diffscale.cluster.profiles import ClusterProfile

FIXTURES = Path(__file__).parent / "fixtures"

# A run directory no script may mangle (submitit's weird_tmp_path idea): spaces, both
# quotes, $, backticks, a glob, a semicolon and a newline.
HOSTILE_NAME = "we ird's \"dir\" $HOME `touch pwned` *;x\nline"


def fixture_profile(name: str) -> ClusterProfile:
    return load_profile(str(FIXTURES / f"{name}.yaml"))
