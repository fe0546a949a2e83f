#!/usr/bin/env bash
# The data-set suite on a GPU machine, across calls (python -m benchmarks.suite.defaults ARGS):
# the runs a previous call finished come in as a tarball (CARRY=FILE, in the tree) and are reused,
# the suite runs until BUDGET_S seconds have passed (the runs it did not finish are trained by the
# next call), and every finished run's result.json and metrics.jsonl go back as one tarball.
# Writes $OUT/suite-runs.tgz (pass it as CARRY next time), $OUT/suite.json and .md (when the
# suite got to its end) and $OUT/suite.log.
# Usage (repository root): OUT=DIR [CARRY=FILE] [BUDGET_S=540] bash scripts/gpu/suite_defaults.sh --preset medium ...
set -uo pipefail
OUT=${OUT:?set OUT to the folder the results go to}
WORK=${WORK:-/tmp/diffscale-suite}
source scripts/gpu/env.sh  # PY, PYTHONPATH, carried wheels, NCCL and allocator settings
export PYTHONUNBUFFERED=1
mkdir -p "$OUT" "$WORK/out"
if [ -n "${CARRY:-}" ]; then tar -xzf "$CARRY" -C "$WORK/out"; fi
timeout --signal=INT --kill-after=20 "${BUDGET_S:-540}" "$PY" -m benchmarks.suite.defaults "$@" --out "$WORK/out" \
  --data-dir "$WORK/data" > "$OUT/suite.log" 2>&1
echo "suite exit $?" >> "$OUT/suite.log"
(cd "$WORK/out" && find runs -name result.json -o -name metrics.jsonl | tar -czf "$OUT/suite-runs.tgz" -T -)
for f in suite.json suite.md; do [ -f "$WORK/out/$f" ] && cp "$WORK/out/$f" "$OUT/"; done
provenance >> "$OUT/suite.log"
tail -40 "$OUT/suite.log"
