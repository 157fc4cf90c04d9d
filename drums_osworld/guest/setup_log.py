"""The guest's record of setup calls, so a failed setup is never mistaken for a score.

OSWorld's ``SetupController`` only logs most failures (a ``launch``, ``execute``,
``activate_window`` or ``close_window`` the guest refuses), and a launch that starts a program
the image lacks through a shell even succeeds at the HTTP level. The guest sees every
``/setup/*`` call, so it keeps the outcome of each in memory, where a checkpoint keeps it too:
a desktop restored from a post-setup snapshot still says how its setup went.

    POST /drums/setup_log/mark   {"label": str}           start a section: returns {"mark": n}
    POST /drums/setup_log/step   {"index": i, "type": t}  the host's setup step i (type t) begins
    POST /drums/setup_log/note   {"index", "type", "error"}  a step failed on the host side
    GET  /drums/setup_log[?since=n|?label=l]              the entries since mark n, or of the last
                                                           section labelled l (up to the next mark;
                                                           default: the last section), with ``errors``

An entry is an error when the guest answered the call with an error status (except a window that
``activate_window``/``close_window`` did not find: a warning, as OSWorld's guest never fails them), when a launched
program exited with 126 or 127 (not executable, not found: through a shell, a missing program
looks like a successful launch), or when an ``execute`` returned 126/127 or a Python traceback.
Everything in the log comes from inside the desktop: the host treats it as a report about the
desktop, bounded in size, never as a path or a command.
"""
from __future__ import annotations

import collections
import json
import threading
import time
from typing import Any

from flask import Flask, Response, g as request_ctx, jsonify, request

__all__ = ["SetupLog", "install"]

MAX_ENTRIES = 512
MAX_TEXT = 600
NOT_FOUND_CODES = (126, 127)
_TRACEBACK = "Traceback (most recent call last)"
# OSWorld's own guest answers these with 200 on Linux whether a window matched or not, and tasks
# rely on it (os 4783cc41 activates "Terminal" half a second after pressing ctrl+alt+t): a window
# not found is a warning in the log, not a failed setup.
WINDOW_ENDPOINTS = ("/setup/activate_window", "/setup/close_window")


def _clip(value: Any, n: int = MAX_TEXT) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= n else text[: n - 3] + "..."


class SetupLog:
    """Thread-safe, bounded. ``exit_status(pid)`` reports a launched program's exit (or None)."""

    def __init__(self, exit_status) -> None:
        self._lock = threading.Lock()
        self._entries: collections.deque[dict] = collections.deque(maxlen=MAX_ENTRIES)
        self._seq = 0
        self._mark = 0
        self._label = ""
        self._marks: collections.deque[tuple[int, str]] = collections.deque(maxlen=64)
        self._step: dict | None = None
        self._exit_status = exit_status

    def _add(self, entry: dict) -> dict:
        with self._lock:
            self._seq += 1
            entry = {"seq": self._seq, "time": round(time.time(), 3), **entry}
            if self._step is not None and "step" not in entry:
                entry["step"] = dict(self._step)
            self._entries.append(entry)
            return entry

    def mark(self, label: str) -> int:
        with self._lock:
            self._seq += 1
            self._mark, self._label, self._step = self._seq, _clip(label, 80), None
            self._marks.append((self._mark, self._label))
            return self._mark

    def step(self, index: int, stype: str) -> None:
        with self._lock:
            self._step = {"index": index, "type": _clip(stype, 60)}

    def note(self, index: int | None, stype: str | None, error: str) -> dict:
        step = {"index": index, "type": _clip(stype or "", 60)} if index is not None else None
        entry = {"endpoint": "(host)", "ok": False, "error": _clip(error)}
        if step is not None:
            entry["step"] = step
        return self._add(entry)

    def record(self, endpoint: str, status: int, command: Any, body: dict | None, pid: int | None) -> dict:
        ok = status < 400
        entry: dict[str, Any] = {"endpoint": endpoint, "status": status, "ok": ok}
        if command is not None:
            entry["command"] = _clip(command, 300)
        if body is not None and not ok:
            entry["error"] = _clip(body.get("message") or body.get("error") or f"HTTP {status}")
        if not ok and status == 404 and endpoint in WINDOW_ENDPOINTS:
            entry.update(ok=True, warning=entry.pop("error", "no such window"))
        if ok and body is not None and endpoint.endswith("execute"):
            rc = body.get("returncode")
            entry["returncode"] = rc
            err = str(body.get("error") or "")
            if rc in NOT_FOUND_CODES:
                entry.update(ok=False, error=_clip(f"exited with status {rc}: {err.strip() or 'command not found'}"))
            elif rc not in (0, None) and _TRACEBACK in err:
                entry.update(ok=False, error=_clip(f"exited with status {rc}: " + err.strip().splitlines()[-1]))
        if pid is not None:
            entry["pid"] = pid
        return self._add(entry)

    def read(self, since: int | None = None, label: str | None = None) -> dict:
        with self._lock:
            start, end, mark, found = self._mark, None, self._mark, self._label
            if since is not None:
                start = since
            elif label is not None:
                hits = [i for i, (_, lab) in enumerate(self._marks) if lab == label]
                if hits:
                    i = hits[-1]
                    start = mark = self._marks[i][0]
                    found = label
                    end = self._marks[i + 1][0] if i + 1 < len(self._marks) else None
                else:
                    start, mark, found = self._seq, 0, ""
            entries = [dict(e) for e in self._entries if e["seq"] > start and (end is None or e["seq"] < end)]
            label = found
        for e in entries:
            pid = e.pop("pid", None)
            if pid is None or not e.get("ok"):
                continue
            rc = self._exit_status(pid)
            e["exit_status"] = "running" if rc is None else rc
            if rc in NOT_FOUND_CODES:
                e.update(ok=False, error=f"the launched program exited with status {rc} (not found or not "
                                         f"executable): {e.get('command', '')}")
        errors = [e for e in entries if not e.get("ok")]
        return {"mark": mark, "label": label, "since": start, "entries": entries, "errors": errors}


