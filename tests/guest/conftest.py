"""Fixtures for the guest server tests (the helpers live in tests/support/guestlib.py)."""
from __future__ import annotations

from collections.abc import Iterator

import pytest


from tests.support.guestlib import GuestServer, XServer, kill_tagged


@pytest.fixture(scope="session")
def xserver() -> Iterator[XServer]:
    x = XServer()
    try:
        x.start()
        yield x
    finally:
        x.stop()


@pytest.fixture(scope="session")
def guest(xserver: XServer) -> Iterator[GuestServer]:
    s = GuestServer(xserver.display)
    try:
        s.start()
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="session", autouse=True)
def _no_survivors() -> Iterator[None]:
    """After the whole session: every tagged process is gone (kill leftovers, then assert)."""
    yield
    survivors = kill_tagged()
    assert not survivors, f"processes survived the guest tests: {survivors}"
