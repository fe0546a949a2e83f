"""Set-up of the benchmarks' tests (run by the README's test command beside tests/)."""

from __future__ import annotations

import os
import tempfile

# Rendered built-in data goes to a folder of this session (the benchmarks' subprocesses inherit
# it), not to the user's cache, as in tests/conftest.py.
os.environ.setdefault("DIFFSCALE_CACHE_DIR", tempfile.mkdtemp(prefix="diffscale-test-cache-"))
