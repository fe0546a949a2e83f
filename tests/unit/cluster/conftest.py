"""Shared fixtures of the cluster unit tests (helpers: cluster_fixtures.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster_fixtures import HOSTILE_NAME


@pytest.fixture
def hostile_dir(tmp_path: Path) -> Path:
    path = tmp_path / HOSTILE_NAME
    path.mkdir()
    return path
