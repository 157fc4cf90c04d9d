"""The desktops a ``drums/Desktop-v0`` env runs on: booted or restored (retried while a failure
left nothing behind), and destroyed when the env that owns one is gone."""
from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Any

from drums_core.errors import DrumsError, NotFound, Unavailable

if TYPE_CHECKING:
    from drums_core.client import Client

    from ..desktop import Desktop

log = logging.getLogger("drums.osworld.gym")

__all__ = ["boot", "destroy_quietly", "restore"]


def _retry_unavailable(what: str, fn: Any, attempts: int = 3) -> Any:
    """Call ``fn``; an ``Unavailable`` (nothing happened) is retried, anything else is not."""
    for attempt in range(attempts):
        try:
            return fn()
        except Unavailable as exc:
            if attempt + 1 == attempts:
                raise
            log.warning("%s failed retryably (%s); retrying", what, exc)
            time.sleep(0.5 * (attempt + 1))
    raise AssertionError("unreachable")


def boot(client: Client, screen_size: tuple[int, int], network: str | None) -> Desktop:
    """A cold OSWorld desktop; ``network`` is a policy as :func:`~drums_osworld.provider.images.network_key`
    spells it (None: the daemon's default)."""
    from ..desktop import Desktop, desktop_spec

    def once() -> Desktop:
        if not network:
            return Desktop.boot(client, screen=screen_size)
        return Desktop(client, client.create({**desktop_spec(screen_size), "network": json.loads(network)}))

    return _retry_unavailable("boot", once)


def restore(client: Client, snapshot: str, n: int, wait_live: bool = False) -> list[Desktop]:
    """``n`` sibling desktops of ``snapshot``."""
    from ..desktop import Desktop

    return _retry_unavailable("restore", lambda: Desktop.restore(client, snapshot, count=n, wait_live=wait_live))


def destroy_quietly(client: Client, session_id: str) -> None:
    """Destroy a desktop that may be gone already (a failure is logged, not raised)."""
    try:
        client.destroy(session_id)
    except NotFound:
        pass
    except DrumsError as exc:
        log.warning("could not destroy session %s: %s", session_id, exc)
