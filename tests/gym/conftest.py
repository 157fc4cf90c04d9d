"""Fixtures for the gymnasium env, rollouts and demo tests (helpers in tests/support/gymlib.py)."""
from __future__ import annotations


import pytest



@pytest.fixture
def instance_env(drums_instance, monkeypatch):
    """Point DRUMS_INSTANCE (and its slots) at the suite's daemon, for code that builds its own Client."""
    monkeypatch.setenv("DRUMS_INSTANCE", drums_instance.name)
    monkeypatch.setenv("DRUMS_SLOT_BASE", str(drums_instance.slot_base))
    monkeypatch.setenv("DRUMS_SLOT_COUNT", str(drums_instance.slot_count))
    from tests.support.suite import SUITE_DAEMON_ENV

    for key, value in SUITE_DAEMON_ENV.items():  # a daemon this code starts is the suite's kind
        monkeypatch.setenv(key, value)
    return drums_instance
