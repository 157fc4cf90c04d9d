"""Helpers of the store tests (test_store_budget.py, test_noisy_neighbour_store.py): a daemon of a
test's own instance with the store's settings it needs, and an instance emptied between cases."""
from __future__ import annotations

from drums_core.config import Instance


def store_daemon(inst: Instance, **env: str):
    """A daemon of ``inst`` started with ``env`` (the one running is stopped first, its sessions destroyed)."""
    from drums_core.client import Client

    from tests.support.suite import SUITE_DAEMON_ENV

    Client(inst, autostart=False).shutdown(destroy_sessions=True)
    c = Client(inst, daemon_env={**SUITE_DAEMON_ENV, "DRUMS_STORE_MEM_FLOOR": "0", "DRUMS_FAULT_AT": "", **env})
    c.ping()
    return c


def clear(c) -> None:
    """Every session destroyed, then every snapshot deleted, the newest first."""
    for s in c.list():
        c.destroy(s["id"])
    for s in sorted(c.snapshots(), key=lambda s: -s["created"]):
        c.delete_snapshot(s["id"])
