"""scripts/gpu/speed_images.sh, which runs the image benchmarks one after another, dry-run on the CPU."""

import json


def test_image_speed_script_runs_its_parts_in_order_and_summarizes(tmp_path):
    """scripts/gpu/speed_images.sh with SMOKE=1 (tiny sizes): a part that needs another's run is
    skipped with the reason, the pipeline part runs, and the summary has its row."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "out"
    env = dict(os.environ, PYTHON=sys.executable, SMOKE="1", PARTS="samplers pipeline bogus", OUT=str(out),
               WORK=str(tmp_path / "work"), OMP_NUM_THREADS="1")
    done = subprocess.run(["bash", str(root / "scripts" / "gpu" / "speed_images.sh")], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = (out / "summary.md").read_text()
    assert f"- samplers: skipped (no trained run in {tmp_path / 'work' / 'runs' / 'tiny-fast'}" in summary
    assert "- pipeline: exit 0 in " in summary and "- bogus: unknown part" in summary
    assert "| tiny | 2 | " in summary and "strong setup: fp16 weights, channels_last" in summary
    assert json.loads((out / "pipeline" / "sampling.json").read_text())["pipeline_strong_s"] > 0
