"""The arithmetic and tables of ``benchmarks.quality_time``: when a run reached the reference's
final Frechet distance, its share of the reference's time, the markdown tables and the chart,
and the summary of runs kept in several ``quality_time.json`` files (``--merge``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from diffscale.errors import UserError
from diffscale.io.numbers import cell

TARGET_SHARE = 0.40
"""diffscale reaches the plain recipe's final quality in at most this share of its time."""


def time_to_reach(points: Sequence[tuple[float, float]], target: float) -> float | None:
    """The first x at which the curve ``points`` ((x, fd) in order of x) is at or below ``target``,
    linearly interpolated from the point before it; None where it never gets there."""
    before: tuple[float, float] | None = None
    for x, fd in points:
        if fd <= target:
            if before is None or before[1] <= target:
                return x
            x0, fd0 = before
            return x0 + (x - x0) * (fd0 - target) / (fd0 - fd)
        before = (x, fd)
    return None


def summarize(records: list[dict], against: str | None = None) -> list[dict]:
    """Per preset and diffscale run: its final FD, when it reached the reference's final FD (seconds
    and images), and that time's share of the reference's budget. The reference is the plain
    recipe, or the run named ``against`` (e.g. diffscale's defaults, to weigh a training choice)."""
    rows = []
    references = [r for r in records if (r["name"] == against if against else r["recipe"] == "plain")]
    for ref in references:
        target, budget = ref["points"][-1]["fd"], ref["points"][-1]["seconds"]
        for run in (r for r in records if r["preset"] == ref["preset"] and r is not ref and r["recipe"] != "plain"):
            points = run["points"]
            reach_s = time_to_reach([(p["seconds"], p["fd"]) for p in points], target)
            reach_images = time_to_reach([(p["images"], p["fd"]) for p in points], target)
            share = reach_s / budget if reach_s is not None and budget > 0 else None
            rows.append({"preset": ref["preset"], "run": run["name"], "reference": ref["name"],
                         "plain_final_fd": target, "plain_seconds": budget, "plain_images": ref["points"][-1]["images"],
                         "final_fd": points[-1]["fd"], "seconds": points[-1]["seconds"],
                         "reach_plain_final_s": reach_s, "reach_plain_final_images": reach_images,
                         "share_of_plain_time": share,
                         "target_met": None if against else share is not None and share <= TARGET_SHARE})
    return rows


def markdown(records: list[dict], summary: list[dict], about: dict, against: str | None = None) -> str:
    """The points of every run and the summary against the plain recipe (or the run ``against``
    names), as markdown tables."""
    ref = against or "plain"
    lines = [f"Time to quality on {about['device']}, {about['date_utc']} UTC, commit {about.get('commit') or '-'}: "
             f"FD of {about['eval']['count']} samples ({about['eval']['sampler']}, {about['eval']['steps']} steps) "
             "in the data set's feature network; training seconds exclude start-up and evaluation.", "",
             "| preset | run | train s | steps | images seen | FD | FD of EMA | FD of raw weights |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in records:
        for p in r["points"]:
            lines.append(f"| {r['preset']} | {r['name']} | {p['seconds']:.1f} | {p['steps']} | {p['images']:,} | "
                         f"{p['fd']:.2f} | {p['fd_ema']:.2f} | {cell(p.get('fd_raw'), '.2f')} |")
    lines += ["", f"| preset | run | start-up s | samples/s | final FD | {ref} final FD | reaches it at s (images) "
              f"| of {ref}'s time | target <= 40 % |", "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    compared = {(s["preset"], s["run"]): s for s in summary}
    for r in records:
        s = compared.get((r["preset"], r["name"]))
        cells = ["", "", "", ""]  # the reference itself, or a run with no reference to compare with
        if s is not None:
            reach = "never" if s["reach_plain_final_s"] is None else \
                f"{s['reach_plain_final_s']:.1f} ({s['reach_plain_final_images']:,.0f})"
            cells = [f"{s['plain_final_fd']:.2f}", reach, cell(s["share_of_plain_time"], ".1%"),
                     "-" if s["target_met"] is None else "met" if s["target_met"] else "missed"]
        lines.append(f"| {r['preset']} | {r['name']} | {r['startup_s']:.1f} | {cell(r['samples_per_s'], ',.0f')} | "
                     f"{r['points'][-1]['fd']:.2f} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"


def write_chart(records: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    presets = list(dict.fromkeys(r["preset"] for r in records))
    fig, axes = plt.subplots(1, len(presets), figsize=(5 * len(presets), 4), squeeze=False)
    for ax, preset in zip(axes[0], presets, strict=True):
        for r in (r for r in records if r["preset"] == preset):
            ax.plot([p["seconds"] for p in r["points"]], [p["fd"] for p in r["points"]], marker="o", label=r["name"])
        ax.set_xlabel("training seconds")
        ax.set_ylabel("Frechet distance")
        ax.set_yscale("log")
        ax.set_title(preset)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def merged(paths: Sequence[Path], against: str | None = None) -> str:
    """The tables and summary of the runs kept in several ``quality_time.json`` files, with the
    first file's provenance, against the plain recipe or the run named ``against``."""
    files = [json.loads(path.read_text()) for path in paths]
    records = [run for kept in files for run in kept["runs"]]
    names = sorted({run["name"] for run in records})
    if against and against not in names:
        raise UserError(f"--against '{against}' names no run in these files (they hold {', '.join(names)})",
                        f"pass one of those names, e.g. --against {names[0]}, or leave --against out to "
                        "compare with the plain recipe")
    return markdown(records, summarize(records, against), files[0]["about"], against)
