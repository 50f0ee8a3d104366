import os
import tempfile

import jax

# Compiled programs persist across test sessions in a tmp dir, never the user's home
# (dse/engines/compiled.py; keys hold dse's source hash, so a changed equation recompiles).
os.environ.setdefault("DSE_CACHE_DIR", os.path.join(tempfile.gettempdir(), f"dse-test-cache-{os.getuid()}"))

from dse.engines.compiled import enable_persistent_cache  # noqa: E402

enable_persistent_cache()

# Single plans and pinned numbers are checked in float64 (DESIGN.md, Conventions).
jax.config.update("jax_enable_x64", True)
