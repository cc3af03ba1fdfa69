"""`ehr-pipeline`: command-line entry point of the data layer."""
from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Dispatches `ehr-pipeline` sub-commands; returns the process exit code."""
    print("ehr-pipeline: not yet wired", file=sys.stderr)
    return 2
