"""Run a task's setup steps (``config``, or an evaluator's ``postconfig``) against a guest.

This mirrors OSWorld 1.0.2's ``SetupController`` step by step, for the step types Drums' tasks
use: ``launch``, ``execute``, ``command``, ``sleep``, ``open``, ``activate_window``,
``close_window``, ``upload_file`` and ``download``. The same request goes to the same endpoint,
``{CLIENT_PASSWORD}``, ``{SCREEN_WIDTH_HALF}``, ``{SCREEN_HEIGHT_HALF}``, ``{SCREEN_WIDTH}`` and
``{SCREEN_HEIGHT}`` are substituted in ``execute``/``command`` commands only, and the failures
OSWorld only logs (a ``launch``, ``execute``, ``activate_window`` or ``close_window`` the guest
refuses) are only logged here too, unless ``strict=True``.

Differences, all for running offline and failing clearly:

- ``download`` never touches the network: the file must already be in the task's cache directory
  under OSWorld's cache name ``<uuid5(NAMESPACE_URL, url)>_<basename(path)>`` (where OSWorld's own
  ``download`` step would have stored it), else :class:`DownloadNotCached` names that path.
- an ``execute`` with ``until`` gives up after ``until_timeout`` seconds (OSWorld polls forever).
- unknown step types are rejected before any step runs (OSWorld fails when it reaches them).
"""
from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from drums_core.errors import DrumsError
from drums_core.reasons import Reason
from drums_osworld.guest.client import GuestError, GuestHTTPError, GuestUnavailable

logger = logging.getLogger("drums.osworld.setup")

__all__ = [
    "SUPPORTED_STEP_TYPES",
    "DownloadNotCached",
    "SetupError",
    "download_cache_path",
    "run_setup",
    "substitute_placeholders",
]

SUPPORTED_STEP_TYPES = frozenset({
    "launch", "execute", "command", "sleep", "open", "activate_window", "close_window",
    "upload_file", "download",
})

#: OSWorld gives up on an ``execute`` step after this many failed requests (with ``until``).
_MAX_EXECUTE_FAILURES = 5


class SetupError(DrumsError):
    """A setup step failed. ``step_index`` (0-based) and ``step_type`` say which; the steps before
    it ran and their effects remain in the guest."""

    default_reason = Reason.SETUP_STEP_FAILED

    def __init__(self, message: str, *, step_index: int | None = None, step_type: str | None = None,
                 reason: str | None = None) -> None:
        super().__init__(message, reason=reason, detail={"step_index": step_index, "step_type": step_type})
        self.step_index = step_index
        self.step_type = step_type


class DownloadNotCached(SetupError):
    """A ``download`` step's file is not in the local cache (Drums never downloads)."""

    default_reason = Reason.DOWNLOAD_NOT_CACHED


