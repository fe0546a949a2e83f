"""diffscale's version, in a module of its own: job scripts, caches, model cards and ``--version``
read it without importing the package root (pyproject.toml reads it too)."""

__version__ = "0.1.0"
