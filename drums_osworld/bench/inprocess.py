"""What the suites that look inside the engine share (``profile``, ``floor``): a Supervisor in this
process, the Writer snapshot they measure, CRIU calls logged at level 4 for CRIU's own timeline."""
from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from . import common
from .common import BenchInstance


@contextlib.contextmanager
def supervisor(inst, cleanup: dict) -> Iterator[Any]:
    """A :class:`~drums_core.session.supervisor.Supervisor` of ``inst`` in this process. On exit its
    sessions are destroyed, its run is swept and the instance stopped; ``cleanup`` gets the report."""
    from drums_core.session.supervisor import Supervisor
    from drums_core.sweep import sweep

    holder = BenchInstance(inst)
    holder._stop_leftover()
    sup = None
    try:
        sup = Supervisor(inst, liveness_delay=3.0)
        sup.adopted_pids = set()
        yield sup
    finally:
        if sup is not None:
            with contextlib.suppress(Exception):
                sup.shutdown(destroy_sessions=True)
            # the owner of this run (we) is alive, so the instance's sweep of dead runs would skip
            # whatever a failed destroy left: sweep this run explicitly
            with contextlib.suppress(Exception):
                sweep(inst.ledger_root, run=sup.run, only_dead=False)
        cleanup.update(holder.stop())


def writer_snapshot(sup, name: str, image: str | None = None):
    """A cold Writer desktop (of ``image``, default the desktop's default) after the Writer task's
    setup, checkpointed (it is consumed) as ``name``."""
    from drums_osworld.desktop import desktop_spec
    from drums_osworld.evaluation import run_task_setup
    from drums_osworld.guest.client import GuestClient

    s = sup.create(desktop_spec() if image is None else desktop_spec(image=image))
    run_task_setup(common.WRITER_TASK, GuestClient(s.address, 5000), strict=True)
    common.wait_agent_ready(s.display, time.monotonic())
    time.sleep(0.5)
    return sup.checkpoint(s.id, name=name)


@contextlib.contextmanager
def dump_seconds(criu_mod) -> Iterator[list[float]]:
    """While active, the seconds of each of the engine's ``criu.dump`` calls (CRIU's dump alone)
    are collected in the list it yields."""
    orig = criu_mod.dump
    seen: list[float] = []

    def timed(*a, **k):
        res = orig(*a, **k)
        seen.append(res.seconds)
        return res

    criu_mod.dump = timed
    try:
        yield seen
    finally:
        criu_mod.dump = orig


@contextlib.contextmanager
def criu_level4(criu_mod, call: str) -> Iterator[list[list[str]]]:
    """While active, the engine's ``criu.<call>`` (``restore`` or ``dump``) logs at level 4; the
    list it yields collects each call's log."""
    orig = getattr(criu_mod, call)
    logs: list[list[str]] = []

    def wrapped(*a, **k):
        k["log_level"] = 4
        res = orig(*a, **k)
        logs.append(res.log)
        return res

    setattr(criu_mod, call, wrapped)
    try:
        yield logs
    finally:
        setattr(criu_mod, call, orig)
