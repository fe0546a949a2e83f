"""Seeing a run: ``status`` of a local run, ``report``, ``env``, ``--version``, GPU fields from
NVML in metrics / TensorBoard / the progress line, preview grids in TensorBoard, the W&B and
MLflow trackers in their offline / file modes, the model card of ``export``, the Python API."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
from rich.console import Console

from diffscale.cli import main
from diffscale.runtime.gpustats import GpuStats, open_gpu_stats
from diffscale.training.telemetry import Telemetry

from helpers import fake_run, micro_args, required


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A micro run with a preview grid at steps 4 and 8, logging to MLflow's file store."""
    run = tmp_path_factory.mktemp("views") / "run"
    assert main(["train", "--out", str(run), *micro_args("train.sample_every=4", "logging.mlflow=true")]) == 0
    return run


def test_status_of_a_local_run_shows_step_rate_checkpoint_and_sample(trained, capsys):
    capsys.readouterr()
    assert main(["status", str(trained)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"run {trained}: step 8/8 (100 %)"
    assert re.fullmatch(r"last logged \d+ s ago: loss \d+\.\d{4}, \d+ samples/s", out[1])
    assert "finished" in out
    assert "newest checkpoint: step_00000008 (" in "\n".join(out)
    assert f"last sample: {trained / 'samples' / 'step00000008.png'} (" in "\n".join(out)


def test_status_of_an_unfinished_run_gives_the_eta_and_gpus(tmp_path, capsys):
    run = fake_run(tmp_path / "run")
    (run / "jobs.json").unlink()  # a local run
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join(lines[:3]) + "\n{cut by a kil")  # at step 15 of 40
    (run / "checkpoints" / "step_00000040").rename(run / "checkpoints" / "step_00000010")
    assert main(["status", str(run)]) == 0
    out = capsys.readouterr().out
    assert f"run {run}: step 15/40 (38 %)" in out and "newest checkpoint: step_00000010 (" in out
    assert "eta 25 s to the step that invocation stops at" in out
    assert "gpus: gpu0 90% 1.0 GB, gpu1 91% 2.0 GB" in out


def test_status_of_a_folder_without_a_run_is_one_error_line(tmp_path, capsys):
    assert main(["status", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"error: '{tmp_path}' holds no training records (metrics.jsonl) and no checkpoints -- pass the "
                   "--out folder of a run that has started (`diffscale train --out RUN_DIR`)")
    assert main(["status", str(tmp_path / "nope")]) == 2
    assert "run dir" in capsys.readouterr().err


def test_report_is_one_self_contained_page_of_the_run(trained, tmp_path, capsys):
    out = tmp_path / "r.html"
    assert main(["report", str(trained), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    page = out.read_text()
    assert not re.search(r"(src|href)=\"(?!data:|#)", page) and "http" not in page.replace("http://host", "")
    images = re.findall(r'<img alt="([^"]+)"[^>]*src="data:image/png;base64,', page)
    assert images[:3] == ["Loss", "Learning rate", "Throughput"]
    assert "samples at step 4" in images and "samples at step 8" in images
    assert "no GPU utilisation recorded" in page  # a CPU run
    assert "a local run: nothing was submitted" in page and "mlflow: true" in page  # jobs, the resolved config
    assert "CPU and memory" in page  # system.json written by train


def test_report_of_a_folder_that_is_not_writable_target_is_one_line(trained, tmp_path, capsys):
    (tmp_path / "file").write_text("")
    assert main(["report", str(trained), "--out", str(tmp_path / "file" / "r.html")]) == 2
    assert capsys.readouterr().err.startswith("error: --out")


def test_env_is_a_markdown_report_that_works_without_gpu_or_job(monkeypatch, capsys):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_JOB_PARTITION", "gpu-h100")
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "8")
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value")
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# System report (")
    for heading in ("## Host", "## GPUs", "## CPU and memory", "## Scheduler job", "## Software", "## Environment"):
        assert f"\n{heading}\n" in out or out.startswith(heading)
    assert "| GPUs | no GPU (CUDA is not available to PyTorch) |" in out  # this CPU machine
    assert "| scheduler | SLURM |" in out and "| partition | gpu-h100 |" in out and "| CPUs per task | 8 |" in out
    assert "| NCCL_DEBUG | INFO |" in out and "hf_secret_value" not in out
    assert re.search(r"\| physical cores \| \d+ \|", out) and "| PyTorch |" in out and "| diffusers |" in out


def test_version(capsys):
    from diffscale.version import __version__

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"diffscale {__version__}"


class _FakeNvml(types.ModuleType):
    """pynvml's calls that gpustats makes, for two GPUs."""

    def __init__(self) -> None:
        super().__init__("pynvml")
        self.shut = False

    def nvmlInit(self): pass  # noqa: E704
    def nvmlShutdown(self): self.shut = True  # noqa: E704
    def nvmlDeviceGetCount(self): return 2  # noqa: E704
    def nvmlDeviceGetHandleByIndex(self, i): return i  # noqa: E704
    def nvmlDeviceGetUtilizationRates(self, h): return types.SimpleNamespace(gpu=87 + h)  # noqa: E704
    def nvmlDeviceGetMemoryInfo(self, h): return types.SimpleNamespace(used=(h + 1) * 2**30, total=80 * 2**30)  # noqa


def test_gpu_fields_reach_metrics_tensorboard_and_the_progress_line(tmp_path, monkeypatch):
    from PIL import Image
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    nvml = _FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # only the second card is this process's
    said: list[str] = []
    stats = open_gpu_stats(True, said.append)
    assert said == [] and isinstance(stats, GpuStats)
    console = Console(record=True, width=200)
    telemetry = Telemetry(tmp_path, enabled=True, total_steps=10, start_step=0, console=console, gpus=stats)
    telemetry.log({"step": 5, "total_steps": 10, "loss": 0.5, "lr": 1e-3, "samples_per_s": 100.0})
    Image.new("RGB", (20, 10), (255, 0, 0)).save(tmp_path / "step00000005.png")
    telemetry.images([tmp_path / "step00000005.png"], 5)
    telemetry.close()
    record = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert record["gpu0_util_pct"] == 88.0 and record["gpu0_mem_mb"] == 2048.0 and record["gpu0_mem_pct"] == 2.5
    assert "gpu1_util_pct" not in record and nvml.shut
    assert "gpu0 88% 2.0 GB" in console.export_text()
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"images": 0})
    events.Reload()
    assert events.Scalars("gpu/gpu0_util_pct")[0].value == 88.0
    assert events.Images("samples/preview")[0].width == 20


def test_without_nvml_there_are_no_gpu_fields_and_it_is_said_once(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed
    said: list[str] = []
    assert open_gpu_stats(True, said.append) is None
    assert said == ["note: GPU utilisation and memory are not recorded: nvidia-ml-py is not installed -- "
                    "pip install nvidia-ml-py (or diffscale[gpu])"]
    assert open_gpu_stats(False, said.append) is None and len(said) == 1  # a CPU run: nothing to say


def test_preview_grids_and_mlflow_records_of_a_training_run(trained):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(trained / "tb"), size_guidance={"images": 0})
    events.Reload()
    assert [e.step for e in events.Images("samples/preview")] == [4, 8]
    run_id = json.loads((trained / ".tracker-ids.json").read_text())["mlflow"]
    losses = list((trained / "mlruns").glob(f"*/{run_id}/metrics/loss"))
    assert len(losses) == 1 and [int(line.split()[2]) for line in losses[0].read_text().splitlines()] == [2, 4, 6, 8]
    assert len(list((trained / "mlruns").glob(f"*/{run_id}/artifacts/samples/step*.png"))) == 2
    assert (losses[0].parents[1] / "params" / "train.steps").read_text() == "8"


def test_wandb_offline_run_is_written_in_the_run_folder(tmp_path):
    required("wandb")
    run = tmp_path / "run"
    assert main(["train", "--out", str(run), *micro_args("logging.wandb=true", steps=2)]) == 0
    offline = list((run / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(offline) == 1 and json.loads((run / ".tracker-ids.json").read_text())["wandb"] in offline[0].name


def test_a_tracker_that_is_on_but_not_installed_is_one_error_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)
    assert main(["train", "--out", str(tmp_path / "run"), *micro_args("logging.wandb=true", steps=2)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: logging.wandb is on but the wandb package is not installed")
    assert err[0].endswith("-- pip install 'diffscale[wandb]', or set logging.wandb=false")


@pytest.mark.parametrize("override, message", [
    ("logging.mlflow_tracking_uri=mlruns", "config logging.mlflow_tracking_uri: 'mlruns' has no scheme -- use e.g. "
                                           "http://host:5000 or file:/abs/path/mlruns, or leave it empty"),
    ("logging.wandb_project=team/proj", "config logging.wandb_project: 'team/proj' is not a usable W&B project name"),
    ("logging.wandb_mode=cloud", "config logging.wandb_mode: 'cloud' is not one of offline, online"),
])
def test_tracker_settings_are_validated(override, message, capsys):
    assert main(["train", "--dry-run", "--set", override]) == 2
    assert capsys.readouterr().err.startswith(f"error: {message}")


def test_export_writes_a_model_card_beside_the_weights(trained, tmp_path, capsys):
    out = tmp_path / "exported"
    assert main(["export", str(trained), "--diffusers", str(out)]) == 0
    assert f"model card: {out / 'README.md'}" in capsys.readouterr().out
    card = (out / "README.md").read_text()
    assert "| preset | tiny |" in card and "| data | `builtin:numerals` |" in card
    assert "| steps | 8 of 8 (EMA weights" in card and re.search(r"\| training loss .* \| \d+\.\d{4} \|", card)
    assert "DDPMPipeline.from_pretrained" in card and "![preview grid at step 8](samples.png)" in card
    assert (out / "samples.png").is_file() and (out / "diffscale_config.yaml").is_file()
    assert (out / "model_index.json").is_file()


def test_the_python_api_is_exported_without_importing_torch(trained, tmp_path):
    import diffscale

    files = diffscale.sample_run(trained, n=2, steps=2, out=tmp_path / "s.png", console=Console(file=None))
    assert files == [tmp_path / "s.png"] and files[0].is_file()
    assert diffscale.get_preset("tiny").preset == "tiny" and callable(diffscale.train_run)
    code = "import diffscale, sys; print('torch' in sys.modules, sorted(diffscale.__all__))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.startswith("False") and "'train_run'" in done.stdout and "'sample_run'" in done.stdout
