"""A restore as named steps, and the one place where a failed step becomes a Drums error.

A restore (:meth:`drums_core.session.restoring.RestoreOps._restore_one`) runs these steps, in this order
except that readiness overlaps the network and the reseed (the X server needs neither):

    prepare-root   the session's directories, cgroup and overlay root; the old link name free
    criu           ``criu restore`` of the snapshot's images into that root
    network        the session's veth link, address and network policy
    reseed         hostname, machine id, and the desktop's own reseed hook
    readiness      the X server draws (the snapshot's window, if any) and the guest port answers
    liveness       the processes that were settled at the checkpoint are still there

:class:`StepTrace` names the step in progress: each step's end (or failure) is logged by name with
its duration, and an exception leaving a step carries the step's name. :func:`rolled_back` turns
whatever a failed step raised into the error the caller gets, once: the step is in its message
(``... failed at step criu and was rolled back: ...``) and, where the detail is a mapping, in its
``detail["step"]``.
"""
from __future__ import annotations

import enum
import logging
import subprocess
import time
from contextlib import contextmanager
from typing import Callable, Iterator

from ..errors import DrumsError, Internal, Unavailable
from ..reasons import Reason
from .criu import summary as criu_summary

log = logging.getLogger("drums.restore")


class RestoreStep(enum.StrEnum):
    PREPARE_ROOT = "prepare-root"
    CRIU = "criu"
    NETWORK = "network"
    RESEED = "reseed"
    READINESS = "readiness"
    LIVENESS = "liveness"


# the attribute an exception leaving a step carries (the first step it left wins)
STEP_ATTR = "drums_restore_step"


def step_of(exc: BaseException) -> RestoreStep | None:
    """The step ``exc`` left, or None if it was raised outside every step."""
    return getattr(exc, STEP_ATTR, None)


class StepTrace:
    """The named steps of one restore of ``snapshot`` into session ``sid``."""

    def __init__(self, sid: str, snapshot: str) -> None:
        self.sid = sid
        self.snapshot = snapshot
        self.seconds: dict[str, float] = {}

    @contextmanager
    def step(self, name: RestoreStep) -> Iterator[None]:
        t0 = time.monotonic()
        try:
            yield
        except BaseException as exc:
            took = time.monotonic() - t0
            if step_of(exc) is None:
                try:
                    setattr(exc, STEP_ATTR, name)
                except AttributeError:  # an exception type without a __dict__: the log still names it
                    pass
            log.warning("restore %s from %s: step %s failed after %.3fs: %s", self.sid, self.snapshot,
                        name, took, exc)
            raise
        took = time.monotonic() - t0
        self.seconds[name.value] = round(took, 4)
        log.debug("restore %s from %s: step %s done in %.3fs", self.sid, self.snapshot, name, took)


def _with_step(detail: object, step: RestoreStep | None) -> object:
    if step is None:
        return detail
    if detail is None:
        return {"step": step.value}
    if isinstance(detail, dict):
        return {**detail, "step": step.value}
    return detail


def rolled_back(exc: BaseException, snapshot: str, corrupt: Callable[[], str | None]) -> BaseException:
    """The error to raise for ``exc``, which left a restore of ``snapshot`` whose session has been
    torn down. ``corrupt()`` checks the snapshot's images (and marks it broken if they are not
    whole), returning what is wrong or None; it is asked only when CRIU itself failed.

    - CRIU failed on images that do not verify: ``Internal IMAGES_CORRUPT`` (not worth a retry);
    - an ``Unavailable`` (or ``LINK_BUSY``): ``Unavailable`` with its reason, rolled back;
    - another Drums error: of its own class and reason, the step in its message and detail;
    - an OS, subprocess or value error: ``Unavailable RESTORE_FAILED``;
    - anything else (a bug, an interrupt): itself.
    """
    step = step_of(exc)
    where = f" at step {step}" if step is not None else ""
    if isinstance(exc, Unavailable) and exc.reason == Reason.CRIU_FAILED:
        broken = corrupt()
        if broken is not None:
            lines = (exc.detail or {}).get("criu_log", []) if isinstance(exc.detail, dict) else []
            return Internal(f"restore of {snapshot} failed{where} on corrupt images: {broken}; "
                            f"CRIU: {criu_summary(lines)}", reason=Reason.IMAGES_CORRUPT,
                            detail=_with_step({"criu_log": lines, "verify": broken}, step))
    if isinstance(exc, DrumsError):
        if isinstance(exc, Unavailable) or exc.reason == Reason.LINK_BUSY:
            return Unavailable(f"restore of {snapshot} failed{where} and was rolled back: {exc.message}",
                               reason=exc.reason, detail=_with_step(exc.detail, step))
        if step is None:
            return exc
        return type(exc)(f"restore of {snapshot} failed{where}: {exc.message}", reason=exc.reason,
                         detail=_with_step(exc.detail, step))
    if isinstance(exc, (OSError, subprocess.SubprocessError, ValueError)):
        return Unavailable(f"restore of {snapshot} failed{where} and was rolled back: {exc}",
                           reason=Reason.RESTORE_FAILED, detail=_with_step(None, step))
    return exc
