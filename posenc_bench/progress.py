"""Progress bars (tqdm) that stay quiet when stderr is not a terminal, and log lines that do not break them."""

from __future__ import annotations

import sys
from typing import Optional

from tqdm.auto import tqdm


def progress_bar(total: int, desc: str, enabled: Optional[bool] = None) -> tqdm:
    """enabled=None: show only on a terminal; False: never; True: always."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    return tqdm(total=total, desc=desc, disable=not enabled, leave=False, dynamic_ncols=True)


def say(line: str) -> None:
    """Print a log line to stdout above any progress bar on screen (the bar is redrawn below it)."""
    tqdm.write(line)