def substitute_placeholders(command: str | Sequence[str], *, client_password: str,
                            screen_width: int, screen_height: int) -> str | list[str]:
    """OSWorld's ``replace_screen_env_in_command``: the same placeholders, in the same order."""
    width_half = str(screen_width // 2)
    height_half = str(screen_height // 2)

    def one(item: str) -> str:
        item = item.replace("{CLIENT_PASSWORD}", client_password)
        item = item.replace("{SCREEN_WIDTH_HALF}", width_half)
        item = item.replace("{SCREEN_HEIGHT_HALF}", height_half)
        item = item.replace("{SCREEN_WIDTH}", str(screen_width))
        return item.replace("{SCREEN_HEIGHT}", str(screen_height))

    if isinstance(command, str):
        return one(command)
    return [one(item) for item in command]


def download_cache_path(task_cache_dir: str | os.PathLike[str], url: str, path: str) -> Path:
    """Where OSWorld's ``download`` step caches ``url`` for guest ``path``."""
    return Path(task_cache_dir) / f"{uuid.uuid5(uuid.NAMESPACE_URL, url)}_{os.path.basename(path)}"


class _Runner:
    def __init__(self, guest: Any, task_cache_dir: Path, client_password: str, screen_size: tuple[int, int],
                 strict: bool, until_timeout: float) -> None:
        self.guest = guest
        self.cache_dir = task_cache_dir
        self.client_password = client_password
        self.screen_width, self.screen_height = screen_size
        self.strict = strict
        self.until_timeout = until_timeout

    def _soft_fail(self, what: str, exc: Exception) -> None:
        """A failure OSWorld only logs."""
        if self.strict:
            raise exc
        logger.error("%s: %s", what, exc)

    # -- steps -------------------------------------------------------------------------------
    def launch(self, command: str | list[str], shell: bool = False) -> None:
        if not command:
            raise ValueError("Empty command to launch.")
        if not shell and isinstance(command, str) and len(command.split()) > 1:
            logger.warning("launch: command is a string; splitting it on whitespace as OSWorld does")
            command = command.split()
        try:
            logger.info("launch %r: %s", command, self.guest.launch(command, shell))
        except (GuestHTTPError, GuestUnavailable) as exc:
            self._soft_fail(f"launch {command!r} failed", exc)

    def execute(self, command: str | list[str], stdout: str = "", stderr: str = "", shell: bool = False,
                until: Mapping[str, Any] | None = None) -> None:
        if not command:
            raise ValueError("Empty command to launch.")
        until = until or {}
        command = substitute_placeholders(command, client_password=self.client_password,
                                          screen_width=self.screen_width, screen_height=self.screen_height)
        failures = 0
        deadline = time.monotonic() + self.until_timeout
        while True:
            results = None
            try:
                res = self.guest.execute(command, shell, setup=True)
                results = res.raw or res.to_json()
                if stdout:
                    (self.cache_dir / stdout).write_text(results["output"])
                if stderr:
                    (self.cache_dir / stderr).write_text(results["error"])
                logger.info("execute %r -> rc %s", command, results.get("returncode"))
            except (GuestHTTPError, GuestUnavailable) as exc:
                failures += 1
                if not until:
                    self._soft_fail(f"execute {command!r} failed", exc)
                else:
                    logger.error("execute %r failed: %s", command, exc)
            if not until:
                return
            if results is not None and (
                    ("returncode" in until and results["returncode"] == until["returncode"])
                    or ("stdout" in until and until["stdout"] in results["output"])
                    or ("stderr" in until and until["stderr"] in results["error"])):
                return
            if failures >= _MAX_EXECUTE_FAILURES:
                if self.strict:
                    raise SetupError(f"execute {command!r} failed {failures} times")
                return
            if time.monotonic() > deadline:
                raise SetupError(f"execute {command!r}: condition {dict(until)!r} not met within "
                                 f"{self.until_timeout:g} s", reason=Reason.SETUP_UNTIL_TIMEOUT)
            time.sleep(0.3)

    def command(self, command: str | list[str], **kwargs: Any) -> None:
        self.execute(command, **kwargs)

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def open(self, path: str) -> None:
        if not path:
            raise ValueError(f"Setup Open - Invalid path ({path}).")
        try:
            self.guest.open_file(path)
        except GuestError as exc:
            raise SetupError(f"Failed to open file {path!r}: {exc}") from exc

    def activate_window(self, window_name: str, strict: bool = False, by_class: bool = False) -> None:
        self._window_step("activate", self.guest.activate_window, window_name, strict, by_class)

    def close_window(self, window_name: str, strict: bool = False, by_class: bool = False) -> None:
        self._window_step("close", self.guest.close_window, window_name, strict, by_class)

    def _window_step(self, verb: str, call: Any, window_name: str, strict: bool, by_class: bool) -> None:
        if not window_name:
            raise ValueError(f"Setup Open - Invalid path ({window_name}).")  # OSWorld's message, as it is
        try:
            call(window_name, strict, by_class)
        except (GuestHTTPError, GuestUnavailable) as exc:
            self._soft_fail(f"{verb} window {window_name!r} failed", exc)

    def upload_file(self, files: list[dict[str, str]]) -> None:
        for f in files:
            local_path, path = f["local_path"], f["path"]
            if not os.path.exists(local_path):
                raise SetupError(f"Setup Upload - Invalid local path ({local_path}).")
            data = Path(local_path).read_bytes()
            last: Exception | None = None
            for attempt in range(3):
                try:
                    self.guest.upload(path, data)
                    last = None
                    break
                except (GuestHTTPError, GuestUnavailable) as exc:
                    last = exc
                    logger.error("upload attempt %d of %s failed: %s", attempt + 1, path, exc)
                if attempt < 2:
                    time.sleep(2 ** attempt)
            if last is not None:
                raise last

    def download(self, files: list[dict[str, str]]) -> None:
        for f in files:
            url, path = f["url"], f["path"]
            if not url or not path:
                raise SetupError(f"Setup Download - Invalid URL ({url}) or path ({path}).")
            cache_path = download_cache_path(self.cache_dir, url, path)
            if not cache_path.exists():
                raise DownloadNotCached(
                    f"download step: {url} is not in the local cache; Drums never downloads. "
                    f"Put the file at {cache_path} (OSWorld's cache name for this url and path)")
            self.guest.upload(path, cache_path.read_bytes())


def run_setup(steps: Sequence[Mapping[str, Any]], guest: Any, *, task_cache_dir: str | os.PathLike[str],
              client_password: str = "password", screen_size: tuple[int, int] = (1920, 1080),
              strict: bool = False, probe_timeout: float | None = 100.0,
              until_timeout: float = 600.0, on_step: Callable[[int, str], None] | None = None) -> None:
    """Run ``steps`` (a task's ``config`` or ``postconfig``) in order against ``guest``.

    ``task_cache_dir`` is the task's cache directory (``<cache base>/<task id>``): where
    ``execute`` writes its ``stdout``/``stderr`` files and ``download`` finds its files; it is
    created if missing. Before the first step the guest must answer (``probe_timeout`` seconds, as
    OSWorld's ``/terminal`` probe; ``None`` skips it), else
    :class:`~drums_osworld.guest.client.GuestUnavailable` and nothing ran. A step that fails raises
    :class:`SetupError` naming it (a transport failure is its ``__cause__`` and gives its
    ``reason``); the steps before it keep their effects. ``on_step(index, type)`` is called before
    each step (the gym env tags the guest's setup log with it).
    """
    unknown = [(i, s.get("type")) for i, s in enumerate(steps) if s.get("type") not in SUPPORTED_STEP_TYPES]
    if unknown:
        i, t = unknown[0]
        raise SetupError(f"setup step {i + 1}: Drums cannot run step type {t!r} "
                         f"(supported: {', '.join(sorted(SUPPORTED_STEP_TYPES))})",
                         step_index=i, step_type=t, reason=Reason.SETUP_STEP_UNSUPPORTED)
    cache = Path(task_cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    if not steps:
        return
    if probe_timeout is not None and hasattr(guest, "wait_ready"):
        guest.wait_ready(timeout=probe_timeout)
    runner = _Runner(guest, cache, client_password, screen_size, strict, until_timeout)
    for i, step in enumerate(steps):
        stype = step["type"]
        params = dict(step.get("parameters") or {})
        logger.info("setup step %d/%d: %s %r", i + 1, len(steps), stype, params)
        if on_step is not None:
            on_step(i, stype)
        try:
            getattr(runner, stype)(**params)
        except SetupError as exc:
            if exc.step_index is None:
                exc.step_index, exc.step_type = i, stype
                exc.detail = {"step_index": i, "step_type": stype}
                exc.message = f"setup step {i + 1} ({stype}) failed: {exc.message}"
                exc.args = (exc.message,)
            raise
        except GuestError as exc:
            raise SetupError(f"setup step {i + 1} ({stype}) failed: {exc}", step_index=i,
                             step_type=stype, reason=exc.reason) from exc
        except (ValueError, TypeError, KeyError, OSError) as exc:
            raise SetupError(f"setup step {i + 1} ({stype}) failed: {exc}", step_index=i,
                             step_type=stype) from exc
