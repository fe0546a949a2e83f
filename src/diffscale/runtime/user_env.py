"""What the user's environment said before torch loaded. The package root imports this module
first, so it is read before anything imports torch: torch sets ``TORCHINDUCTOR_CACHE_DIR`` itself
(to /tmp/torchinductor_USER) the first time it looks for its cache."""

import os

USER_COMPILE_CACHE = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
"""``TORCHINDUCTOR_CACHE_DIR`` as the user set it (None: unset)."""
