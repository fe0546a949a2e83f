"""Fixtures shared by every test; plain helpers live in tests/helpers.py."""

from __future__ import annotations

import os
import tempfile

import pytest

from helpers import micro_args, run_cli

# Rendered built-in data goes to a folder of this session (the CLI and job subprocesses inherit
# it), not to the user's cache.
os.environ.setdefault("DIFFSCALE_CACHE_DIR", tempfile.mkdtemp(prefix="diffscale-test-cache-"))


@pytest.fixture
def micro():
    return micro_args


@pytest.fixture
def cli():
    return run_cli
