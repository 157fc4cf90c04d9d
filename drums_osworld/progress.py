"""Progress bars for long-running work: a tqdm bar on stderr, or a stand-in that shows nothing."""
from __future__ import annotations

import sys
from typing import Any

__all__ = ["progress"]


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, s: str) -> None:
        pass

    def close(self) -> None:
        pass


def progress(total: int, desc: str, quiet: bool = False, *, leave: bool = True) -> Any:
    """A tqdm bar of ``total`` steps on stderr (the stand-in when tqdm is missing or ``quiet``).

    ``leave=False`` clears the bar when it closes.
    """
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm is in the dev extra; the work still runs without it
        tqdm = None
    if tqdm is None or quiet:
        return _NoBar()
    return tqdm(total=total, desc=desc, file=sys.stderr, unit="step", dynamic_ncols=True, leave=leave)
