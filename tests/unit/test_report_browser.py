"""``diffscale report`` opened in a real headless Chromium (Debian's package, driven by
playwright-python; no browser is downloaded): the page renders every section and image,
takes a screenshot, logs no console error and asks the network for nothing.

Chromium comes from tests/browser/chromium.sh (as root, the way the scheduler tests install
their packages). Outside CI a missing browser or playwright skips with the reason; under
``CI=true`` it fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from diffscale.cli import main

from helpers import REPO, fake_run

SECTIONS = ["Progress", "Training curves", "Evaluation scores", "Samples over time", "Resolved config", "Job history",
            "Doctor", "System"]


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def _unavailable(reason: str) -> None:
    if _in_ci():
        pytest.fail(f"CI=true: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def chromium() -> str:
    path = shutil.which("chromium")
    if path is None and os.geteuid() == 0 and shutil.which("apt-get"):
        done = subprocess.run(["bash", str(REPO / "tests/browser/chromium.sh"), "install"], capture_output=True,
                              text=True, timeout=900, stdin=subprocess.DEVNULL)
        path = done.stdout.strip().splitlines()[-1] if done.returncode == 0 and done.stdout.strip() else None
    if path is None:
        _unavailable("no chromium here (tests/browser/chromium.sh installs it as root: apt-get install chromium)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        _unavailable("playwright-python is not installed (pip install -e '.[test]')")
    return str(path)


def test_the_report_renders_in_chromium_without_errors_or_network(tmp_path, chromium, monkeypatch):
    from playwright.sync_api import sync_playwright

    monkeypatch.setattr("diffscale.doctor.sources._command", lambda argv, timeout=30: None)  # no scheduler asked
    run = fake_run(tmp_path / "run")
    assert main(["report", str(run)]) == 0
    page_file = run / "report.html"
    problems: list[str] = []
    requested: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
            page.on("request", lambda r: requested.append(r.url))
            page.goto(page_file.as_uri(), wait_until="load")
            headings = page.locator("h2").all_inner_texts()
            images = page.eval_on_selector_all("img", "els => els.map(e => [e.alt, e.complete, e.naturalWidth])")
            body = page.inner_text("body")
            page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
        finally:
            browser.close()
    assert problems == []
    assert [u for u in requested if not u.startswith(("data:", "file:"))] == []  # self-contained
    assert headings == SECTIONS
    alts = [alt for alt, complete, width in images if complete and width > 0]
    assert len(alts) == len(images)  # every image decoded
    assert {"Loss", "Learning rate", "Throughput", "GPU utilisation", "GPU memory used"} <= set(alts)
    assert {"samples at step 20", "samples at step 40"} <= set(alts)
    assert "requeue / continuation" in body and "777002" in body  # the job history with its requeue
    assert "out of memory" in body.lower()  # the doctor's finding from the job log
    assert "GPU0 X NV18" in body  # the system it ran on
    shot = tmp_path / "report.png"
    assert shot.stat().st_size > 10_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("DIFFSCALE_KEEP_SCREENSHOT"):
        Path(os.environ["DIFFSCALE_KEEP_SCREENSHOT"]).write_bytes(shot.read_bytes())


def test_the_sweep_report_renders_in_chromium_without_errors_or_network(tmp_path, chromium):
    import json

    from playwright.sync_api import sync_playwright

    sweep = tmp_path / "sweep"
    rows = []
    for index, (lr, seed) in enumerate([("1e-4", "0"), ("1e-4", "1"), ("3e-4", "0"), ("3e-4", "1")]):
        run = fake_run(sweep / "runs" / f"{index:03d}")
        (run / "jobs.json").unlink()  # a sweep run here: no scheduler to ask
        rows.append({"index": index, "values": {"optim.lr": lr, "train.seed": seed}, "run_dir": str(run)})
    (sweep / "sweep.yaml").write_text("base: {preset: tiny}\naxes: {optim.lr: [1e-4, 3e-4]}\nseeds: [0, 1]\n")
    (sweep / "elements.json").write_text(json.dumps(rows))
    assert main(["sweep", "report", str(sweep)]) == 0
    problems: list[str] = []
    requested: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            page.on("request", lambda r: requested.append(r.url))
            page.goto((sweep / "report.html").as_uri(), wait_until="load")
            headings = page.locator("h2").all_inner_texts()
            images = page.eval_on_selector_all("img", "els => els.map(e => [e.alt, e.complete, e.naturalWidth])")
            body = page.inner_text("body")
        finally:
            browser.close()
    assert problems == []
    assert [u for u in requested if not u.startswith(("data:", "file:"))] == []
    assert headings == ["Curves", "Final numbers, mean and spread over seeds", "Runs"]
    assert {"Loss", "Throughput (samples/s)"} <= {alt for alt, complete, width in images if complete and width > 0}
    assert "3e-4" in body and "2" in body
