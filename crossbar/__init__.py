"""crossbar: a sticky reverse proxy for a fleet of llama.cpp llama-server hosts."""

import os

__version__ = "0.1.0"

# CROSSBAR_PURE=1: the compiled modules' Python source, even where their .so files exist.
if os.environ.get("CROSSBAR_PURE", "") not in ("", "0"):
    from crossbar.build import prefer_source

    prefer_source()
