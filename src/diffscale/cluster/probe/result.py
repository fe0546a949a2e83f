"""What ``diffscale probe`` measured, as stored in ``RUN_DIR/probe.json``, and how it is read back.

Figures are bytes; one process's figure is its PSS where the kernel gives smaps_rollup
(``measure`` says which), else its RSS. ``workers`` are the processes below the rank's main
process (DataLoader workers, tokenizer pools, compile workers), each listed with its peak.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from diffscale.errors import UserError
from diffscale.io.atomic import write_text

PROBE_FILE = "probe.json"
VERSION = 1

# tqdm / Lightning's TQDM bar: "Epoch 0:  45%|####5     | 45/100 [00:05<00:06, 8.91it/s, v_num=0]",
# "45it [00:05, 8.91it/s]", slow steps as "1.52s/it"; Lightning's rich bar: "45/100 0:00:05 • 0:00:06 8.91it/s".
_TQDM = re.compile(r"(?P<n>\d+)(?:/(?P<total>\d+|\?))?(?:it)? \[[\d:]+(?:<[\d:?]+)?,\s*(?P<rate>[\d.]+)"
                   r"(?P<unit>it/s|s/it)")
_RICH = re.compile(r"(?P<n>\d+)/(?P<total>\d+) +[\d:]+ .*? (?P<rate>[\d.]+)(?P<unit>it/s|s/it)")


@dataclass(frozen=True)
class Progress:
    steps_per_s: float
    step: int
    total: int | None
    line: str


def parse_progress(line: str) -> Progress | None:
    """Steps/s of one progress line (tqdm, Lightning); None when the line is not one."""
    for pattern in (_TQDM, _RICH):
        m = pattern.search(line)
        if m is None:
            continue
        rate = float(m.group("rate"))
        if m.group("unit") == "s/it":
            rate = 1.0 / rate if rate > 0 else 0.0
        total = m.group("total")
        return Progress(rate, int(m.group("n")), int(total) if total and total.isdigit() else None,
                        line.strip()[:200])
    return None


@dataclass(frozen=True)
class ProcFigure:
    pid: int
    cmdline: str
    memory_bytes: int
    """PSS where measured, else RSS (see ``ProbeResult.measure``)."""
    rss_bytes: int
    pss_bytes: int | None
    uss_bytes: int | None
    threads: int


@dataclass(frozen=True)
class ProbeResult:
    command: tuple[str, ...]
    seconds: int
    """The bound asked for (--seconds)."""
    ran_s: float
    ended: str
    """``limit``: stopped by the probe at --seconds; ``exited``: the command ended by itself."""
    exit_code: int | None
    measure: str
    main: ProcFigure
    workers: tuple[ProcFigure, ...]
    workers_at_once: int
    """Most processes below the main one alive in one sample (loader workers per rank)."""
    tree_peak_bytes: int
    threads_peak: int
    gpu_bytes: int | None
    gpu_name: str | None
    gpu_note: str
    steps_per_s: float | None
    progress_line: str | None
    host: str
    cpus: int
    version: int = VERSION
    notes: tuple[str, ...] = field(default=())

    @property
    def worker_bytes(self) -> int:
        """The largest worker's peak (each worker is assumed to grow as large)."""
        return max((w.memory_bytes for w in self.workers), default=0)

    @property
    def gpu_key(self) -> str | None:
        from diffscale.cluster.planning.estimates import gpu_key

        return gpu_key(self.gpu_name) if self.gpu_name else None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)


def save(result: ProbeResult, run_dir: Path) -> Path:
    return write_text(run_dir / PROBE_FILE, result.to_json() + "\n")


def _figure(raw: Any) -> ProcFigure:
    return ProcFigure(**{k: raw[k] for k in ProcFigure.__dataclass_fields__})


def load(path: str | Path) -> ProbeResult:
    """A probe.json (or a run directory holding one); every problem is one UserError line."""
    path = Path(path)
    if path.is_dir():
        path = path / PROBE_FILE
    if not path.is_file():
        raise UserError(f"no probe result at {path}",
                        "measure the command first: diffscale probe --out RUN_DIR -- COMMAND ...")
    try:
        raw = json.loads(path.read_text())
        if raw.get("version") != VERSION:
            raise ValueError(f"version {raw.get('version')!r}, this diffscale reads {VERSION}")
        raw["main"] = _figure(raw["main"])
        raw["workers"] = tuple(_figure(w) for w in raw["workers"])
        raw["command"] = tuple(raw["command"])
        raw["notes"] = tuple(raw.get("notes", ()))
        return ProbeResult(**raw)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UserError(f"{path} is not a probe result this diffscale can read ({exc})",
                        "measure again with diffscale probe --out RUN_DIR -- COMMAND ...") from exc
