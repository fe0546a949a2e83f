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
