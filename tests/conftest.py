"""Fixtures shared by every test; plain helpers live in tests/helpers.py."""

from __future__ import annotations

import pytest

from helpers import micro_args, run_cli


@pytest.fixture
def micro():
    return micro_args


@pytest.fixture
def cli():
    return run_cli
