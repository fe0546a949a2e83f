"""Writing trained networks in the formats the field's tools load (each task picks its own
through ``Task.export``).

An export is written into a temporary folder beside the target and renamed into place, so
the target is either complete or absent: Ctrl-C or a full disk halfway leaves nothing a
loader would half-read, and nothing the next export refuses as "not empty".
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from diffscale.errors import UserError
from diffscale.io.paths import check_export_dir, give_default_modes, refused
from diffscale.runtime.runlock import process_alive

if TYPE_CHECKING:
    from diffscale.tasks.base import Task

_PARTIAL = ".partial-"
"""Temporary export folders are named ``.NAME.partial-PID`` beside the target."""


def _remove_stale_partials(out_dir: Path) -> None:
    """Temporary folders of exports that were killed (their process is gone)."""
    for leftover in out_dir.parent.glob(f".{out_dir.name}{_PARTIAL}*"):
        pid = leftover.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not process_alive(int(pid)):
            shutil.rmtree(leftover, ignore_errors=True)


def export_network(task: Task, network: torch.nn.Module, out_dir: Path,
                   card: Callable[[Path, str], None] | None = None) -> str:
    """The task's own export of ``network`` into a new or empty ``out_dir``; returns how to load it.
    ``card(folder, how_to_load)`` adds the model card to the folder before it is renamed into place."""
    out_dir = check_export_dir(Path(out_dir))
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_partials(out_dir)
    partial = out_dir.parent / f".{out_dir.name}{_PARTIAL}{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    try:
        partial.mkdir()
        how = task.export(network, partial)
        if card is not None:
            card(partial, how.replace(str(partial), out_dir.name))  # the card names no machine's paths
        give_default_modes(partial)
        # rename(2) replaces an empty folder: the target appears complete, at once
        os.replace(partial, out_dir)
    except BaseException as exc:
        shutil.rmtree(partial, ignore_errors=True)
        said = refused(exc)
        if said is not None:
            raise UserError(f"export to '{out_dir}' failed, nothing was written there: {said.cause}", said.fix) from exc
        raise
    return how.replace(str(partial), str(out_dir))  # a task's loading hint names the folder it wrote


def export_run(run_dir: Path, out_dir: Path | None, *, license_id: str | None = None, repo: str | None = None,
               token_file: str | Path | None = None, private: bool = False) -> list[str]:
    """``diffscale export``: the run's EMA weights and model card into ``out_dir`` and/or pushed to
    the Hub repo ``repo``; returns the lines that say what was written. Every check that can
    refuse (licence, repo id, token, target folder) runs before anything is written."""
    import tempfile

    from diffscale.inference import hub
    from diffscale.inference.modelcard import CARD_NAME, CardFacts, model_card, write_card
    from diffscale.inference.trained import load_trained
    from diffscale.tasks.base import count_parameters

    hub.check_license(license_id)
    token = hub.find_token(token_file) if repo is not None and hub.check_repo_id(repo) else None
    if out_dir is not None:
        out_dir = check_export_dir(Path(out_dir))
    run = load_trained(Path(run_dir), "cpu")
    params = count_parameters(run.network)
    listing = run.task.hub_listing()
    with tempfile.TemporaryDirectory(prefix="diffscale-export-") as scratch:
        target = out_dir if out_dir is not None else Path(scratch) / run.run_dir.name

        def card(folder: Path, how_to_load: str) -> None:
            facts = CardFacts(listing, target, repo=repo, license=license_id)
            text = model_card(run.cfg, run.run_dir, step=run.step, params=params, how_to_load=how_to_load,
                              facts=facts)
            write_card(folder, text, run.run_dir)

        how = export_network(run.task, run.network, target, card=card)
        where = f" to {out_dir}" if out_dir is not None else ""
        lines = [f"exported EMA weights of step {run.step}{where} (load with {how}); model card: "
                 f"{out_dir / CARD_NAME if out_dir is not None else CARD_NAME}"]
        if repo is not None and token is not None:
            try:
                url = hub.push_folder(target, repo, token=token, private=private,
                                      message=f"diffscale export of {run.run_dir.name} at step {run.step}")
            except UserError as exc:
                if out_dir is None:
                    raise
                raise UserError(f"{exc.cause}; the export in '{out_dir}' is complete", exc.fix) from exc
            lines.append(f"pushed to {url}")
    return lines
