#!/usr/bin/env bash
# Everything the test suite needs, from a fresh clone: the venv, the lint and type checks, then
# pytest. Tests that need real schedulers start SLURM and Grid Engine themselves (as root, from
# Debian packages; see tests/schedulers/README.md). Extra args go to pytest.
# DIFFSCALE_CHECKS=0 skips ruff and mypy (e.g. re-running one test file); CI never sets it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ "${DIFFSCALE_CHECKS:-1}" != 0 ]; then
  echo "+ ruff check src tests" >&2
  .venv/bin/python -m ruff check src tests
  echo "+ mypy (src/diffscale; settings in pyproject.toml)" >&2
  .venv/bin/python -m mypy
fi
# Two pytest-xdist workers (DIFFSCALE_TEST_WORKERS=0: none): the tests that use the real schedulers
# all run on one of them (group "schedulers"), in order, while the other takes the rest.
workers=${DIFFSCALE_TEST_WORKERS:-2}
if [ "$workers" != 0 ]; then
  set -- -n "$workers" --dist loadgroup "$@"
fi
exec .venv/bin/python -m pytest "$@"
