"""A small client of the guest server's HTTP API (OSWorld's ``desktop_env/server/main.py`` shapes).

Every Drums desktop runs a guest server on port 5000 that speaks the same endpoints and bodies as
OSWorld's in-VM Flask server, so OSWorld's own controllers and this client are interchangeable.
This client is what Drums' own setup runner and evaluators use when OSWorld is not installed.

Errors (all :class:`GuestError`, a :class:`drums_core.errors.DrumsError`)::

    GuestError
     +-- GuestUnavailable   no connection could be made after the bounded retries; the request was
     |                      never delivered, so nothing happened in the guest. Retrying is safe.
     +-- GuestTimeout       connected, but no reply in time; the guest may have acted. A reply that
     |                      was not complete within its total deadline (however slowly it came)
     |                      has reason ``SESSION_REPLY_TIMEOUT``.
     +-- GuestReplyTooLarge the reply was over its byte cap (``SESSION_REPLY_TOO_LARGE``).
     +-- GuestHTTPError     the guest answered with a non-2xx status (``status_code``, ``body``).
     +-- GuestProtocolError the guest answered 2xx with a body of the wrong shape.

Every reply is read through :mod:`drums_core.host.bounded` (the guest is the session's, and the
session is untrusted): at most ``max_reply`` bytes (``max_observation`` for screenshots, the a11y
tree, the terminal and commands' output), and complete within the request's timeout counted from
its start (connect, headers and body together; a reply dripped one byte at a time does not hold
the caller longer), or within ``body_timeout`` of its headers when the request waits without limit.

Only failures to *connect* are retried (``connect_retries`` times, ``retry_interval`` apart): a
request that reached the server is never sent twice, since ``/execute`` is not idempotent.
"""
from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

import requests

from drums_core.errors import DrumsError, Unavailable
from drums_core.reasons import Reason
from drums_core.host import bounded

logger = logging.getLogger("drums.osworld.guest_client")

__all__ = [
    "DEFAULT_PORT",
    "ExecResult",
    "GuestClient",
    "GuestError",
    "GuestHTTPError",
    "GuestProtocolError",
    "GuestReplyTooLarge",
    "GuestTimeout",
    "GuestUnavailable",
    "python_command",
]

DEFAULT_PORT = 5000
MAX_REPLY = 256 << 20        # a file the evaluator fetches
MAX_OBSERVATION = 32 << 20   # a screenshot, an a11y tree, a command's output (1920x1080 PNG: < 7 MiB)
BODY_TIMEOUT = 300.0         # a reply's body, when its request waits for the answer without limit

_DEFAULT: Any = object()  # "use the client's timeout"

#: The prefix OSWorld's ``PythonController.execute_python_command`` puts before pyautogui code.
PYAUTOGUI_PREFIX = "import pyautogui; import time; pyautogui.FAILSAFE = False; "


def python_command(code: str) -> list[str]:
    """The argv OSWorld's ``pyautogui`` action space sends to ``/execute`` for ``code``."""
    return ["python", "-c", PYAUTOGUI_PREFIX + code]


class GuestError(DrumsError):
    """A call to the guest server failed."""

    default_reason = Reason.GUEST_ERROR


class GuestUnavailable(GuestError, Unavailable):
    """No connection to the guest server; the request was never delivered. Retrying is safe."""

    default_reason = Reason.GUEST_UNREACHABLE


class GuestTimeout(GuestError):
    """The guest accepted the request but did not answer in time; it may have acted."""

    default_reason = Reason.GUEST_TIMEOUT


class GuestReplyTooLarge(GuestError):
    """The guest's reply was over its byte cap; what came was dropped. The guest may have acted."""

    default_reason = bounded.TOO_LARGE


class GuestHTTPError(GuestError):
    """The guest answered with a non-2xx status."""

    default_reason = Reason.GUEST_HTTP_ERROR

    def __init__(self, message: str, *, status_code: int, body: str, reason: str | None = None) -> None:
        super().__init__(message, reason=reason, detail={"status_code": status_code, "body": body})
        self.status_code = status_code
        self.body = body


