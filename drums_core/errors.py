"""The closed set of errors Drums raises, each with a contract.

    DrumsError
     +-- Unavailable         nothing happened, or everything the attempt did was rolled back
     |                       (no mount, upper, link or process left); retrying is safe.
     +-- Busy                another operation holds this session; retry later.
     +-- FailedPrecondition  the request conflicts with the current state (e.g. a checkpoint
     |                       id reused with other parameters); nothing changed.
     +-- NotFound            the session or snapshot does not exist; nothing changed.
     +-- InvalidArgument     the request is malformed (hostile name, bad option); nothing changed.
     +-- Internal            may be partly applied; the session or snapshot is marked broken and
                             must not be retried blindly (a dead guest, corrupt images, a bug).

Each error carries a stable ``reason`` code for machines (``SESSION_BROKEN``,
``SNAPSHOT_NOT_FOUND``, ``CRIU_FAILED``...), a :class:`~drums_core.reasons.Reason` from the
registry in :mod:`drums_core.reasons` (what each means and whether to retry), and, where a tool
failed, its own lines in ``detail``.
Over the daemon's socket they travel as ``{"code", "reason", "message", "detail"}`` and are
rebuilt on the client side by :func:`from_wire`.
"""
from __future__ import annotations

from typing import Any

from .reasons import Reason


class DrumsError(Exception):
    """The base of every error Drums raises: ``code`` names the class on the wire, ``reason`` is a
    stable machine-readable cause (``SESSION_NOT_FOUND``...), ``message`` says it for people and
    ``detail`` carries a tool's own output where one failed (CRIU's log lines, ...)."""

    code = "INTERNAL"
    default_reason = Reason.INTERNAL

    def __init__(self, message: str, *, reason: str | None = None, detail: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason or self.default_reason
        self.detail = detail

    def to_wire(self) -> dict[str, Any]:
        """The error as it travels over the daemon's socket (``from_wire`` rebuilds it)."""
        return {"code": self.code, "reason": self.reason, "message": self.message, "detail": self.detail}

    def __str__(self) -> str:
        return f"{self.message} [{self.reason}]"


class Unavailable(DrumsError):
    """Nothing happened, or everything the attempt did was rolled back. Retrying is safe."""

    code = "UNAVAILABLE"
    default_reason = Reason.UNAVAILABLE


class Busy(DrumsError):
    """Another operation holds this session. Nothing changed; retry later."""

    code = "BUSY"
    default_reason = Reason.SESSION_BUSY


class FailedPrecondition(DrumsError):
    """The request conflicts with the current state. Nothing changed."""

    code = "FAILED_PRECONDITION"
    default_reason = Reason.FAILED_PRECONDITION


class NotFound(DrumsError):
    """The named session or snapshot does not exist. Nothing changed."""

    code = "NOT_FOUND"
    default_reason = Reason.NOT_FOUND


class InvalidArgument(DrumsError):
    """The request is malformed. Nothing changed."""

    code = "INVALID_ARGUMENT"
    default_reason = Reason.INVALID_ARGUMENT


class Internal(DrumsError):
    """May be partly applied; the session or snapshot involved is marked broken. Do not retry blindly."""

    code = "INTERNAL"
    default_reason = Reason.INTERNAL


_BY_CODE = {cls.code: cls for cls in (Unavailable, Busy, FailedPrecondition, NotFound, InvalidArgument, Internal)}


def from_wire(payload: dict[str, Any]) -> DrumsError:
    """Rebuild the error a ``to_wire`` payload describes (an unknown code becomes :class:`Internal`;
    a reason of the registry becomes its :class:`~drums_core.reasons.Reason`, any other stays a string)."""
    cls = _BY_CODE.get(payload.get("code", ""), Internal)
    reason = payload.get("reason")
    if isinstance(reason, str) and reason in Reason.__members__:
        reason = Reason[reason]
    return cls(payload.get("message", "unknown error"), reason=reason, detail=payload.get("detail"))
