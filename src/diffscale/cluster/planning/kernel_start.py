"""Whether a planned training job will start warm or cold: the user's kernel cache (``io/kernels.py``)
holds its network's compiled kernels for the partition's GPU kind and this environment's torch
release, or the job compiles them. Pure: the cache was listed when the workload was made."""

from __future__ import annotations

from diffscale.cluster.planning.workload import DiffscaleRun
from diffscale.config import Recipe, Toggle
from diffscale.io.kernels import torch_part


def start_note(run: DiffscaleRun, gpu_type: str | None, world_size: int) -> str | None:
    """The plan's line on the job's start, or None where it does not compile (compile off, the plain
    recipe) or the cache was not looked at."""
    cache, runtime = run.kernels, run.config.runtime
    if cache is None or runtime.compile == Toggle.OFF or (runtime.compile == Toggle.AUTO
                                                          and runtime.recipe == Recipe.PLAIN):
        return None
    key = run.config.graph_key(world_size)
    builds = cache.builds_of(key, gpu_type, run.config.kernels_built_for())
    same_torch = [b for b in builds if cache.torch_version and b.endswith(torch_part(cache.torch_version))]
    gpu = gpu_type or "its GPU"
    torch_release = f"torch {cache.torch_version}" if cache.torch_version else "this torch"
    if same_torch or (builds and not cache.torch_version):
        how = ("it trains eager while a background process loads them, then switches (runtime.compile_while_training "
               "on)" if runtime.compile_while_training == Toggle.ON else "it compiles from them in seconds, before "
               "its first step")
        return (f"kernel cache: warm -- {cache.root}/{(same_torch or builds)[0]}/{key} holds this network's kernels "
                f"for {gpu} and {torch_release}: {how}")
    if runtime.compile_while_training == Toggle.OFF:
        how = "the job compiles them before its first step (minutes)"
    else:
        how = ("the job trains eager while a background process compiles them, then switches "
               "(runtime.compile_while_training)")
    other = f" (there are kernels of it for {', '.join(builds)})" if builds else ""
    return (f"kernel cache: cold -- no kernels of this network (graph {key}) for {gpu} and {torch_release} in "
            f"{cache.root}{other}: {how}; later jobs of it on any node that mounts the cache start warm")
