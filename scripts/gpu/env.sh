# Sourced by the GPU measurement scripts: carried wheels (diffusers) and safe NCCL settings.
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site:$PWD/src"
else
  export PYTHONPATH="$PWD/src"
fi
# NVLink multicast stays off on shared hosts; compiled kernels are reused across runs.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-cache
