# Sourced by the GPU scripts (repository root): the interpreter, this checkout's sources first (the
# package under src/, the research benchmarks of `python -m benchmarks.NAME` at the root), the
# wheels a host without a package index gets in .whl/ (diffusers), and the settings the recorded
# figures were measured with (NVLink multicast off, expandable segments).
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}"
if ls .whl/*.whl >/dev/null 2>&1; then
  # once a machine: scripts started side by side after a first `source` do not install over each other
  [ -f /tmp/diffscale-wheels/.installed ] || {
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/diffscale-wheels .whl/*.whl \
      && touch /tmp/diffscale-wheels/.installed; }
  export PYTHONPATH="/tmp/diffscale-wheels:$PYTHONPATH"
fi
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True

# Where a figure came from, for the scripts' records: the time, the tree, torch and the GPU, the
# host's CPU and which CPUs share a physical core with this job's first. Jobs pinned side by side
# to "their own" 16 cores share physical cores where the host numbers hyperthreads apart; the same
# job ran 1.7-2 x slower in its pure-Python phases on one two-H200 host than on another (2026-11-30).
provenance() {
  local first
  first=$(taskset -pc $$ 2>/dev/null | sed 's/.*: //; s/[-,].*//')
  echo "$(date -u +%Y-%m-%dT%H:%MZ), tree of $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (modified)')"
  "$PY" -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'CPU')"
  echo "cpu: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1), $(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc) of $(nproc --all) CPUs;" \
    "cpu${first:-0} shares its core with $(cat "/sys/devices/system/cpu/cpu${first:-0}/topology/thread_siblings_list" 2>/dev/null || echo unknown)"
}