class GuestProtocolError(GuestError):
    """The guest answered 2xx, but the body is not what the API promises."""

    default_reason = Reason.GUEST_BAD_REPLY


@dataclass(frozen=True)
class ExecResult:
    """The reply of ``/execute`` and ``/setup/execute``."""

    status: str
    output: str
    error: str
    returncode: int | None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, payload: Any) -> ExecResult:
        if not isinstance(payload, dict):
            raise GuestProtocolError(f"execute reply is not a JSON object: {payload!r:.200}")
        return cls(
            status=str(payload.get("status", "")),
            output=payload.get("output") or "",
            error=payload.get("error") or "",
            returncode=payload.get("returncode"),
            raw=payload,
        )

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "output": self.output, "error": self.error, "returncode": self.returncode}


def _is_connect_failure(exc: requests.RequestException) -> bool:
    """True when the request certainly never reached the server (refused, unreachable, DNS)."""
    if isinstance(exc, requests.exceptions.ConnectTimeout):
        return True
    if not isinstance(exc, requests.exceptions.ConnectionError):
        return False
    # requests wraps urllib3's MaxRetryError(reason=NewConnectionError) for refused/unreachable;
    # a ProtocolError ("Connection aborted") means the request may have been sent.
    import urllib3.exceptions as u3

    cause: Any = exc.args[0] if exc.args else None
    if isinstance(cause, u3.MaxRetryError):
        cause = cause.reason
    return isinstance(cause, (u3.NewConnectionError, u3.ConnectTimeoutError))


