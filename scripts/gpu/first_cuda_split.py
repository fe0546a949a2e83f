"""Where a fresh machine's first CUDA job spends its extra seconds: each stage of getting a GPU
ready (the interpreter, `import torch`, the driver's first context, the first cuBLAS matmul, the
first cuDNN convolution, `import diffusers`) timed in its own new process, the whole ladder twice.
The first pass reads the libraries from disk; the second finds them in the page cache, so the
difference per stage is what the disk cost. Run it as the machine's first CUDA process.

    PYTHONPATH=src python scripts/gpu/first_cuda_split.py [OUT.json]      (one CUDA GPU)
"""

import json
import subprocess
import sys
import time

STAGES = {
    "interpreter": "pass",
    "import torch": "import torch",
    "first CUDA context": "import torch; torch.zeros(1, device='cuda'); torch.cuda.synchronize()",
    "first cuBLAS matmul": ("import torch; a = torch.ones(256, 256, device='cuda', dtype=torch.bfloat16);"
                            " (a @ a).sum().item()"),
    "first cuDNN convolution": ("import torch; x = torch.ones(8, 32, 28, 28, device='cuda', dtype=torch.bfloat16);"
                                " w = torch.ones(32, 32, 3, 3, device='cuda', dtype=torch.bfloat16);"
                                " torch.nn.functional.conv2d(x, w, padding=1).sum().item()"),
    "import diffusers": "import torch, diffusers; from diffusers import UNet2DModel",
}


def timed(code: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - start


def main() -> None:
    passes = [{name: round(timed(code), 2) for name, code in STAGES.items()} for _ in range(2)]
    print(f"{'stage (a new process each, cumulative)':<42} {'first pass':>10} {'second':>8} {'disk':>6}")
    for name in STAGES:
        first, second = passes[0][name], passes[1][name]
        print(f"{name:<42} {first:>9.2f}s {second:>7.2f}s {first - second:>5.1f}s")
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as handle:
            json.dump({"stages": list(STAGES), "first": passes[0], "second": passes[1]}, handle, indent=1)


if __name__ == "__main__":
    main()
