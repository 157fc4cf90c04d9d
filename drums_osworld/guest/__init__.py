"""The guest server that runs inside every Drums desktop and speaks OSWorld's HTTP API.

Start it with ``python -m drums_osworld.guest --port 5000 [--host 0.0.0.0]``. The modules:

- :mod:`.server` - the Flask application (:func:`create_app`) and :func:`serve`;
- :mod:`.routes` - the HTTP API, one blueprint an area; :mod:`.api` - error replies and request
  parsing; :mod:`.state` - :class:`~.state.GuestConfig` and the state the handlers share;
- :mod:`.screen` - the X connection, screenshots and the pointer;
- :mod:`.windows` - top-level windows, activation and closing (wmctrl rules);
- :mod:`.a11y` - the accessibility tree (AT-SPI when available, else the X11 window tree);
- :mod:`.commands` - running commands as the desktop user;
- :mod:`.recording` - ffmpeg screen recording;
- :mod:`.bench` - a round-trip benchmark against a running server.

Nothing is imported here eagerly, so ``import drums_osworld.guest`` needs neither Flask nor X.
"""
from __future__ import annotations

__all__ = ["GuestConfig", "create_app", "serve"]


def __getattr__(name: str):
    if name in __all__:
        from . import server

        return getattr(server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
