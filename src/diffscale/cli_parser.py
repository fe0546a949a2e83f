"""The shape of diffscale's command line: verbs whose ``--help`` ends in an example, and
argparse's own refusals in the one-line form of every other error."""

from __future__ import annotations

import argparse
from typing import NoReturn

from diffscale.errors import UserError


class Parser(argparse.ArgumentParser):
    """argparse's own refusals (an unknown flag, a bad choice, a missing argument) in the one-line
    form every other error has, instead of a usage block and a differently shaped message."""

    def error(self, message: str) -> NoReturn:
        raise UserError(f"{self.prog}: {message}", f"see `{self.prog} --help`")


class ExampleFormatter(argparse.HelpFormatter):
    """Wraps descriptions as usual and keeps the example epilog's lines as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith("example:"):
            return "\n".join(indent + line for line in text.splitlines())
        return super()._fill_text(text, width, indent)


def verb(sub: argparse._SubParsersAction, name: str, help: str, example: str,
         description: str | None = None) -> argparse.ArgumentParser:
    """A verb's parser, its ``--help`` ending in a short example (``example`` lines, one command each)."""
    lines = "\n".join(f"  {line}" for line in example.splitlines())
    return sub.add_parser(name, help=help, epilog=f"example:\n{lines}",
                          formatter_class=ExampleFormatter, description=description)
