"""The docs hold together: relative links and their #anchors resolve, contents lists name every
section, sections cited by title ("docs/benchmarks.md, "Attention kernels"") exist, and the
benchmarks page stays one short table a section with each figure's card, date, commit and command."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from helpers import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
DATED = sorted((REPO / "docs" / "measurements").glob("[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9].md"))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: its text as rendered, lower case, punctuation but - and _
    dropped, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").replace("*", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def headings(path: Path, level: str = "#{1,6}") -> list[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)  # no headings in code blocks
    return re.findall(rf"^{level} (.+?)\s*$", text, re.M)


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    for heading in headings(path):  # a repeated heading gets -1, -2, ... as on GitHub
        base = slug(heading)
        seen[base] = seen.get(base, -1) + 1
        seen[f"{base}-{seen[base]}" if seen[base] else base] = 0
    return set(seen)


def test_slugs_are_githubs():
    assert slug("Policy controller: re-plan and pop latency (`python -m benchmarks.latency`)") == \
        "policy-controller-re-plan-and-pop-latency-python--m-benchmarkslatency"
    assert slug("Where a step's time goes") == "where-a-steps-time-goes"
    assert slug("CPU demo and CPU training") == "cpu-demo-and-cpu-training"


def test_relative_links_and_anchors_resolve():
    broken = []
    for doc in DOCS:
        text = re.sub(r"^```.*?^```", "", doc.read_text(), flags=re.M | re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (doc.parent / path).resolve() if path else doc
            if not dest.exists():
                broken.append(f"{doc.relative_to(REPO)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{doc.relative_to(REPO)}: {target} (no such section)")
    assert not broken


def _contents(path: Path) -> list[str]:
    """The anchors of the page's contents list, in order: the paragraph starting 'Contents:'."""
    match = re.search(r"^Contents: (.+?)(?:\n\n|\Z)", path.read_text(), re.M | re.S)
    assert match, f"{path.name} has no contents list"
    return re.findall(r"\]\(#([^)]+)\)", match.group(1))


@pytest.mark.parametrize("path", [REPO / "docs" / "decisions.md", REPO / "docs" / "benchmarks.md", *DATED],
                         ids=lambda p: p.name)
def test_contents_list_names_every_section_in_order(path):
    assert _contents(path) == [slug(h) for h in headings(path, "##")]


def test_dated_measurement_files_exist():
    assert [p.stem for p in DATED][:3] == ["2026-11-26", "2026-11-27", "2026-11-28"]


def test_sections_cited_by_title_exist():
    """Code, scripts and docs cite a section by its title, as `docs/benchmarks.md, "Attention
    kernels"` (the title may be cut short, and may run over a line break of a comment)."""
    sources = [*DOCS, *(REPO / "src").rglob("*.py"), *(REPO / "src").rglob("*.yaml"), *(REPO / "tests").rglob("*.py"),
               *(REPO / "benchmarks").rglob("*.py"), *(REPO / "scripts").rglob("*.sh"),
               *(REPO / "scripts").rglob("*.py")]
    cite = re.compile(r"((?:docs/)?(?:benchmarks|decisions|measurements/[\w.-]+?)\.md),? \"([A-Za-z`][^\"]*)\"")

    def norm(text: str) -> str:
        return re.sub(r"\s+", " ", text.replace("`", "")).strip()

    missing, cited = [], 0
    for source in sources:
        text = re.sub(r"\n[ \t]*(?:#+[ \t]*)?", " ", source.read_text())  # lines joined, comment marks dropped
        for doc, title in cite.findall(text):
            cited += 1
            path = REPO / (doc if doc.startswith("docs/") else f"docs/{doc}")
            if not path.is_file() or not any(norm(h).startswith(norm(title)) for h in headings(path)):
                missing.append(f"{source.relative_to(REPO)}: {doc}, \"{norm(title)}\"")
    assert cited > 20 and not missing


def _sections(path: Path) -> dict[str, str]:
    parts = re.split(r"^## (.+)$", path.read_text(), flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_benchmarks_page_is_one_short_table_a_section_with_provenance():
    page = REPO / "docs" / "benchmarks.md"
    assert len(page.read_text().splitlines()) <= 400
    for title, body in _sections(page).items():
        if title == "Measuring again":
            continue
        rows = [line for line in body.splitlines() if line.startswith("|")]
        header = [cell.strip() for cell in rows[0].strip("|").split("|")]
        assert sum(1 for line in rows if re.match(r"^\|[-:| ]+\|$", line)) == 1, f"{title}: one table"
        assert {"card", "date", "commit", "command"} <= set(header), title
        for row in rows[2:]:
            cells = dict(zip(header, (cell.strip() for cell in row.strip("|").split("|")), strict=True))
            assert re.search(r"\d{4}-\d{2}-\d{2}", cells["date"]), (title, row)
            assert re.search(r"\b[0-9a-f]{7}\b|not recorded", cells["commit"]), (title, row)
            assert cells["command"] and cells["card"], (title, row)
            assert max(len(cell) for cell in cells.values()) <= 120, (title, row)


def test_readmes_preset_table_is_what_the_presets_are():
    """Each image preset's row (px, widths, attention, batch, target) as ``get_preset`` builds it."""
    from diffscale.config.presets import get_preset

    rows = re.findall(r"^\| (tiny|small|medium|large|xl)\b[^|]* \| (\d+) \| (\([\d, ]+\)) \| ([a-z, ]+) \| (\d+) \| "
                      r"(\w+) \|$", (REPO / "README.md").read_text(), re.M)
    assert [row[0] for row in rows] == ["tiny", "small", "medium", "large", "xl"]
    target = {"v_prediction": "v", "epsilon": "noise", "sample": "sample"}
    for name, px, widths, attention, batch, predicts in rows:
        cfg = get_preset(name)
        assert (int(px), widths, attention, int(batch), predicts) == (
            cfg.model.sample_size, str(cfg.model.block_out_channels),
            ", ".join("yes" if a else "no" for a in cfg.model.attention), cfg.train.batch_per_gpu,
            target[cfg.diffusion.prediction_type.value]), name
