"""What the guest server's handlers share: error replies and request parsing.

Every error reply is JSON with a reason (``{"status": "error", "message": ..., "error": ...}``), never a
traceback: a handler raises :class:`ApiError`, and :func:`install_error_handlers` turns it, an HTTP
error, a missing display or any other exception into that shape.
"""
from __future__ import annotations

import json
import logging
from typing import Any

from flask import Flask, Response, jsonify, request
from werkzeug.exceptions import HTTPException

from .screen import DisplayUnavailable

log = logging.getLogger("drums.guest")

#: The guest server's version (``/drums/health``).
VERSION = "1"

#: The longest ``timeout`` (seconds) a client may ask for.
MAX_TIMEOUT = 24 * 3600.0


class ApiError(Exception):
    """An error reply: ``status`` code and a JSON body (``message``/``error`` filled in)."""

    def __init__(self, status: int, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.status = status
        self.body = {"status": "error", "message": message, "error": message, **fields}


def json_body(required: bool = True) -> dict:
    """The request's JSON object body (``{}`` when empty and not ``required``); ApiError 400 otherwise."""
    raw = request.get_data(cache=True)
    if not raw or not raw.strip():
        if required:
            raise ApiError(400, "request body must be a JSON object, got an empty body")
        return {}
    try:
        data = json.loads(raw)
    except ValueError as exc:  # includes UnicodeDecodeError
        raise ApiError(400, f"invalid JSON body: {exc}") from None
    if not isinstance(data, dict):
        raise ApiError(400, f"JSON body must be an object, got {type(data).__name__}")
    return data


def json_field(data: dict, name: str, types: tuple, default: Any = None, required: bool = False):
    """Field ``name`` of ``data`` if it has one of ``types`` (a bool is not a number); ApiError 400 otherwise."""
    if name not in data or data[name] is None:
        if required:
            raise ApiError(400, f"missing field {name!r}")
        return default
    v = data[name]
    if bool not in types and isinstance(v, bool) and (int in types or float in types):
        raise ApiError(400, f"field {name!r} must be {'/'.join(t.__name__ for t in types)}")
    if not isinstance(v, types):
        raise ApiError(400, f"field {name!r} must be {'/'.join(t.__name__ for t in types)}, "
                            f"got {type(v).__name__}")
    return v


def json_flag(data: dict, name: str) -> bool:
    """A boolean field, also sent as 0/1 or "true"/"false"."""
    v = data.get(name, False)
    if v is None:
        return False
    if isinstance(v, (bool, int)) and not isinstance(v, float):
        return bool(v)
    if isinstance(v, str) and v.lower() in ("true", "false", "1", "0", ""):
        return v.lower() in ("true", "1")
    raise ApiError(400, f"field {name!r} must be a boolean, got {type(v).__name__}")


def json_timeout(data: dict, default: float) -> float:
    """Drums extension: a client may send ``"timeout"`` (seconds); OSWorld never does."""
    t = json_field(data, "timeout", (int, float), default)
    if not (0 < t <= MAX_TIMEOUT):
        raise ApiError(400, f"timeout must be in (0, {MAX_TIMEOUT:g}] seconds")
    return t


def json_text(data: dict, name: str, missing: str) -> str:
    """The non-empty string field ``name`` of a JSON body; ApiError 400 with ``missing`` otherwise."""
    value = data.get(name)
    if not value or not isinstance(value, str):
        raise ApiError(400, missing)
    return value


def error_reply(error: str, status: int, message: str | None = None) -> tuple[Response, int]:
    """OSWorld's error reply: ``{"status": "error", "error", "message"}`` (``message`` defaults to ``error``)."""
    return jsonify({"status": "error", "error": error, "message": error if message is None else message}), status


def form_value(name: str) -> str | None:
    """A form field, also accepted from a JSON body or the query string."""
    v = request.form.get(name)
    if v is None and request.is_json:
        try:
            body = request.get_json(silent=True)
        except Exception:  # noqa: BLE001
            body = None
        if isinstance(body, dict) and isinstance(body.get(name), str):
            v = body[name]
    if v is None:
        v = request.args.get(name)
    return v


def _api_error(e: ApiError):
    return jsonify(e.body), e.status


def _http_error(e: HTTPException):
    msg = e.description or e.name
    if e.code == 404:
        msg = f"unknown endpoint {request.method} {request.path}"
    elif e.code == 405:
        msg = f"method {request.method} not allowed for {request.path}"
    body = {"status": "error", "message": msg, "error": msg, "code": e.code}
    resp = jsonify(body)
    resp.status_code = e.code or 500
    if e.code == 405:
        allowed = e.get_headers()
        for k, v in allowed:
            if k.lower() == "allow":
                resp.headers["Allow"] = v
    return resp


def _no_display(e: DisplayUnavailable):
    return error_reply(str(e), 503)


def _internal(e: Exception):
    log.exception("unhandled error on %s %s", request.method, request.path)
    return error_reply(f"{type(e).__name__}: {e}", 500)


def read_body() -> None:
    """A ``before_request`` hook: read the body up front, so that a malformed one (bad chunking, a
    multipart stream that ends early, a client that hangs up) is a 400 here and not an error deep
    inside a handler."""
    if request.routing_exception is not None or request.method not in ("POST", "PUT", "PATCH"):
        return
    try:
        if request.mimetype in ("multipart/form-data", "application/x-www-form-urlencoded"):
            request.form  # noqa: B018 - parses form fields and files
            request.files  # noqa: B018
        else:
            request.get_data(cache=True)
    except HTTPException:
        raise
    except (OSError, ValueError) as exc:
        raise ApiError(400, f"malformed request body: {exc}") from None


def install_error_handlers(app: Flask) -> None:
    """Every error of ``app`` answers as JSON with a reason (see the module docstring)."""
    app.register_error_handler(ApiError, _api_error)
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(DisplayUnavailable, _no_display)
    app.register_error_handler(Exception, _internal)
