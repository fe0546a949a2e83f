#!/usr/bin/env bash
# Everything the test suite needs, from a fresh clone: the venv, then pytest.
# Tests that need real schedulers start SLURM and Grid Engine themselves (as root,
# from Debian packages; see tests/schedulers/README.md). Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
