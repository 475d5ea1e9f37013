"""What the command-line entry points share."""

from __future__ import annotations

import os
import sys


def prog(module: str) -> str:
    """The command as the user typed it: the console script's name (`coopmat-info`), else
    `python -m coopmat.info`."""
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    name = name.removesuffix(".exe")
    return name if name.startswith("coopmat-") else f"python -m {module}"


def write(text: str) -> None:
    """print() to stdout. When the reader stopped early (`| head`), the rest of the output
    goes nowhere and the command carries on (a bench run still writes its --json), instead
    of ending in a BrokenPipeError traceback."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
