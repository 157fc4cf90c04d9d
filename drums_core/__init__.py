"""Drums engine: checkpointable Linux desktop sessions.

A session is a Linux desktop (Xvfb, a window manager, applications) in its own namespaces on an
overlayfs root; CRIU checkpoints it into a snapshot, and a snapshot restores into any number of
sibling sessions at once (a branch). The per-host daemon ``drumsd`` owns them; a :class:`Client`
talks to it (and starts it on first use)::

    import drums_core

    c = drums_core.Client()
    s = c.create()                                   # a Session
    snap = c.checkpoint(s.id, leave_running=True)    # a Snapshot
    sibs = c.restore(snap.id, count=4)               # four Sessions, restored at once
    print(c.exec(sibs[0].id, ["uname", "-n"]).stdout)
    for x in [s, *sibs]:
        c.destroy(x.id)

Public names:

- :class:`Client`, and :class:`Instance` / :func:`instance_from_env` to choose the daemon;
- the records it returns: :class:`Session`, :class:`Snapshot`, :class:`ExecResult`,
  :class:`Window`, :class:`Process` (frozen dataclasses that also read as the daemon's JSON; see
  :mod:`drums_core.records`), and :func:`json_default` to ``json.dumps`` documents holding them;
- the errors: :class:`DrumsError` and its subclasses :class:`Unavailable`, :class:`Busy`,
  :class:`FailedPrecondition`, :class:`NotFound`, :class:`InvalidArgument`, :class:`Internal`
  (their contracts are in :mod:`drums_core.errors`), and :class:`Reason`, the registry of the
  ``reason`` codes they carry (what each means, whether to retry; :mod:`drums_core.reasons`).

Everything else (the supervisor, CRIU, rootfs, networking, the sweep) is the daemon's inside.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .lazy import lazy_exports

if TYPE_CHECKING:
    from .client import Client
    from .config import Instance, instance_from_env
    from .errors import Busy, DrumsError, FailedPrecondition, Internal, InvalidArgument, NotFound, Unavailable
    from .reasons import Reason
    from .records import ExecResult, Process, Session, Snapshot, Window, json_default

# Every public name loads on first access (see __getattr__): ``import drums_core.errors``, which the guest
# server and ``import drums_osworld`` do, stays without the client and its socket machinery, and a
# process that runs one module of the package (``python -m drums_core.session.enter`` at every
# ``drums exec``) imports only what that module needs.
_LAZY = {"Client": "drums_core.client", "Instance": "drums_core.config", "instance_from_env": "drums_core.config",
         **{name: "drums_core.errors" for name in ("Busy", "DrumsError", "FailedPrecondition", "Internal",
                                                   "InvalidArgument", "NotFound", "Unavailable")},
         "Reason": "drums_core.reasons",
         **{name: "drums_core.records" for name in ("ExecResult", "Process", "Session", "Snapshot", "Window",
                                                    "json_default")}}

__all__ = [
    "Client",
    "Instance",
    "instance_from_env",
    "Session",
    "Snapshot",
    "ExecResult",
    "Window",
    "Process",
    "json_default",
    "DrumsError",
    "Unavailable",
    "Busy",
    "FailedPrecondition",
    "NotFound",
    "InvalidArgument",
    "Internal",
    "Reason",
]


__getattr__, __dir__ = lazy_exports(globals(), _LAZY)
