"""The guest HTTP server: OSWorld's in-desktop API (desktop-env 1.0.2) plus Drums' own endpoints.

Request and reply shapes follow what OSWorld's ``PythonController``, ``SetupController`` and
evaluator getters send and parse (the table in :data:`ENDPOINTS` names the callers). Errors are
always JSON with a reason: ``{"status": "error", "message": ..., "error": ...}`` (plus the
endpoint's own fields where OSWorld defines them); no reply ever carries a traceback. Status
codes follow OSWorld's guest where its clients look at them (for example a command that fails
to start or times out is a 500 with ``status: "error"``, as upstream).
"""
from __future__ import annotations

import json
import logging
import os
import platform
import random
import shlex
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any

import flask
from flask import Flask, Response, jsonify, request, send_file
from werkzeug.exceptions import HTTPException
from werkzeug.serving import WSGIRequestHandler, make_server

from . import a11y, setup_log, windows
from .commands import CommandTimeout, Runner
from .recording import Recorder, RecordingError
from .screen import DisplayUnavailable, XConnection

log = logging.getLogger("drums.guest")

VERSION = "1"

# Endpoint -> (methods, who calls it in OSWorld 1.0.2). Kept next to the code for reviewers.
ENDPOINTS = {
    "/screenshot": ("GET", "PythonController.get_screenshot (every observation)"),
    "/accessibility": ("GET", "PythonController.get_accessibility_tree"),
    "/terminal": ("GET", "PythonController.get_terminal_output; SetupController.setup probe"),
    "/execute": ("POST", "execute_python_command (every action); getters vm_command_line/error"),
    "/setup/execute": ("POST", "setup/postconfig `execute` and `command` steps"),
    "/setup/execute_with_verification": ("POST", "setup `execute_with_verification`"),
    "/setup/launch": ("POST", "setup `launch`"),
    "/setup/upload": ("POST", "setup `download`, `upload_file`, `update_browse_history`"),
    "/setup/open_file": ("POST", "setup `open`"),
    "/setup/activate_window": ("POST", "setup `activate_window`"),
    "/setup/close_window": ("POST", "setup `close_window`"),
    "/setup/change_wallpaper": ("POST", "setup `change_wallpaper`"),
    "/file": ("POST", "PythonController.get_file (getter vm_file and friends)"),
    "/screen_size": ("POST", "getter vm_screen_size"),
    "/window_size": ("POST", "getter vm_window_size"),
    "/wallpaper": ("POST", "getter vm_wallpaper"),
    "/desktop_path": ("POST", "Chrome getter get_shortcuts_on_desktop"),
    "/list_directory": ("POST", "getter list_directory"),
    "/platform": ("GET", "-"),
    "/cursor_position": ("GET", "-"),
    "/start_recording": ("POST", "lib_run_single (every episode)"),
    "/end_recording": ("POST", "lib_run_single (every episode)"),
    "/run_python": ("POST", "PythonController.run_python_script"),
    "/run_bash_script": ("POST", "PythonController.run_bash_script"),
    "/drums/reseed": ("POST", "Drums engine after restore"),
    "/drums/health": ("GET", "Drums engine and tests"),
    "/drums/setup_log": ("GET", "Drums provider, gym env, rollouts: how the last setup went (guest/setup_log.py)"),
}

LIBREOFFICE_EXTENSIONS = {
    ".doc", ".docx", ".docm", ".dot", ".dotx", ".odt", ".ott", ".fodt", ".rtf",
    ".xls", ".xlsx", ".xlsm", ".xlt", ".xltx", ".ods", ".ots", ".fods", ".csv",
    ".ppt", ".pptx", ".pptm", ".pot", ".potx", ".odp", ".otp", ".fodp",
    ".odg", ".otg", ".fodg", ".odf", ".odb",
}

MAX_TIMEOUT = 24 * 3600.0


