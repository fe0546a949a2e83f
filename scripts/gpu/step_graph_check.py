"""Whole-step CUDA graphs on the field task: the same 2,400-step round recorded and eager, side by
side, from the same initial weights and data; how far apart the trained weights end up.

    PYTHONPATH=src python scripts/gpu/step_graph_check.py      (one CUDA GPU)
"""

import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from diffscale import config as C
from diffscale.online import OnlineTrainer


def round_with(setting: str, steps: int = 2400) -> tuple[dict, OnlineTrainer]:
    cfg = C.resolve_config(C.ConfigSources(preset="field-icon", device="cuda",
                                           overrides=[f"runtime.step_graph={setting}"]))
    rng = np.random.default_rng(0)
    trainer = OnlineTrainer(Path(tempfile.mkdtemp()) / "run", cfg, capacity=3840)
    for step in range(48):
        trainer.push(rng.normal(size=(80, 7)), rng.normal(size=(80, 256)), sim_time=600.0 * step)
    assert trainer.ready()
    first = trainer.train_for(steps=100)  # compiles (and records)
    torch.cuda.synchronize()
    start = time.perf_counter()
    record = trainer.train_for(steps=steps)
    torch.cuda.synchronize()
    whole = trainer.runner.whole
    return {"step_graph": setting, "round_s": time.perf_counter() - start, "first_loss": first["loss"],
            "loss": record["loss"], "recordings": whole.recordings if whole else None}, trainer


def main() -> None:
    trainers = {}
    for setting in ("on", "off", "on"):
        record, trainers[setting] = round_with(setting)
        print(record, flush=True)
    on, off = (trainers[s].trainer.net.state_dict() for s in ("on", "off"))
    print(json.dumps({"max_param_diff": max(float((on[k] - off[k]).abs().max()) for k in on),
                      "device": torch.cuda.get_device_name(0), "torch": torch.__version__}))


if __name__ == "__main__":
    main()
