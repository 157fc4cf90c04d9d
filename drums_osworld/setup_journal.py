"""Failed setup is not a score: the host's side of the guest's setup log.

The guest records the outcome of every ``/setup/*`` call (:mod:`drums_osworld.guest.setup_log`);
a :class:`Journal` marks where a task's setup begins, tags each step, notes failures only the
host sees (a setup step that raised), and reads back a :class:`SetupReport`. The log lives in the
guest's memory, so a desktop restored from a post-setup snapshot (a ``post_setup`` reset, the
siblings of ``drums rollouts``) reports the setup it was made with.

Who uses it:

- the OSWorld provider: :func:`drums_osworld.snapshot.reuse.drums_reset` puts the report of each
  ``DesktopEnv.reset`` on ``env.provider.setup_report``, logs a warning naming the failed steps,
  and raises :class:`SetupFailed` from ``reset`` when strict (``DRUMS_STRICT_SETUP=1`` or the
  provider option ``strict_setup=True``);
- the gym env: ``info["setup"]`` after ``reset``; an invalid attempt is never scored (``evaluate``
  raises :class:`SetupFailed`; the terminal step's ``info["score"]`` is None, ``info["invalid"]``
  says why);
- ``drums rollouts``: each branch's ``invalid``;
- ``drums bench osworld-tasks``: the ``setup error`` class.

The report is about the desktop and comes from inside it (untrusted): it is size-bounded, its
fields are coerced to plain types, and nothing in it is ever used as a path or a command.
"""
from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import requests

from drums_core.errors import DrumsError, Unavailable
from drums_core.reasons import Reason
from drums_core.host import bounded

log = logging.getLogger("drums.osworld.setup")

__all__ = ["STRICT_ENV", "Journal", "SetupFailed", "SetupIssue", "SetupReport", "missing_apps_for", "strict_default"]

STRICT_ENV = "DRUMS_STRICT_SETUP"
MAX_ISSUES = 50
_TEXT = 600


