"""Every verb's ``--help`` ends in an example, and every option says what it does."""

from __future__ import annotations

import argparse

import pytest

from diffscale.cli import build_parser, main


def _parsers(parser: argparse.ArgumentParser, path: str = "diffscale"):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{path} {name}")


def test_every_verb_has_an_example_and_every_option_has_help():
    missing_help, missing_example = [], []
    for path, parser in _parsers(build_parser()):
        if not (parser.epilog or "").startswith("example:\n  diffscale"):
            missing_example.append(path)
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            if not action.help or action.help == argparse.SUPPRESS:
                missing_help.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
    assert missing_example == [] and missing_help == []


@pytest.mark.parametrize("argv, example", [
    (["train", "--help"], "  diffscale train --preset small"),
    (["cluster", "show", "--help"], "  diffscale cluster show nyu-torch"),
])
def test_help_prints_the_example_as_written(argv, example, capsys):
    with pytest.raises(SystemExit) as done:
        main(argv)
    out = capsys.readouterr().out
    assert done.value.code == 0 and f"example:\n{example}" in out
