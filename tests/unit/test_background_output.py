"""The background compile's output is held until the run keeps a log (a refused run writes
nothing), then written there: what it printed before and what it prints after."""

from __future__ import annotations

import subprocess
import sys

from diffscale.training.background_compile import HeldOutput

from helpers import eventually


def test_output_printed_before_the_log_is_kept_lands_in_it_with_what_follows(tmp_path):
    go = tmp_path / "go"
    child = subprocess.Popen(
        [sys.executable, "-c", "import pathlib, sys, time\nprint('before', flush=True)\n"
         f"while not pathlib.Path({str(go)!r}).exists(): time.sleep(0.05)\nprint('after', flush=True)"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert child.stdout is not None
    output = HeldOutput.read(child.stdout)
    eventually(lambda: output._held, "the first line was never read")
    assert output.path is None and not list(tmp_path.glob("*.log"))  # held: nothing written yet
    log = output.keep(tmp_path / "background-compile.log")
    go.touch()
    assert child.wait(timeout=60) == 0
    eventually(lambda: output._ended, "the end of its output was never read")
    assert output.path == log and log.read_text() == "before\nafter\n"


def test_a_process_that_ended_before_the_log_was_kept_leaves_all_its_output_there(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "print('only line')"], stdout=subprocess.PIPE)
    assert child.stdout is not None
    output = HeldOutput.read(child.stdout)
    assert child.wait(timeout=60) == 0
    eventually(lambda: output._ended, "the end of its output was never read")
    log = output.keep(tmp_path / "background-compile.log")
    assert log.read_text() == "only line\n"
