#!/usr/bin/env bash
# Create .venv and install diffscale with its test tools. Idempotent; safe to re-run.
# TORCH_SPEC picks the PyTorch build (default: the 2.13.0 release; on a GPU box a CUDA wheel).
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
[ -x .venv/bin/python ] || python3 -m venv .venv
if ! .venv/bin/python -c "import diffscale, pytest" 2>/dev/null; then
  .venv/bin/pip install -q --disable-pip-version-check "$TORCH_SPEC" -e '.[test]'
fi
