#!/usr/bin/env bash
# The data-set suite on a GPU machine, across calls (python -m benchmarks.suite.defaults ARGS):
# the runs a previous call finished come in as a tarball (CARRY=FILE, in the tree) and are reused,
# the suite runs until BUDGET_S seconds have passed (the runs it did not finish are trained by the
# next call), and every finished run's result.json and metrics.jsonl go back as one tarball.
# The image evaluations' feature networks come in the same way (FEATURES=FILE: a tarball of a data
# cache's quality/ folder, built on any CPU machine by `python -m benchmarks.suite.defaults ...
# --prepare-features` with the same --data-dir, or by an earlier call) and go back as one.
# Writes $OUT/suite-runs.tgz (pass it as CARRY next time), $OUT/features.tgz (as FEATURES),
# $OUT/suite.json and .md (when the suite got to its end) and $OUT/suite.log.
# Usage (repository root): OUT=DIR [CARRY=FILE] [FEATURES=FILE] [BUDGET_S=540] \
#   bash scripts/gpu/suite_defaults.sh --preset medium ...
set -uo pipefail
OUT=${OUT:?set OUT to the folder the results go to}
WORK=${WORK:-/tmp/diffscale-suite}
source scripts/gpu/env.sh  # PY, PYTHONPATH, carried wheels, NCCL and allocator settings
export PYTHONUNBUFFERED=1
export DIFFSCALE_CACHE_DIR=${DIFFSCALE_CACHE_DIR:-$WORK/cache}
mkdir -p "$OUT" "$WORK/out" "$DIFFSCALE_CACHE_DIR"
if [ -n "${CARRY:-}" ]; then tar -xzf "$CARRY" -C "$WORK/out"; fi
if [ -n "${FEATURES:-}" ]; then tar -xzf "$FEATURES" -C "$DIFFSCALE_CACHE_DIR"; fi
timeout --signal=INT --kill-after=20 "${BUDGET_S:-540}" "$PY" -m benchmarks.suite.defaults "$@" --out "$WORK/out" \
  --data-dir "$WORK/data" > "$OUT/suite.log" 2>&1
echo "suite exit $?" >> "$OUT/suite.log"
(cd "$WORK/out" && find runs -name result.json -o -name metrics.jsonl | tar -czf "$OUT/suite-runs.tgz" -T -)
[ -d "$DIFFSCALE_CACHE_DIR/quality" ] \
  && tar -czf "$OUT/features.tgz" -C "$DIFFSCALE_CACHE_DIR" --exclude='*.lock' quality
for f in suite.json suite.md; do [ -f "$WORK/out/$f" ] && cp "$WORK/out/$f" "$OUT/"; done
provenance >> "$OUT/suite.log"
tail -40 "$OUT/suite.log"
