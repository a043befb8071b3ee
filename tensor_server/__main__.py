"""``python -m tensor_server``: see tensor_server.cli."""

from __future__ import annotations

import sys

from tensor_server.cli import main

if __name__ == "__main__":
    sys.exit(main())
