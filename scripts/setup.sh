#!/usr/bin/env bash
# Create .venv and install diffscale with its test tools. Idempotent; safe to re-run.
# TORCH_SPEC picks the PyTorch build (default: the 2.13.0 release; on a GPU box a CUDA wheel).
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
[ -x .venv/bin/python ] || python3 -m venv .venv
# Install again when the [project] table (dependencies, the pinned test tools of the `test` extra)
# or TORCH_SPEC changed since the last install, or a tool is missing: a venv kept from an earlier
# run may predate them. pip leaves requirements already met alone: torch is not fetched again.
project_table() {  # [project] as sorted JSON; the whole file where tomllib is missing (Python 3.10)
  .venv/bin/python -c 'import json, tomllib; print(json.dumps(tomllib.load(open("pyproject.toml", "rb"))["project"], sort_keys=True))' \
    2>/dev/null || cat pyproject.toml
}
stamp=.venv/.diffscale-installed
want="$(project_table | sha256sum | cut -d' ' -f1) $TORCH_SPEC"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] \
    || ! .venv/bin/python -c "import diffscale, pytest, mypy, ruff" 2>/dev/null; then
  .venv/bin/pip install -q --disable-pip-version-check "$TORCH_SPEC" -e '.[test]'
  echo "$want" >"$stamp"
fi