def strict_default() -> bool:
    """``DRUMS_STRICT_SETUP`` is 1/true/yes."""
    return os.environ.get(STRICT_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def _text(v: Any, n: int = _TEXT) -> str:
    s = v if isinstance(v, str) else ("" if v is None else str(v))
    return s if len(s) <= n else s[: n - 3] + "..."


@dataclass
class SetupIssue:
    """One failed setup call (or a step that raised on the host)."""

    step: int | None
    type: str | None
    endpoint: str
    error: str
    command: str | None = None

    @classmethod
    def from_entry(cls, e: Any) -> "SetupIssue | None":
        if not isinstance(e, Mapping):
            return None
        step = e.get("step") if isinstance(e.get("step"), Mapping) else {}
        idx = step.get("index")
        return cls(step=idx if isinstance(idx, int) and not isinstance(idx, bool) and idx >= 0 else None,
                   type=_text(step.get("type"), 60) or None, endpoint=_text(e.get("endpoint"), 80),
                   error=_text(e.get("error")) or "failed", command=_text(e.get("command"), 300) or None)

    def describe(self) -> str:
        where = f"step {self.step + 1} ({self.type})" if self.step is not None else (self.endpoint or "setup")
        what = f" {self.command}" if self.command else ""
        return f"{where}{what}: {self.error}"


@dataclass
class SetupReport:
    """How a task's setup went on one desktop."""

    label: str = ""
    entries: int = 0
    issues: list[SetupIssue] = field(default_factory=list)
    missing_apps: dict[str, str] = field(default_factory=dict)
    read_error: str | None = None

    @property
    def ok(self) -> bool:
        """Every setup call succeeded (and the log could be read)."""
        return not self.issues and self.read_error is None

    def describe(self) -> str:
        if self.ok:
            return "setup succeeded"
        parts = [i.describe() for i in self.issues[:5]]
        if len(self.issues) > 5:
            parts.append(f"and {len(self.issues) - 5} more")
        if self.read_error:
            parts.append(f"the setup log could not be read: {self.read_error}")
        text = "setup failed: " + "; ".join(parts)
        if self.missing_apps:
            text += "; the image lacks " + ", ".join(f"{k} ({v})" for k, v in self.missing_apps.items())
        return text

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["ok"] = self.ok
        return d

    @classmethod
    def from_log(cls, doc: Any) -> "SetupReport":
        if not isinstance(doc, Mapping) or not isinstance(doc.get("entries"), list):
            return cls(read_error="the guest's setup log has the wrong shape")
        errors = doc.get("errors") if isinstance(doc.get("errors"), list) else []
        issues = [i for i in (SetupIssue.from_entry(e) for e in errors[:MAX_ISSUES]) if i is not None]
        return cls(label=_text(doc.get("label"), 80), entries=len(doc["entries"]), issues=issues)


class SetupFailed(DrumsError):
    """A task's setup failed on the desktop: the attempt is invalid and must not be scored.

    ``report`` is the :class:`SetupReport`; ``detail`` carries it as JSON. The desktop is left as
    it is (used): the next reset replaces it."""

    default_reason = Reason.SETUP_FAILED

    def __init__(self, report: SetupReport, task_id: str | None = None) -> None:
        what = f"task {task_id}: " if task_id else ""
        super().__init__(what + report.describe(), detail={"task": task_id, "setup": report.to_json()})
        self.report = report


REPLY_LIMIT = 64 << 10   # the guest's answer to a mark, step or note
LOG_LIMIT = 4 << 20      # the setup log


class BoundsExceeded(ValueError):
    """A guest reply over its byte cap or its deadline (``reason``: SESSION_REPLY_TOO_LARGE/TIMEOUT)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class Journal:
    """The setup log of the guest at ``base_url`` (``http://<address>:5000``)."""

    def __init__(self, base_url: str, timeout: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._http = bounded.deadline_session()  # each request's socket is shut at its deadline
        self._http.trust_env = False  # the guest is on a link of ours: never through a proxy

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, path: str, limit: int = REPLY_LIMIT, **kw: Any) -> Any:
        """The guest's JSON answer, read within bounds (``limit`` bytes; connect, headers and body
        within ``timeout`` s together). A reply over a bound is a :class:`BoundsExceeded` (a ValueError)."""
        start = time.monotonic()
        total = 2 * self.timeout
        try:
            with bounded.deadline(start + total):
                r = self._http.request(method, self.base_url + path, timeout=self.timeout, stream=True, **kw)
                r.raise_for_status()
                data = bounded.read_response(r, limit=limit, timeout=total, what=f"{method} {path}", started=start)
        except Unavailable as exc:
            raise BoundsExceeded(exc.message, exc.reason) from exc
        return json.loads(data)

    def _post(self, path: str, body: dict) -> Any:
        return self._call("POST", path, json=body)

    def begin(self, label: str) -> int | None:
        """Start a section (a task's setup, a postconfig); None when the guest cannot keep one."""
        try:
            return int(self._post("/drums/setup_log/mark", {"label": label})["mark"])
        except (requests.RequestException, ValueError, KeyError, TypeError) as exc:
            log.warning("the guest at %s keeps no setup log (%s): setup failures it only logs will go unseen",
                        self.base_url, exc)
            return None

    def step(self, index: int, stype: str) -> None:
        try:
            self._post("/drums/setup_log/step", {"index": int(index), "type": str(stype)})
        except (requests.RequestException, ValueError) as exc:
            log.debug("could not tag setup step %d: %s", index, exc)

    def note(self, index: int | None, stype: str | None, error: str) -> None:
        try:
            self._post("/drums/setup_log/note", {"index": index, "type": stype, "error": _text(error)})
        except (requests.RequestException, ValueError) as exc:
            log.warning("could not note the failure of setup step %s in the guest: %s", index, exc)

    def read(self, since: int | None = None, label: str | None = None) -> SetupReport:
        """The report of the entries after mark ``since``, or of the last section labelled
        ``label`` (a desktop restored after its setup: ``label="setup"``), or of the last section."""
        params: dict[str, Any] = {}
        if since is not None:
            params["since"] = int(since)
        elif label is not None:
            params["label"] = label
        try:
            return SetupReport.from_log(self._call("GET", "/drums/setup_log", limit=LOG_LIMIT, params=params))
        except BoundsExceeded as exc:
            if exc.reason == bounded.TOO_LARGE:
                return SetupReport(read_error="the guest's setup log is larger than 4 MiB")
            return SetupReport(read_error=_text(f"{exc.reason}: {exc}", 300))
        except (requests.RequestException, ValueError) as exc:
            return SetupReport(read_error=_text(f"{type(exc).__name__}: {exc}", 300))


def missing_apps_for(task: Mapping[str, Any] | None, image: str | None) -> dict[str, str]:
    """``{app: why}`` for the applications ``task`` needs that ``image`` lacks ({} when unknown)."""
    if not task or not image:
        return {}
    from .catalog import task_apps
    from .catalog.apps import image_packages, missing_apps

    try:
        return missing_apps(task_apps(task)["all"], image_packages(image))
    except (OSError, ValueError) as exc:
        log.debug("cannot tell which applications image %s lacks: %s", image, exc)
        return {}


def step_types(steps: Iterable[Mapping[str, Any]]) -> list[str]:
    return [str(s.get("type")) for s in steps if isinstance(s, Mapping)]