def _command_of(path: str) -> Any:
    data = request.get_json(silent=True, cache=True)
    if data is None and not request.mimetype.startswith("multipart/"):
        try:
            data = json.loads(request.get_data(cache=True) or b"null")
        except ValueError:
            data = None
    if isinstance(data, dict):
        for key in ("command", "path", "window_name", "url"):
            if key in data:
                return data[key]
    if path.endswith("/upload"):
        return request.form.get("file_path")
    return None


def install(app: Flask, log: SetupLog) -> None:
    """Record every ``/setup/*`` call of ``app`` in ``log`` and serve ``/drums/setup_log``."""

    @app.after_request
    def _record(resp: Response) -> Response:
        if not request.path.startswith("/setup/") or request.method != "POST":
            return resp
        try:
            body = resp.get_json(silent=True) if resp.is_json else None
            log.record(request.path, resp.status_code, _command_of(request.path),
                       body if isinstance(body, dict) else None, getattr(request_ctx, "drums_launch_pid", None))
        except Exception:  # noqa: BLE001 - the record must never break the call it records
            app.logger.exception("could not record %s in the setup log", request.path)
        return resp

    def _body() -> dict:
        data = request.get_json(silent=True, force=True)
        return data if isinstance(data, dict) else {}

    @app.route("/drums/setup_log/mark", methods=["POST"])
    def setup_log_mark():
        return jsonify({"mark": log.mark(str(_body().get("label", "")))})

    @app.route("/drums/setup_log/step", methods=["POST"])
    def setup_log_step():
        data = _body()
        index = data.get("index")
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            return jsonify({"status": "error", "message": "index must be a step number >= 0"}), 400
        log.step(index, str(data.get("type", "")))
        return jsonify({"status": "success"})

    @app.route("/drums/setup_log/note", methods=["POST"])
    def setup_log_note():
        data = _body()
        index = data.get("index")
        if index is not None and (not isinstance(index, int) or isinstance(index, bool) or index < 0):
            return jsonify({"status": "error", "message": "index must be a step number >= 0"}), 400
        if not data.get("error"):
            return jsonify({"status": "error", "message": "error is required"}), 400
        return jsonify(log.note(index, data.get("type"), str(data["error"])))

    @app.route("/drums/setup_log", methods=["GET"])
    def setup_log_read():
        since = request.args.get("since")
        if since is not None:
            try:
                since = int(since)
            except ValueError:
                return jsonify({"status": "error", "message": "since must be an integer"}), 400
        return jsonify(log.read(since, request.args.get("label")))
