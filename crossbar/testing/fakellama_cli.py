"""`crossbar-fakellama`: not yet built (see the fake llama-server issue)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Not yet: the fake llama-server lands with its own issue; this says so and exits 1."""
    print("crossbar-fakellama: not yet built (it lands with the fake llama-server issue)")
    return 1


if __name__ == "__main__":
    sys.exit(main())
