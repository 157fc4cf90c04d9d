"""Named fault points: ``DRUMS_FAULT_AT=<window>`` makes the daemon SIGKILL itself there.

Forms:
  ``<window>``            die when the code reaches :func:`hit` with that name;
  ``criu+<ms>``           die <ms> milliseconds after a restore's CRIU call started;
  ``criu-top+<ms>``       the same, killing CRIU's top process first.
Unset, every call here is a no-op.

For tests of error classification, a daemon started with ``DRUMS_TEST_HOOKS=1`` also accepts
``inject`` requests: :func:`fail` then raises ``Unavailable`` at a named point the next N times
(``restore-resume``, ``restore-readiness``, ``restore-reseed``), as a real failure there would.
"""
from __future__ import annotations

import os
import re
import signal
import threading
from ..reasons import Reason

_timer: threading.Timer | None = None
_injected: dict[str, int] = {}
_lock = threading.Lock()


def test_hooks_enabled() -> bool:
    return os.environ.get("DRUMS_TEST_HOOKS") == "1"


def inject(point: str, times: int) -> None:
    with _lock:
        if times > 0:
            _injected[point] = times
        else:
            _injected.pop(point, None)


def fail(point: str) -> None:
    """Raise Unavailable here if a test injected a failure at ``point``."""
    if not _injected:
        return
    with _lock:
        left = _injected.get(point, 0)
        if left <= 0:
            return
        _injected[point] = left - 1
    from ..errors import Unavailable

    raise Unavailable(f"injected failure at {point}", reason=Reason.INJECTED)


def armed() -> str | None:
    return os.environ.get("DRUMS_FAULT_AT") or None


def hit(window: str) -> None:
    if armed() == window:
        os.kill(os.getpid(), signal.SIGKILL)


def _criu_children() -> list[int]:
    me = os.getpid()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            raw = open(f"/proc/{name}/stat").read()
        except OSError:
            continue
        comm = raw[raw.find("(") + 1: raw.rfind(")")]
        ppid = int(raw[raw.rfind(")") + 2:].split()[1])
        if comm == "criu" and ppid == me:
            out.append(int(name))
    return out


def _die(kill_criu: bool) -> None:
    if kill_criu:
        for pid in _criu_children():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    os.kill(os.getpid(), signal.SIGKILL)


def arm_criu_timer() -> None:
    global _timer
    m = re.fullmatch(r"(criu|criu-top)\+(\d+)ms?", armed() or "")
    if not m:
        return
    _timer = threading.Timer(int(m.group(2)) / 1000.0, _die, args=(m.group(1) == "criu-top",))
    _timer.daemon = True
    _timer.start()


def disarm_criu_timer() -> None:
    if _timer is not None:
        _timer.cancel()