@dataclass
class GuestConfig:
    """Settings of one server; the defaults are OSWorld's."""

    exec_timeout: float = 120.0        # /execute, /setup/execute
    open_timeout: float = 1800.0       # /setup/open_file waits this long for the window
    run_python_timeout: float = 30.0   # /run_python
    bash_timeout: float = 100.0        # /run_bash_script default when the client sends none
    run_as: str | None = None          # see commands.Runner
    display: str | None = None         # default: $DISPLAY, else :0
    workdir: str | None = None         # private scratch directory (default: a new /tmp dir)


class ApiError(Exception):
    """An error reply: ``status`` code and a JSON body (``message``/``error`` filled in)."""

    def __init__(self, status: int, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.status = status
        self.body = {"status": "error", "message": message, "error": message, **fields}


# --------------------------------------------------------------------------------------------
# request parsing
# --------------------------------------------------------------------------------------------
def _json_body(required: bool = True) -> dict:
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


def _field(data: dict, name: str, types: tuple, default: Any = None, required: bool = False):
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


def _flag(data: dict, name: str) -> bool:
    v = data.get(name, False)
    if v is None:
        return False
    if isinstance(v, (bool, int)) and not isinstance(v, float):
        return bool(v)
    if isinstance(v, str) and v.lower() in ("true", "false", "1", "0", ""):
        return v.lower() in ("true", "1")
    raise ApiError(400, f"field {name!r} must be a boolean, got {type(v).__name__}")


def _timeout(data: dict, default: float) -> float:
    """Drums extension: a client may send ``"timeout"`` (seconds); OSWorld never does."""
    t = _field(data, "timeout", (int, float), default)
    if not (0 < t <= MAX_TIMEOUT):
        raise ApiError(400, f"timeout must be in (0, {MAX_TIMEOUT:g}] seconds")
    return t


def _json_text(data: dict, name: str, missing: str) -> str:
    """The non-empty string field ``name`` of a JSON body; ApiError 400 with ``missing`` otherwise."""
    value = data.get(name)
    if not value or not isinstance(value, str):
        raise ApiError(400, missing)
    return value


def _error_reply(error: str, status: int, message: str | None = None) -> tuple[Response, int]:
    """OSWorld's error reply: ``{"status": "error", "error", "message"}`` (``message`` defaults to ``error``)."""
    return jsonify({"status": "error", "error": error, "message": error if message is None else message}), status


def _form_value(name: str) -> str | None:
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


# --------------------------------------------------------------------------------------------
# the application
# --------------------------------------------------------------------------------------------
class Guest:
    """State shared by the request handlers."""

    def __init__(self, cfg: GuestConfig) -> None:
        self.cfg = cfg
        if cfg.display:
            os.environ["DISPLAY"] = cfg.display
        self.runner = Runner(cfg.run_as)
        self.xc = XConnection(cfg.display or self.runner.env.get("DISPLAY"))
        self.workdir = cfg.workdir or tempfile.mkdtemp(prefix="drums-guest-")
        self._own_workdir = cfg.workdir is None
        os.makedirs(self.workdir, exist_ok=True)
        self.runner.chown(self.workdir)
        self.recorder = Recorder(self.workdir, self.xc.name, self.xc.screen_size)
        self.started_at = time.time()
        self.reseeds = 0
        self.setup_log = setup_log.SetupLog(self.runner.exit_status)
        self._reseed_lock = threading.Lock()

    def close(self) -> None:
        self.recorder.abort()
        self.xc.close()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    # -- shared helpers ----------------------------------------------------------------------
    def command_from(self, data: dict) -> tuple[list[str] | str, bool]:
        """OSWorld's command handling: str + shell=False is shlex-split; ``~/`` args expanded."""
        shell = _flag(data, "shell")
        command = data.get("command", "" if shell else [])
        if command is None:
            command = "" if shell else []
        if isinstance(command, str):
            if not shell:
                try:
                    command = shlex.split(command)
                except ValueError as exc:
                    raise ApiError(400, f"cannot split command: {exc}") from None
        elif isinstance(command, list):
            if not all(isinstance(a, str) for a in command):
                raise ApiError(400, "command list must contain only strings")
            if any("\x00" in a for a in command):
                raise ApiError(400, "command contains a NUL byte")
        else:
            raise ApiError(400, f"command must be a list of strings or a string, "
                                f"got {type(command).__name__}")
        if isinstance(command, str) and "\x00" in command:
            raise ApiError(400, "command contains a NUL byte")
        if not command or (isinstance(command, str) and not command.strip()):
            raise ApiError(400, "command is empty")
        if isinstance(command, list):
            command = [self.runner.expand_home(a) for a in command]
        return command, shell

    def path_from(self, raw: str) -> str:
        p = self.runner.expand_path(raw)
        if not os.path.isabs(p):
            p = os.path.join(self.runner.home, p)
        return p

    def makedirs(self, path: str) -> None:
        missing = []
        cur = path
        while cur and not os.path.exists(cur):
            missing.append(cur)
            parent = os.path.dirname(cur)
            if parent == cur:
                break
            cur = parent
        for d in reversed(missing):
            try:
                os.mkdir(d)
            except FileExistsError:
                continue
            self.runner.chown(d)


def create_app(cfg: GuestConfig | None = None) -> Flask:
    cfg = cfg or GuestConfig()
    g = Guest(cfg)
    app = Flask("drums_osworld.guest")
    app.extensions["drums_guest"] = g
    setup_log.install(app, g.setup_log)
    app.config["MAX_CONTENT_LENGTH"] = None

    # -- errors ------------------------------------------------------------------------------
    @app.errorhandler(ApiError)
    def _api_error(e: ApiError):
        return jsonify(e.body), e.status

    @app.errorhandler(HTTPException)
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

    @app.errorhandler(DisplayUnavailable)
    def _no_display(e: DisplayUnavailable):
        return _error_reply(str(e), 503)

    @app.errorhandler(Exception)
    def _internal(e: Exception):
        log.exception("unhandled error on %s %s", request.method, request.path)
        return _error_reply(f"{type(e).__name__}: {e}", 500)

    @app.before_request
    def _read_body():
        g.runner.reap()
        # Read the body up front, so that a malformed one (bad chunking, a multipart stream
        # that ends early, a client that hangs up) is a 400 here and not an error deep inside
        # a handler.
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

    # -- commands ----------------------------------------------------------------------------
    def _execute(data: dict):
        command, shell = g.command_from(data)
        timeout = _timeout(data, cfg.exec_timeout)
        try:
            r = g.runner.run(command, shell, timeout)
        except CommandTimeout as exc:
            t = int(timeout) if float(timeout).is_integer() else timeout
            msg = f"Command '{command}' timed out after {t} seconds"
            return jsonify({"status": "error", "message": msg, "error": msg,
                            "output": exc.output, "returncode": -1}), 500
        except OSError as exc:
            return jsonify({"status": "error", "message": str(exc), "error": str(exc),
                            "output": "", "returncode": -1}), 500
        return jsonify({"status": "success", "output": r.output, "error": r.error,
                        "returncode": r.returncode})

    @app.route("/execute", methods=["POST"])
    @app.route("/setup/execute", methods=["POST"])
    def execute():
        return _execute(_json_body())

    @app.route("/execute_with_verification", methods=["POST"])
    @app.route("/setup/execute_with_verification", methods=["POST"])
    def execute_with_verification():
        data = _json_body()
        command, shell = g.command_from(data)
        verification = _field(data, "verification", (dict,), {})
        max_wait = _field(data, "max_wait_time", (int, float), 10)
        interval = max(0.05, _field(data, "check_interval", (int, float), 1))
        if not (0 <= max_wait <= MAX_TIMEOUT):
            raise ApiError(400, "max_wait_time out of range")
        try:
            r = g.runner.run(command, shell, _timeout(data, cfg.exec_timeout))
        except CommandTimeout as exc:
            raise ApiError(500, str(exc), output=exc.output, returncode=-1) from None
        except OSError as exc:
            raise ApiError(500, str(exc), output="", returncode=-1) from None
        base = {"output": r.output, "error": r.error, "returncode": r.returncode}
        if not verification:
            return jsonify({"status": "success", **base})
        start = time.monotonic()
        while time.monotonic() - start < max_wait:
            ok = True
            if "window_exists" in verification:
                name = str(verification["window_exists"]).lower()
                titles = [w.title.lower() for w in windows.list_windows(g.xc)]
                ok = any(name in t for t in titles)
            if ok and "command_success" in verification:
                check = verification["command_success"]
                try:
                    ok = g.runner.run(check, isinstance(check, str), 5).returncode == 0
                except (CommandTimeout, OSError):
                    ok = False
            if ok:
                return jsonify({"status": "success", **base, "verification": "passed",
                                "wait_time": time.monotonic() - start})
            time.sleep(interval)
        return jsonify({"status": "verification_failed", **base, "verification": "failed",
                        "wait_time": max_wait}), 500

    @app.route("/setup/launch", methods=["POST"])
    def launch():
        data = _json_body()
        command, shell = g.command_from(data)
        if isinstance(command, list) and "google-chrome" in command \
                and platform.machine().lower() in ("arm64", "aarch64", "aarch32"):
            command[command.index("google-chrome")] = "chromium"
        try:
            flask.g.drums_launch_pid = g.runner.launch(command, shell)  # the setup log watches its exit
        except OSError as exc:
            raise ApiError(500, str(exc)) from None
        shown = command if shell else " ".join(command)
        return "{} launched successfully".format(shown)

    @app.route("/run_python", methods=["POST"])
    def run_python():
        data = _json_body()
        code = data.get("code")
        if not code:
            raise ApiError(400, "Code not supplied!")
        if not isinstance(code, str):
            raise ApiError(400, f"field 'code' must be a string, got {type(code).__name__}")
        fd, path = tempfile.mkstemp(prefix="python_exec_", suffix=".py", dir=g.workdir)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(code)
            g.runner.chown(path)
            try:
                r = g.runner.run([sys.executable, path], False, cfg.run_python_timeout)
            except CommandTimeout:
                return jsonify({"status": "error",
                                "message": "Execution timeout: Code took too long to execute",
                                "error": "TimeoutExpired", "need_more": False,
                                "output": None}), 500
            except OSError as exc:
                return jsonify({"status": "error", "message": f"Execution error: {exc}",
                                "error": str(exc), "need_more": False, "output": None}), 500
        finally:
            try:
                os.remove(path)
            except OSError:
                pass
        out, err = r.output, r.error
        message = out + (("\n" + err) if out else err) if err else out
        status = "success"
        if r.returncode != 0:
            status = "error"
            if not err:
                err = f"Process exited with code {r.returncode}"
                message = message + "\n" + err if message else err
        return jsonify({"status": status, "message": message, "need_more": False,
                        "output": out, "error": err, "return_code": r.returncode})

    @app.route("/run_bash_script", methods=["POST"])
    def run_bash_script():
        data = _json_body()
        script = data.get("script")

        def fail(status: int, output: str):
            return jsonify({"status": "error", "output": output, "error": "",
                            "message": output, "returncode": -1}), status

        if not script:
            return fail(400, "Script not supplied!")
        if not isinstance(script, str):
            return fail(400, f"field 'script' must be a string, got {type(script).__name__}")
        try:
            timeout = _timeout(data, cfg.bash_timeout)
            working_dir = _field(data, "working_dir", (str,), None)
        except ApiError as exc:
            return fail(400, exc.body["message"])
        if working_dir:
            working_dir = g.runner.expand_path(working_dir)
            if not os.path.isdir(working_dir):
                return fail(400, f"Working directory does not exist: {working_dir}")
        if "#!/bin/bash" not in script:
            script = "#!/bin/bash\n\n" + script
        fd, path = tempfile.mkstemp(prefix="bash_exec_", suffix=".sh", dir=g.workdir)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(script)
            os.chmod(path, 0o755)
            g.runner.chown(path)
            shell = "/bin/bash" if os.path.exists("/bin/bash") else "sh"
            try:
                r = g.runner.run([shell, path], False, timeout, merge_stderr=True,
                                 cwd=working_dir or None)
            except CommandTimeout:
                return fail(500, f"Script execution timed out after {timeout} seconds")
            except OSError as exc:
                return fail(500, f"Failed to execute script: {exc}")
        finally:
            try:
                os.remove(path)
            except OSError:
                pass
        return jsonify({"status": "success" if r.returncode == 0 else "error",
                        "output": r.output, "error": "", "returncode": r.returncode})

    # -- files -------------------------------------------------------------------------------
    @app.route("/file", methods=["POST"])
    def get_file():
        raw = _form_value("file_path")
        if not raw:
            return _error_reply("file_path is required", 400)
        path = g.path_from(raw)
        if not os.path.exists(path):
            return _error_reply("File not found", 404, f"File not found: {path}")
        if not os.path.isfile(path):
            return _error_reply("Not a regular file", 400, f"Not a regular file: {path}")
        try:
            return send_file(path, as_attachment=True, conditional=False, etag=False,
                             max_age=0)
        except OSError as exc:
            return _error_reply(f"Failed to serve file: {exc}", 500)

    @app.route("/setup/upload", methods=["POST"])
    def upload():
        raw = request.form.get("file_path")
        f = request.files.get("file_data")
        if not raw or f is None:
            return _error_reply("file_path and file_data are required", 400)
        path = g.path_from(raw)
        try:
            g.makedirs(os.path.dirname(path))
            f.save(path)
            g.runner.chown(path)
            size = os.path.getsize(path)
        except OSError as exc:
            try:
                if os.path.isfile(path):
                    os.remove(path)
            except OSError:
                pass
            return _error_reply(f"Failed to upload file: {exc}", 500)
        return f"File Uploaded: {size} bytes"

    @app.route("/list_directory", methods=["POST"])
    def list_directory():
        data = _json_body()
        if not isinstance(data.get("path"), str) or not data["path"]:
            raise ApiError(400, "Missing 'path' parameter")
        start = g.runner.expand_path(data["path"])
        if not os.path.isdir(start):
            raise ApiError(400, "The provided path is not a directory")
        budget = [200_000]
        seen: set[tuple[int, int]] = set()

        def walk(directory: str) -> dict:
            tree: dict = {"type": "directory", "name": os.path.basename(directory), "children": []}
            try:
                st_ = os.stat(directory)
                if (st_.st_dev, st_.st_ino) in seen:
                    return tree  # a symlink loop: list the directory once
                seen.add((st_.st_dev, st_.st_ino))
                for entry in sorted(os.listdir(directory)):
                    budget[0] -= 1
                    if budget[0] < 0:
                        break
                    full = os.path.join(directory, entry)
                    if os.path.isdir(full):
                        tree["children"].append(walk(full))
                    else:
                        tree["children"].append({"type": "file", "name": entry})
            except OSError as exc:
                tree = {"error": str(exc)}
            return tree

        return jsonify(directory_tree=walk(start))

    @app.route("/desktop_path", methods=["POST", "GET"])
    def desktop_path():
        p = os.path.join(g.runner.home, "Desktop")
        if os.path.exists(p):
            return jsonify(desktop_path=p)
        return _error_reply("Unsupported operating system or desktop path not found", 404)

    # -- screen and windows ------------------------------------------------------------------
    @app.route("/screenshot", methods=["GET"])
    def screenshot():
        png, info = g.xc.screenshot_png(with_cursor=True)
        resp = Response(png, mimetype="image/png")
        resp.headers["Cache-Control"] = "no-store"
        resp.headers["X-Drums-Grab-Ms"] = str(info["grab_ms"])
        resp.headers["X-Drums-Encode-Ms"] = str(info["encode_ms"])
        return resp

    @app.route("/screen_size", methods=["POST", "GET"])
    def screen_size():
        w, h = g.xc.screen_size()
        return jsonify({"width": w, "height": h})

    @app.route("/cursor_position", methods=["GET"])
    def cursor_position():
        x, y = g.xc.pointer()
        return jsonify(x, y)

    @app.route("/window_size", methods=["POST"])
    def window_size():
        name = _form_value("app_class_name")
        if not name:
            return _error_reply("app_class_name is required", 400)
        wins = windows.list_windows(g.xc)
        for w in sorted(wins, key=lambda w: w.id):
            if name.lower() in (w.instance.lower(), w.wm_class.lower()):
                return jsonify({"width": w.width, "height": w.height})
        return _error_reply("Window not found", 404, f"no window of class {name!r}")

    @app.route("/accessibility", methods=["GET"])
    def accessibility():
        return jsonify(a11y.accessibility_reply(g.xc))

    @app.route("/terminal", methods=["GET"])
    def terminal():
        out, source = a11y.terminal_output()
        return jsonify({"output": out, "status": "success", "source": source})

    @app.route("/setup/activate_window", methods=["POST"])
    @app.route("/setup/close_window", methods=["POST"])
    def window_action():
        data = _json_body()
        name = _json_text(data, "window_name", "window_name required")
        strict, by_class = _flag(data, "strict"), _flag(data, "by_class")
        closing = request.path.endswith("close_window")
        if not windows.wmctrl_by_name(g.xc, "c" if closing else "a", name, strict, by_class):
            raise ApiError(404, f"Window {name} not found")
        return "Window closed successfully." if closing else "Window activated successfully"

    @app.route("/setup/open_file", methods=["POST"])
    def open_file():
        data = _json_body()
        raw = _json_text(data, "path", "Path not supplied!")
        timeout = _timeout(data, cfg.open_timeout)
        path = g.path_from(raw)
        env_path = g.runner.env.get("PATH")
        if os.path.exists(path):
            base = os.path.basename(path.rstrip("/"))
            stem = os.path.splitext(base)[0]
            ext = os.path.splitext(base)[1].lower()
            opener = None
            if ext in LIBREOFFICE_EXTENSIONS:
                opener = next(([c] for c in ("libreoffice", "soffice")
                               if shutil.which(c, path=env_path)), None)
            if opener is None:
                if shutil.which("xdg-open", path=env_path):
                    opener = ["xdg-open"]
                elif shutil.which("gio", path=env_path):
                    opener = ["gio", "open"]
                else:
                    raise ApiError(500, f"no program to open {path}: neither xdg-open nor gio "
                                        "is installed")
            argv = opener + [path]
            names = [base, stem]
        else:
            if not shutil.which(raw, path=env_path):
                raise ApiError(404, f"Application/file not found: {raw}")
            argv = [raw]
            names = [raw]
        names = [n for n in names if n]
        try:
            pid = g.runner.launch(argv, False)
        except OSError as exc:
            raise ApiError(500, f"Failed to open {raw}. Error: {exc}") from None
        deadline = time.monotonic() + timeout
        while True:
            for w in windows.list_windows(g.xc):
                if any(n in w.title for n in names):
                    windows.activate_id(g.xc, w.id)
                    return "File opened and window activated successfully"
            rc = g.runner.exit_status(pid)
            if rc not in (None, 0):
                raise ApiError(500, f"Failed to open {raw}: {argv[0]} exited with status {rc}")
            if time.monotonic() >= deadline:
                t = int(timeout) if float(timeout).is_integer() else timeout
                raise ApiError(500, f"Failed to find window for {names[0]} within {t} seconds.")
            time.sleep(0.25)

    @app.route("/setup/change_wallpaper", methods=["POST"])
    def change_wallpaper():
        data = _json_body()
        raw = _json_text(data, "path", "Path not supplied!")
        path = g.path_from(raw)
        if not os.path.exists(path):
            raise ApiError(404, f"File not found: {path}")
        try:
            r = g.runner.run(["gsettings", "set", "org.gnome.desktop.background", "picture-uri",
                              f"file://{path}"], False, 30)
        except (OSError, CommandTimeout) as exc:
            raise ApiError(500, f"Failed to change wallpaper. Error: {exc}") from None
        if r.returncode != 0:
            raise ApiError(500, f"Failed to change wallpaper. Error: {r.error.strip()}")
        return "Wallpaper changed successfully"

    @app.route("/wallpaper", methods=["POST"])
    def wallpaper():
        try:
            r = g.runner.run(["gsettings", "get", "org.gnome.desktop.background", "picture-uri"],
                             False, 30)
        except (OSError, CommandTimeout) as exc:
            raise ApiError(404, f"Wallpaper file not found ({exc})") from None
        p = r.output.strip().replace("file://", "").replace("'", "")
        if r.returncode != 0 or not p or not os.path.isfile(p):
            raise ApiError(404, "Wallpaper file not found")
        return send_file(p, mimetype="image/png")

    # -- platform and recording ----------------------------------------------------------------
    @app.route("/platform", methods=["GET"])
    def get_platform():
        return platform.system()

    @app.route("/start_recording", methods=["POST"])
    def start_recording():
        try:
            g.recorder.start()
        except RecordingError as exc:
            raise ApiError(exc.status, exc.message) from None
        return jsonify({"status": "success", "message": "Started recording successfully."})

    @app.route("/end_recording", methods=["POST"])
    def end_recording():
        try:
            path = g.recorder.stop()
        except RecordingError as exc:
            raise ApiError(exc.status, exc.message) from None
        return send_file(path, mimetype="video/mp4", as_attachment=True,
                         download_name="recording.mp4", conditional=False, etag=False)

    # -- Drums ---------------------------------------------------------------------------------
    @app.route("/drums/reseed", methods=["POST"])
    def reseed():
        with g._reseed_lock:
            reseeded = ["random"]
            random.seed(int.from_bytes(os.urandom(32), "big"))
            np = sys.modules.get("numpy")
            if np is not None:
                np.random.seed(int.from_bytes(os.urandom(4), "big"))
                reseeded.append("numpy.random")
            if hasattr(tempfile, "_name_sequence"):
                tempfile._name_sequence = None  # its private Random is rebuilt from os.urandom
                reseeded.append("tempfile")
            g.reseeds += 1
            draw = random.getrandbits(64)
        return jsonify({"draw": draw, "pid": os.getpid(), "reseeded": reseeded,
                        "reseeds": g.reseeds, "time": time.time()})

    @app.route("/drums/health", methods=["GET"])
    def health():
        return jsonify({"ok": True, "pid": os.getpid(),
                        "uptime": round(time.time() - g.started_at, 3),
                        "started_at": g.started_at, "version": VERSION,
                        "display": g.xc.name, "user": g.runner.user_name,
                        "home": g.runner.home, "children": len(g.runner.children())})

    return app


# --------------------------------------------------------------------------------------------
# serving
# --------------------------------------------------------------------------------------------
class _Handler(WSGIRequestHandler):
    """Werkzeug's handler with JSON bodies for protocol-level errors and an idle timeout."""

    timeout = 300  # seconds a connection may sit idle or stall mid-request

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        if code == 505:
            code = 400  # a malformed request line, as far as clients are concerned: a 4xx
        try:
            short, long = self.responses[code]
        except KeyError:
            short, long = "Error", "Error"
        reason = message or short
        # Garbage request lines leave the default HTTP/0.9, under which http.server writes no
        # status line at all; answer them as HTTP/1.0 so the client sees a status and a reason.
        if getattr(self, "request_version", "HTTP/0.9") == "HTTP/0.9":
            self.request_version = "HTTP/1.0"
        body = json.dumps({"status": "error", "message": reason, "error": reason,
                           "code": code, "explain": explain or long}).encode()
        try:
            self.log_error("code %d, message %s", code, reason)
            self.send_response(code, short)
            self.send_header("Connection", "close")
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if getattr(self, "command", None) != "HEAD":
                self.wfile.write(body)
        except OSError:
            pass
        self.close_connection = True

    def handle(self) -> None:
        try:
            super().handle()
        except (ConnectionError, TimeoutError, OSError):
            pass


def serve(cfg: GuestConfig, host: str, port: int, port_file: str | None = None) -> None:
    app = create_app(cfg)
    g: Guest = app.extensions["drums_guest"]
    srv = make_server(host, port, app, threaded=True, request_handler=_Handler)
    real_port = srv.socket.getsockname()[1]
    log.info("drums guest server on %s:%d (display %s, commands as %s, home %s)",
             host, real_port, g.xc.name, g.runner.user_name, g.runner.home)
    if port_file:
        tmp = port_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"{real_port}\n")
        os.replace(tmp, port_file)

    def _stop(signum, frame):  # noqa: ARG001
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        srv.server_close()
        g.close()
