"""The planner's measured figures: one data file, every figure with its provenance, and the
planner reading them (measured wins over the formulas)."""

from __future__ import annotations

import datetime
import re
from pathlib import Path

import pytest
import tomllib
import yaml

from diffscale.cluster.planning import estimates, measured
from diffscale.cluster.planning.measured import MeasuredDataError
from diffscale.config import presets

BENCHMARKS = (Path(__file__).resolve().parents[3] / "docs" / "benchmarks.md").read_text()

SRC = Path(measured.__file__).resolve().parent  # src/diffscale/cluster/planning
PACKAGE = SRC.parents[1]  # src/diffscale
ROOT = SRC.parents[3]


def test_every_figure_carries_its_provenance():
    figures = measured.load()
    assert len(figures.throughput) == 6 and len(figures.peak_gpu_memory) == 3
    for figure in (*figures.throughput, *figures.peak_gpu_memory):
        p = figure.provenance
        assert all(getattr(p, f).strip() for f in ("card", "commit", "command", "section")), figure
        assert isinstance(p.date, datetime.date)
        title = re.match(r'docs/benchmarks.md "([^"]+)"', p.section)
        assert title and f"## {title.group(1)}\n" in BENCHMARKS, p.section  # the cited section exists
        assert "diffscale bench" in p.command


def test_the_planner_prefers_the_measured_figures():
    small = presets.get_preset("small")
    rate = estimates.samples_per_s_per_rank(small, "H100 80GB HBM3", 16, True)
    assert (rate.value, rate.source) == (28011.0, "measured")
    memory = estimates.gpu_memory_gb(small, "NVIDIA H200")
    assert memory.source == "measured" and memory.value == pytest.approx(11.80 * 2**30 / 1e9)
    other = estimates.gpu_memory_gb(small, "A100-80GB")  # no figure for this card: the formula
    assert other.source == "estimated"


@pytest.mark.parametrize("path", ["cluster/planning/measured.yaml", "cluster/planning/measured.py",
                                  "cluster/planning/estimates.py", "cluster/planning/preflight.py",
                                  "runtime/resources.py"])
def test_figures_cite_documents_not_internal_run_labels(path):
    text = (PACKAGE / path).read_text()
    assert not re.search(r"\bruns? [A-Z]\d?\b|\bsessions? \d|\bpass \d", text), path


def test_the_data_file_ships_with_the_package():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "cluster/planning/measured.yaml" in project["tool"]["setuptools"]["package-data"]["diffscale"]


def _document() -> dict:
    return yaml.safe_load((SRC / "measured.yaml").read_text())


@pytest.mark.parametrize("damage,message", [
    (lambda d: d["sources"]["h100-defaults-2026-11-26"].pop("command"),
     "sources.h100-defaults-2026-11-26: 'command' is missing"),
    (lambda d: d["sources"]["h100-defaults-2026-11-26"].update(section="run E"),
     "sources.h100-defaults-2026-11-26: 'section' must name a docs/benchmarks.md section"),
    (lambda d: d["throughput"][0].update(source="somewhere"), "throughput[0]: source 'somewhere' is not among sources"),
    (lambda d: d["peak_gpu_memory"][1].pop("reserved_gib"), "peak_gpu_memory[1]: 'reserved_gib' is missing"),
    (lambda d: d.update(version=2), "not a version 1 measured-figures document"),
])
def test_a_damaged_file_is_refused_with_the_entry_named(damage, message):
    document = _document()
    damage(document)
    with pytest.raises(MeasuredDataError) as err:
        measured.parse(document)
    assert str(err.value).startswith(message)
