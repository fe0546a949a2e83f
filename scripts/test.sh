#!/usr/bin/env bash
# Everything the test suite needs, from a fresh clone: the venv, the lint and type checks, then
# pytest. Tests that need real schedulers start SLURM and Grid Engine themselves (as root, from
# Debian packages; see tests/schedulers/README.md). Extra args go to pytest.
# DIFFSCALE_CHECKS=0 skips ruff and mypy (e.g. re-running one test file); CI never sets it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ "${DIFFSCALE_CHECKS:-1}" != 0 ]; then
  echo "+ ruff check src tests benchmarks" >&2
  .venv/bin/python -m ruff check src tests benchmarks
  echo "+ mypy (src/diffscale, benchmarks; settings in pyproject.toml)" >&2
  .venv/bin/python -m mypy
fi
# Two pytest sessions side by side (DIFFSCALE_TEST_SPLIT=0: one): every test that uses the real
# schedulers (markers slurm, sge) in one, in order, since they wait on jobs and time limits;
# everything else in the other. A session with nothing selected (exit 5) counts as passed.
if [ "${DIFFSCALE_TEST_SPLIT:-1}" = 0 ] || printf '%s\n' "$@" | grep -qx -- '-m'; then
  exec .venv/bin/python -m pytest "$@"
fi
session() {  # name, marker expression, pytest args...
  local name=$1 expr=$2
  shift 2
  set +e  # this session's exit code is read below, not acted on by errexit
  .venv/bin/python -m pytest -m "$expr" "$@" 2>&1 | sed -u "s/^/[$name] /"
  local rc=${PIPESTATUS[0]}
  [ "$rc" = 5 ] && rc=0
  return "$rc"
}
# The two sessions share the cores: one intra-op thread per process (tests that compare runs
# bit for bit set their own), so spinning thread pools do not starve the other session.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# The scheduler tests mostly wait on jobs, so the rest runs on DIFFSCALE_TEST_WORKERS pytest-xdist
# workers (default 2; 0: in one process), a test file per worker at a time (module fixtures such as a
# compiled run are built once).
workers=${DIFFSCALE_TEST_WORKERS:-2}
spread=()
[ "$workers" != 0 ] && spread=(-n "$workers" --dist loadfile)
session schedulers "slurm or sge" "$@" &
schedulers=$!
session rest "not slurm and not sge" "${spread[@]}" "$@" &
rest=$!
rc=0
wait "$schedulers" || rc=$?
wait "$rest" || rc=$?
echo "tests: schedulers session and the rest done (exit $rc)"
exit "$rc"
