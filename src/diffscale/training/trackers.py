"""Experiment trackers the ``logging:`` section turns on: Weights & Biases and MLflow.

Each receives what TensorBoard receives (the numeric fields of every training record, and
the preview grids) from :class:`~diffscale.training.telemetry.Telemetry` on rank 0. A resumed run
logs into the same tracker run: its id is kept in the run folder (``.tracker-ids.json``).
A tracker that is on but not installed stops the run before its first step with the fix.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from pathlib import Path
from typing import Any, Protocol

from diffscale.config.trackers import LoggingConfig
from diffscale.errors import UserError
from diffscale.io.atomic import write_text

IDS_FILE = ".tracker-ids.json"


class Tracker(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def image(self, path: Path, step: int) -> None: ...

    def close(self) -> None: ...


def _ids(run_dir: Path) -> dict[str, str]:
    try:
        data = json.loads((run_dir / IDS_FILE).read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _remember(run_dir: Path, name: str, run_id: str) -> None:
    ids = {**_ids(run_dir), name: run_id}
    write_text(run_dir / IDS_FILE, json.dumps(ids))


def _flat(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"train": {"steps": 8}}`` -> ``{"train.steps": "8"}`` (MLflow params are flat strings)."""
    out: dict[str, str] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = str(value)
    return out


def _require(module: str, flag: str, extra: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise UserError(f"{flag} is on but the {module} package is not installed ({exc})",
                        f"pip install 'diffscale[{extra}]', or set {flag}=false") from exc


class WandbTracker:
    def __init__(self, cfg: LoggingConfig, run_dir: Path, config: dict[str, Any]) -> None:
        wandb = _require("wandb", "logging.wandb", "wandb")
        run_id = _ids(run_dir).get("wandb") or secrets.token_hex(4)  # W&B run ids: lowercase letters, digits
        # The job log already has the console and metrics.jsonl the GPU readings: W&B's own
        # console capture and system sampler would only duplicate them.
        settings = wandb.Settings(console="off", x_disable_stats=True, silent=True, save_code=False)
        self._run = wandb.init(project=cfg.wandb_project, entity=cfg.wandb_entity or None, mode=cfg.wandb_mode.value,
                               dir=str(run_dir), id=run_id, resume="allow", name=run_dir.name, config=config,
                               settings=settings)
        self._wandb = wandb
        # Evaluations are plotted against their own step: W&B drops a log at a step below the run's
        # newest, which a `diffscale eval` of an earlier checkpoint (or of a finished run) would be.
        self._run.define_metric("eval/step")
        self._run.define_metric("eval/*", step_metric="eval/step")
        _remember(run_dir, "wandb", run_id)

    def log(self, metrics: dict[str, float], step: int) -> None:
        if metrics and all(k.startswith("eval/") for k in metrics):
            self._run.log({**metrics, "eval/step": step})
        else:
            self._run.log(metrics, step=step)

    def image(self, path: Path, step: int) -> None:
        self._run.log({"samples": self._wandb.Image(str(path), caption=path.name)}, step=step)

    def close(self) -> None:
        self._run.finish()


class MlflowTracker:
    def __init__(self, cfg: LoggingConfig, run_dir: Path, config: dict[str, Any]) -> None:
        uri = cfg.mlflow_tracking_uri or (run_dir.resolve() / "mlruns").as_uri()
        if uri.startswith("file:"):
            # MLflow 3 keeps the file store in maintenance and refuses it unless asked: it is the
            # store that needs no server and no database, which a compute node has.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        _require("mlflow", "logging.mlflow", "mlflow")
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient

        self._client = MlflowClient(tracking_uri=uri)
        self._metric = Metric
        run_id = _ids(run_dir).get("mlflow")
        if run_id is None:
            found = self._client.get_experiment_by_name(cfg.mlflow_experiment)
            experiment = found.experiment_id if found else self._client.create_experiment(cfg.mlflow_experiment)
            run_id = self._client.create_run(experiment, run_name=run_dir.name).info.run_id
            params = [Param(k, v[:6000]) for k, v in _flat(config).items()]
            for start in range(0, len(params), 100):  # log_batch takes at most 100 params per call
                self._client.log_batch(run_id, params=params[start:start + 100])
            _remember(run_dir, "mlflow", run_id)
        else:
            self._client.update_run(run_id, status="RUNNING")
        self._run_id = run_id

    def log(self, metrics: dict[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        self._client.log_batch(self._run_id, metrics=[self._metric(k, float(v), now, step) for k, v in metrics.items()])

    def image(self, path: Path, step: int) -> None:
        self._client.log_artifact(self._run_id, str(path), artifact_path="samples")

    def close(self) -> None:
        self._client.set_terminated(self._run_id)


def open_trackers(cfg: LoggingConfig, run_dir: Path, config: dict[str, Any]) -> list[Tracker]:
    """The trackers ``cfg`` turns on, started (rank 0 only); [] when none is."""
    trackers: list[Tracker] = []
    if cfg.wandb:
        trackers.append(WandbTracker(cfg, run_dir, config))
    if cfg.mlflow:
        trackers.append(MlflowTracker(cfg, run_dir, config))
    return trackers
