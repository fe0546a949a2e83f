"""The model card ``export`` writes beside the weights (``README.md``, the file model hubs
show): what was trained (task, preset, network), on what data, for how many steps, how it
did (the last training record and the newest evaluation), under which licence, and the Python
that loads it; its YAML front matter is what the Hugging Face Hub lists the model by."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diffscale.config import RunConfig
from diffscale.io import rundir
from diffscale.io.atomic import write_bytes, write_text
from diffscale.tasks.base import HubListing
from diffscale.version import __version__

CARD_NAME = "README.md"
SAMPLES_NAME = "samples.png"

_TRAINING_FIELDS = (("loss", "training loss (last logged window)", "{:.4f}"),
                    ("grad_norm", "gradient norm", "{:.3f}"), ("samples_per_s", "throughput (samples/s)", "{:.0f}"),
                    ("nonfinite_skipped", "steps skipped for a non-finite loss", "{:d}"))


def _fmt(value: Any, pattern: str) -> str:
    try:
        return pattern.format(value)
    except (ValueError, TypeError):
        return str(value)


def _metrics(run_dir: Path) -> list[str]:
    records, events = rundir.read_records(run_dir)
    lines = []
    if records:
        last = records[-1]
        lines += ["| metric | value |", "|---|---|"]
        lines += [f"| {label} | {_fmt(last[key], pattern)} |"
                  for key, label, pattern in _TRAINING_FIELDS if key in last]
        lines.append(f"| at step | {last['step']} |")
    evaluations = [e for e in events if e.get("kind") == "eval"]
    if evaluations:
        newest = evaluations[-1]
        skip = {"kind", "step", "task", "steps", "seed", "time"}
        scores = {k: v for k, v in newest.items() if k not in skip and isinstance(v, (int, float))}
        lines += ["", f"Evaluation (`diffscale eval`, step {newest.get('step')}, "
                      f"{newest.get('steps')} sampling steps):", "", "| score | value |", "|---|---|"]
        lines += [f"| {k} | {v:.4g} |" for k, v in scores.items()]
    return lines or ["No training records were found (metrics.jsonl)."]


@dataclass(frozen=True)
class CardFacts:
    """What a card says beyond the run: how the folder is listed and loaded, where it is
    published and under which licence."""

    listing: HubListing
    folder: Path
    """The exported folder (the loading code names it where the card is not for the Hub)."""
    repo: str | None = None
    """The Hub repo the folder is pushed to."""
    license: str | None = None
    """The Hub's licence identifier (e.g. ``mit``); None: not stated."""


def front_matter(facts: CardFacts) -> str:
    """The card's YAML metadata, as the Hub reads it (huggingface_hub's own writer)."""
    from huggingface_hub import ModelCardData

    data = ModelCardData(library_name=facts.listing.library_name, pipeline_tag=facts.listing.pipeline_tag,
                         license=facts.license, tags=list(facts.listing.tags))
    return f"---\n{data.to_yaml()}\n---"


def loading_code(facts: CardFacts) -> str:
    """The card's Python: where the folder comes from, then the task's own loading code."""
    if facts.repo is None:  # the folder's name, not where it was written: a card names no machine's paths
        source = f"folder = {facts.folder.name!r}  # the path of this folder\n"
    elif facts.listing.loads_hub_ids:
        source = f"folder = {facts.repo!r}  # or the path of a downloaded copy\n"
    else:
        source = f"from huggingface_hub import snapshot_download\n\nfolder = snapshot_download({facts.repo!r})\n"
    return source + facts.listing.loading_code


def model_card(cfg: RunConfig, run_dir: Path, *, step: int, params: int, how_to_load: str,
               facts: CardFacts) -> str:
    """The card's Markdown."""
    run_dir = Path(run_dir)
    d, o, t = cfg.diffusion, cfg.optim, cfg.train
    rows = [("task", cfg.task), ("preset", cfg.preset), ("network", f"{cfg.model.summary()}, {params / 1e6:.2f} M "
                                                                    "parameters"),
            ("data", f"`{cfg.data.source}`"), ("steps", f"{step} of {t.steps} (EMA weights, decay {t.ema_decay})"),
            ("batch", f"{t.batch_per_gpu} per process x {t.grad_accum} accumulation x the world size"),
            ("optimizer", f"AdamW, lr {o.lr:g}"), ("diffusion", ", ".join(f"{k} {v}" for k, v in _plain(d).items())),
            ("seed", str(t.seed)),
            ("licence", facts.license or "licence not stated: ask the authors before reusing the weights")]
    lines = [front_matter(facts), "",
             f"# {run_dir.name}: a diffscale {cfg.task} diffusion model", "",
             f"Trained with diffscale {__version__}; exported {datetime.date.today().isoformat()} from "
             f"`{run_dir.name}` (`diffscale_config.yaml` is its full resolved config).", "",
             "| | |", "|---|---|", *[f"| {k} | {v} |" for k, v in rows], "",
             "## Metrics", "", *_metrics(run_dir), "",
             "## Loading", "", f"With {_package(facts.listing)} installed, on a CPU or a GPU:", "",
             "```python", loading_code(facts).rstrip("\n"), "```", ""]
    if facts.repo is None:  # the short form names the local folder, which a Hub copy does not have
        lines += [f"In short: `{how_to_load}`.", ""]
    grids = rundir.sample_grids(run_dir)
    if grids:
        lines += ["## Samples", "", f"![preview grid at step {grids[-1][0]}]({SAMPLES_NAME})", ""]
    return "\n".join(lines)


def _package(listing: HubListing) -> str:
    """What to install for the loading code (diffusers brings huggingface_hub and torch)."""
    return "diffusers (`pip install diffusers torch`)" if listing.library_name == "diffusers" else "diffscale"


def _plain(section: Any) -> dict[str, Any]:
    import dataclasses
    import enum

    return {f.name: (v.value if isinstance(v := getattr(section, f.name), enum.Enum) else v)
            for f in dataclasses.fields(section)}


def write_card(out_dir: Path, text: str, run_dir: Path) -> None:
    """The card, the run's resolved config, and the newest preview grid where there is one."""
    out_dir = Path(out_dir)
    write_text(out_dir / CARD_NAME, text)
    config = Path(run_dir) / "config.yaml"
    if config.is_file() and not (out_dir / "diffscale_config.yaml").exists():
        write_text(out_dir / "diffscale_config.yaml", config.read_text())
    grids = rundir.sample_grids(run_dir)
    if grids and not (out_dir / SAMPLES_NAME).exists():
        write_bytes(out_dir / SAMPLES_NAME, grids[-1][1].read_bytes())
