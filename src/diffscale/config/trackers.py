"""The ``logging:`` section: experiment trackers beside metrics.jsonl and TensorBoard.

Both are off unless set, and both work without a network: Weights & Biases writes offline runs
under RUN_DIR/wandb (``wandb sync`` uploads them later; compute nodes often have no internet),
MLflow a file store under RUN_DIR/mlruns unless given a tracking server.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from diffscale.config.errors import fail as _fail


class WandbMode(str, enum.Enum):
    """How Weights & Biases sends its records."""

    OFFLINE = "offline"
    ONLINE = "online"


_URI_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_WANDB_NAME_BAD = re.compile(r"[/\\#?%:]")


@dataclass(kw_only=True)
class LoggingConfig:
    """Optional experiment trackers (``pip install 'diffscale[wandb]'`` / ``'diffscale[mlflow]'``);
    rank 0 logs the training records and the preview grids to each one that is on."""

    wandb: bool = False
    """Log to Weights & Biases (needs the ``wandb`` package)."""
    wandb_project: str = "diffscale"
    """W&B project name."""
    wandb_entity: str = ""
    """W&B team or user (empty: the account's default)."""
    wandb_mode: WandbMode = WandbMode.OFFLINE
    """``offline`` writes RUN_DIR/wandb for a later ``wandb sync``; ``online`` sends as it trains."""
    mlflow: bool = False
    """Log to MLflow (needs the ``mlflow`` or ``mlflow-skinny`` package)."""
    mlflow_tracking_uri: str = ""
    """MLflow tracking URI (``http://host:5000``, ``file:/path/mlruns``, ...); empty: a file store in
    RUN_DIR/mlruns (``mlflow ui --backend-store-uri RUN_DIR/mlruns`` shows it)."""
    mlflow_experiment: str = "diffscale"
    """MLflow experiment the run is filed under (created when missing)."""

    def __post_init__(self) -> None:
        if not self.wandb_project.strip() or _WANDB_NAME_BAD.search(self.wandb_project):
            _fail("logging.wandb_project", f"'{self.wandb_project}' is not a usable W&B project name",
                  "use letters, digits, - and _ (no / \\ # ? % :), e.g. logging.wandb_project=diffscale")
        if not self.mlflow_experiment.strip():
            _fail("logging.mlflow_experiment", "is empty",
                  "name an experiment, e.g. logging.mlflow_experiment=diffscale")
        if self.mlflow_tracking_uri and not _URI_SCHEME.match(self.mlflow_tracking_uri):
            _fail("logging.mlflow_tracking_uri", f"'{self.mlflow_tracking_uri}' has no scheme",
                  "use e.g. http://host:5000 or file:/abs/path/mlruns, or leave it empty for RUN_DIR/mlruns")