class GuestClient:
    """Talks to one guest server.

    ``GuestClient("169.254.0.2")`` or ``GuestClient(base_url="http://127.0.0.1:5000")``.
    ``timeout`` bounds every reply (``None`` waits forever, as OSWorld's setup calls do);
    ``connect_retries`` and ``retry_interval`` bound the retries of failed connections.
    """

    def __init__(
        self,
        ip: str | None = None,
        port: int = DEFAULT_PORT,
        *,
        base_url: str | None = None,
        timeout: float | None = 180.0,
        connect_timeout: float = 5.0,
        connect_retries: int = 3,
        retry_interval: float = 1.0,
        session: requests.Session | None = None,
        max_reply: int = MAX_REPLY,
        max_observation: int = MAX_OBSERVATION,
        body_timeout: float = BODY_TIMEOUT,
    ) -> None:
        if base_url is None:
            if not ip:
                raise ValueError("GuestClient needs an ip or a base_url")
            host = f"[{ip}]" if ":" in ip else ip
            base_url = f"http://{host}:{int(port)}"
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.connect_retries = max(0, int(connect_retries))
        self.retry_interval = retry_interval
        self.max_reply = int(max_reply)
        self.max_observation = int(max_observation)
        self.body_timeout = float(body_timeout)
        # its own session's connections are shut down at each request's deadline (bounded.deadline)
        self._session = session or bounded.deadline_session()
        self._own_session = session is None
        # Never route loopback / netns traffic through a proxy from the environment.
        self._session.trust_env = False

    def __repr__(self) -> str:
        return f"GuestClient({self.base_url!r})"

    def close(self) -> None:
        """Close the HTTP session (when this client made it)."""
        if self._own_session:
            self._session.close()

    def __enter__(self) -> GuestClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- transport -------------------------------------------------------------------------
    def _request(self, method: str, path: str, *, timeout: float | None = _DEFAULT, limit: int | None = None,
                 **kwargs: Any) -> requests.Response:
        """The reply to one request, its body read within bounds (``limit`` bytes, default
        ``max_reply``) and kept in ``resp.content``."""
        url = self.base_url + path
        read_timeout = self.timeout if timeout is _DEFAULT else timeout
        limit = self.max_reply if limit is None else limit
        attempts = self.connect_retries + 1
        last: requests.RequestException | None = None
        for attempt in range(attempts):
            if "files" in kwargs:  # rewind streams for a retried upload
                for value in kwargs["files"].values():
                    if hasattr(value[1], "seek"):
                        value[1].seek(0)
            t0 = time.monotonic()
            total = None if read_timeout is None else self.connect_timeout + read_timeout
            try:
                with bounded.deadline(None if total is None else t0 + total):
                    resp = self._session.request(method, url, timeout=(self.connect_timeout, read_timeout),
                                                 stream=True, **kwargs)
                    return self._finish(resp, method, path, url, limit,
                                        total if total is not None else self.body_timeout,
                                        t0 if total is not None else None)
            except requests.RequestException as exc:
                if total is not None and (bounded.deadline_fired() or time.monotonic() >= t0 + total):
                    raise GuestTimeout(f"{method} {url}: reply not complete within {total:g} s",
                                       reason=bounded.TIMEOUT) from exc
                if _is_connect_failure(exc):
                    last = exc
                    logger.debug("connect to %s failed (attempt %d/%d): %s", url, attempt + 1, attempts, exc)
                    if attempt + 1 < attempts:
                        time.sleep(self.retry_interval)
                    continue
                if isinstance(exc, requests.exceptions.Timeout):
                    raise GuestTimeout(f"{method} {url}: no reply within {read_timeout} s") from exc
                raise GuestError(f"{method} {url}: {exc}", reason=Reason.GUEST_CONNECTION_LOST) from exc
        raise GuestUnavailable(f"cannot connect to the guest server at {self.base_url} "
                               f"({attempts} attempts): {last}") from last

    @staticmethod
    def _finish(resp: requests.Response, method: str, path: str, url: str, limit: int, timeout: float,
                started: float | None) -> requests.Response:
        """Read the streamed ``resp``'s body within bounds into ``resp.content`` (or raise)."""
        what = f"{method} {url}"
        if not 200 <= resp.status_code < 300:
            try:
                body = bounded.read_response(resp, limit=64 << 10, timeout=timeout, what=what,
                                             started=started).decode("utf-8", "replace")[:2000]
            except Unavailable as exc:
                body = f"[{exc.reason}]"
            raise GuestHTTPError(f"{method} {path} -> HTTP {resp.status_code}: {body[:300]}",
                                 status_code=resp.status_code, body=body)
        try:
            data = bounded.read_response(resp, limit=limit, timeout=timeout, what=what, started=started)
        except Unavailable as exc:
            if exc.reason == bounded.TOO_LARGE:
                raise GuestReplyTooLarge(f"{what}: reply over {limit} bytes", detail=exc.detail) from exc
            raise GuestTimeout(f"{what}: {exc.message}", reason=exc.reason, detail=exc.detail) from exc
        resp._content = data  # what .content, .text and .json() read
        resp._content_consumed = True
        return resp

    @staticmethod
    def _json(resp: requests.Response) -> Any:
        try:
            return resp.json()
        except ValueError as exc:
            raise GuestProtocolError(f"{resp.request.method} {resp.url}: reply is not JSON: "
                                     f"{resp.text[:200]!r}") from exc

    def _post_json(self, path: str, payload: dict[str, Any], **kw: Any) -> requests.Response:
        return self._request("POST", path, data=json.dumps(payload),
                             headers={"Content-Type": "application/json"}, **kw)

    # -- commands ------------------------------------------------------------------------------
    def execute(self, command: str | list[str], shell: bool = False, *, setup: bool = False,
                timeout: float | None = _DEFAULT) -> ExecResult:
        """Run ``command`` in the guest and wait for it (``POST /execute``, or ``/setup/execute``).

        The guest runs it with a 120 s limit; a failing command is not an error here (see
        ``returncode``/``error``). A guest-side exception is a :class:`GuestHTTPError` (500).
        """
        path = "/setup/execute" if setup else "/execute"
        return ExecResult.from_json(self._json(self._post_json(path, {"command": command, "shell": shell},
                                                               timeout=timeout, limit=self.max_observation)))

    def run_python(self, code: str, **kw: Any) -> ExecResult:
        """Run pyautogui code exactly as OSWorld's ``pyautogui`` action space does."""
        return self.execute(python_command(code), shell=False, **kw)

    def launch(self, command: str | list[str], shell: bool = False) -> str:
        """Start ``command`` without waiting for it (``POST /setup/launch``)."""
        return self._post_json("/setup/launch", {"command": command, "shell": shell}).text

    def upload(self, path: str, data: bytes, *, timeout: float | None = 600.0) -> str:
        """Write ``data`` to ``path`` in the guest (``POST /setup/upload``; ``~`` is expanded there)."""
        import io

        name = os.path.basename(path) or "file"
        return self._request("POST", "/setup/upload", data={"file_path": path},
                             files={"file_data": (name, io.BytesIO(data))}, timeout=timeout).text

    def get_file(self, path: str) -> bytes | None:
        """The bytes of ``path`` in the guest (``POST /file``), or ``None`` when it does not exist."""
        try:
            return self._request("POST", "/file", data={"file_path": path}).content
        except GuestHTTPError as exc:
            if exc.status_code == 404:
                return None
            raise

    def open_file(self, path: str, *, timeout: float | None = 1810.0) -> str:
        """Open ``path`` with its application and wait for its window (``POST /setup/open_file``)."""
        return self._post_json("/setup/open_file", {"path": path}, timeout=timeout).text

    def activate_window(self, window_name: str, strict: bool = False, by_class: bool = False) -> str:
        """Raise and focus the window named ``window_name`` (its title, or WM class with ``by_class``);
        returns the server's answer."""
        return self._post_json("/setup/activate_window",
                               {"window_name": window_name, "strict": strict, "by_class": by_class}).text

    def close_window(self, window_name: str, strict: bool = False, by_class: bool = False) -> str:
        """Close the window named ``window_name`` (its title, or WM class with ``by_class``); returns the
        server's answer."""
        return self._post_json("/setup/close_window",
                               {"window_name": window_name, "strict": strict, "by_class": by_class}).text

    # -- observations ----------------------------------------------------------------------------
    def screenshot(self) -> bytes:
        """The screen as PNG (or JPEG) bytes (``GET /screenshot``)."""
        resp = self._request("GET", "/screenshot", timeout=30.0, limit=self.max_observation)
        data = resp.content
        if data[:8] == b"\x89PNG\r\n\x1a\n" or data[:3] == b"\xff\xd8\xff":
            return data
        raise GuestProtocolError(f"/screenshot returned {len(data)} bytes that are neither PNG nor JPEG")

    def accessibility(self) -> str | None:
        """The accessibility tree as XML (``GET /accessibility``, field ``AT``)."""
        payload = self._json(self._request("GET", "/accessibility", limit=self.max_observation))
        if not isinstance(payload, dict):
            raise GuestProtocolError(f"/accessibility reply is not a JSON object: {payload!r:.200}")
        return payload.get("AT")

    def terminal(self) -> str | None:
        """The active terminal's text, or ``None`` (``GET /terminal``, field ``output``)."""
        payload = self._json(self._request("GET", "/terminal", limit=self.max_observation))
        if not isinstance(payload, dict):
            raise GuestProtocolError(f"/terminal reply is not a JSON object: {payload!r:.200}")
        return payload.get("output")

    def wait_ready(self, timeout: float = 100.0, interval: float = 1.0) -> None:
        """Wait until the guest server answers at all, as OSWorld's setup probe does (``GET /terminal``).

        Any HTTP answer counts, even an error status. Raises :class:`GuestUnavailable` after ``timeout``.
        """
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while True:
            try:
                with bounded.deadline(time.monotonic() + self.connect_timeout + 30.0):
                    # any answer counts: its headers are enough, its body is not read
                    self._session.get(self.base_url + "/terminal", timeout=(self.connect_timeout, 30.0),
                                      stream=True).close()
                return
            except requests.RequestException as exc:
                last = exc
            if time.monotonic() >= deadline:
                raise GuestUnavailable(f"the guest server at {self.base_url} did not answer within "
                                       f"{timeout:g} s: {last}")
            time.sleep(interval)
