"""Journal OSWorld's setup on a Drums desktop: which step failed, even where OSWorld only logs it.

``SetupController.setup`` (desktop-env 1.0.2) raises only when a step raises; a ``launch``,
``execute``, ``activate_window`` or ``close_window`` that the guest refuses is logged and setup
goes on, and ``reset`` returns a desktop that will score a plausible 0. :func:`wrap` wraps the
env's setup controller so that each ``setup()`` call opens a section of the guest's setup log
(:mod:`drums_osworld.setup_journal`), each step is tagged with its index and type, a step that
raises is noted, and when ``setup()`` ends the provider gets the :class:`SetupReport`
(``provider.setup_reports``: ``(phase, report)``, phase ``setup`` inside ``reset``, otherwise
``postconfig``).
"""
from __future__ import annotations

import functools
import threading
from typing import Any

from ..setup_journal import Journal, SetupReport

__all__ = ["wrap"]


class _State(threading.local):
    def __init__(self) -> None:
        self.index = -1
        self.depth = 0


def _journal(provider: Any) -> Journal | None:
    desk = provider.desktop
    if desk is None or desk.closed:
        return None
    from ..desktop import GUEST_PORT

    base = f"http://{desk.address}:{GUEST_PORT}"
    j = getattr(provider, "_journal", None)
    if j is None or j.base_url != base:
        if j is not None:
            j.close()
        j = Journal(base)
        provider._journal = j
    return j


def read_current(provider: Any) -> SetupReport:
    """The report of the desktop's last setup section (a restored desktop keeps its snapshot's)."""
    j = _journal(provider)
    if j is None:
        return SetupReport(read_error="no desktop")
    return j.read(label="setup")


def wrap(provider: Any, setup_controller: Any) -> None:
    """Journal every ``setup()`` and step of ``setup_controller`` into ``provider``'s desktop."""
    if getattr(getattr(setup_controller, "setup", None), "__drums_journal__", False):
        return
    state = _State()

    def wrap_setup(fn):
        @functools.wraps(fn)
        def setup(config, *args: Any, **kwargs: Any):
            phase = getattr(provider, "setup_phase", None) or "postconfig"
            j = _journal(provider)
            mark = j.begin(phase) if j is not None and config else None
            state.index, state.depth = -1, 0
            try:
                return fn(config, *args, **kwargs)
            finally:
                if j is not None and mark is not None:
                    provider.setup_reports.append((phase, j.read(mark)))

        setup.__drums_journal__ = True
        return setup

    def wrap_step(name: str, fn):
        stype = name[1:-len("_setup")]

        @functools.wraps(fn)
        def step(*args: Any, **kwargs: Any):
            j = _journal(provider)
            outer = state.depth == 0
            if outer:
                state.index += 1
                if j is not None:
                    j.step(state.index, stype)
            state.depth += 1
            try:
                return fn(*args, **kwargs)
            except Exception as exc:
                if outer and j is not None:
                    j.note(state.index, stype, f"{type(exc).__name__}: {exc}")
                raise
            finally:
                state.depth -= 1

        step.__drums_journal__ = True
        return step

    for name in dir(type(setup_controller)):
        if name.startswith("_") and name.endswith("_setup") and not name.startswith("__"):
            fn = getattr(setup_controller, name, None)
            if callable(fn) and not getattr(fn, "__drums_journal__", False):
                setattr(setup_controller, name, wrap_step(name, fn))
    setup_controller.setup = wrap_setup(setup_controller.setup)
