"""``wait_until``: the suite's one wait for a state (instead of loops over a deadline, or sleeps)."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError, TimeoutError):
    """A state did not come in time; the message names what was awaited and the last value seen."""


def wait_until(predicate: Callable[[], T], timeout: float, what: str, *, every: float = 0.05,
               ignore: tuple[type[BaseException], ...] = ()) -> T:
    """Call ``predicate`` every ``every`` seconds until it returns something true, and return that.

    An exception of a type in ``ignore`` counts as a false value (it is shown as the last value).
    After ``timeout`` seconds raise :class:`WaitTimeout` (an ``AssertionError`` and a
    ``TimeoutError``) naming ``what`` and the last value."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            value = predicate()
        except ignore as exc:
            value = last = exc
        else:
            last = value
            if value:
                return value
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"timed out after {timeout:g}s waiting for {what} (last: {last!r})")
        time.sleep(every)
