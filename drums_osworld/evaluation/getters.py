"""Drums' implementations of OSWorld 1.0.2 getters (``desktop_env.evaluators.getters``).

A getter is called as ``get_<type>(env, config)``. OSWorld passes its ``DesktopEnv``; Drums passes
an :class:`EvalContext` with the two things the getters here use: ``guest`` (a
:class:`~drums_osworld.guest.client.GuestClient` or anything with the same methods) and
``cache_dir`` (the task's cache directory, ``<cache base>/<task id>``).

Results and failure modes follow OSWorld's: ``vm_command_line`` gives ``None`` on an HTTP error,
``vm_file`` gives ``None`` for a file it cannot fetch, ``cache_file`` raises ``AssertionError``
for a missing file (OSWorld's ``assert``), and connection failures propagate.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from drums_osworld.guest.client import GuestError, GuestHTTPError

logger = logging.getLogger("drums.osworld.getters")

__all__ = [
    "GETTERS",
    "EvalContext",
    "get_cache_file",
    "get_rule",
    "get_vm_command_error",
    "get_vm_command_line",
    "get_vm_file",
]


@dataclass
class EvalContext:
    """What Drums' getters need from the environment (OSWorld's getters take ``DesktopEnv``)."""

    guest: Any
    cache_dir: str


def _execute_reply(env: Any, config: dict[str, Any]) -> dict[str, Any] | None:
    command = config["command"]
    shell = config.get("shell", False)
    try:
        result = env.guest.execute(command, shell)
    except GuestHTTPError as exc:
        logger.error("Failed to get vm command line. Status code: %d", exc.status_code)
        return None
    logger.debug("vm command %r -> %r", command, result)
    return result.raw or result.to_json()


def get_vm_command_line(env: Any, config: dict[str, Any]) -> str | None:
    """The stdout of ``config["command"]`` run in the guest (``POST /execute``)."""
    reply = _execute_reply(env, config)
    return None if reply is None else reply.get("output")


def get_vm_command_error(env: Any, config: dict[str, Any]) -> str | None:
    """The stderr of ``config["command"]`` run in the guest (``POST /execute``)."""
    reply = _execute_reply(env, config)
    return None if reply is None else reply.get("error")


def get_vm_file(env: Any, config: dict[str, Any]) -> str | list[str | None] | None:
    """Fetch guest file(s) into the cache dir; the local path (``None`` for a missing file).

    Config: ``path``, ``dest`` (names in the cache dir); ``multi`` (lists of both); ``gives``
    (indices returned, default ``[0]``; one index gives a path, several a list);
    ``time_suffix``/``time_format`` (single file: add the current time to ``dest``).
    """
    time_format = "%Y%m%d_%H%M%S"
    if not config.get("multi", False):
        paths: list[str] = [config["path"]]
        dests: list[str] = [config["dest"]]
        if config.get("time_suffix", False):
            time_format = config.get("time_format", time_format)
            dests = [f"{os.path.splitext(d)[0]}_{datetime.now().strftime(time_format)}{os.path.splitext(d)[1]}"
                     for d in dests]
    else:
        paths = config["path"]
        dests = config["dest"]

    cache_paths: list[str | None] = []
    gives = set(config.get("gives", [0]))
    for i, (p, d) in enumerate(zip(paths, dests, strict=False)):
        _path = os.path.join(env.cache_dir, d)
        try:
            try:
                file = env.guest.get_file(p)
            except GuestError as exc:  # OSWorld's controller returns None after its retries
                logger.warning("Failed to get file from VM: %s (%s)", p, exc)
                file = None
            if file is None:
                logger.warning("Failed to get file from VM: %s", p)
                if i in gives:
                    cache_paths.append(None)
                continue
            if i in gives:
                cache_paths.append(_path)
            try:
                os.makedirs(env.cache_dir, exist_ok=True)
                with open(_path, "wb") as f:
                    f.write(file)
            except Exception as e:  # noqa: BLE001 - OSWorld: a write failure gives None
                logger.error("error writing file %s: %s", _path, e)
                if i in gives:
                    cache_paths[-1] = None
        except Exception as e:  # noqa: BLE001
            logger.error("Error processing file %s: %s", p, e)
            if i in gives:
                cache_paths.append(None)
    return cache_paths[0] if len(cache_paths) == 1 else cache_paths


def get_rule(env: Any, config: dict[str, Any]) -> Any:
    """``config["rules"]``, as is."""
    return config["rules"]


def get_cache_file(env: Any, config: dict[str, Any]) -> str:
    """The path of ``config["path"]`` in the task's cache dir; ``AssertionError`` if it is missing."""
    _path = os.path.join(env.cache_dir, config["path"])
    if not os.path.exists(_path):
        raise AssertionError(f"cache file {_path} does not exist")
    return _path


#: Getter type -> function, as ``getattr(desktop_env.evaluators.getters, "get_" + type)`` resolves it.
GETTERS: dict[str, Callable[[Any, dict[str, Any]], Any]] = {
    "cache_file": get_cache_file,
    "rule": get_rule,
    "vm_command_error": get_vm_command_error,
    "vm_command_line": get_vm_command_line,
    "vm_file": get_vm_file,
}
