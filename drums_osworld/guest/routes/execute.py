"""Running commands and scripts: ``/execute``, ``/setup/execute``, ``/execute_with_verification``
(both spellings), ``/setup/launch``, ``/run_python``, ``/run_bash_script``."""
from __future__ import annotations

import os
import platform
import sys
import tempfile
import time

import flask
from flask import Blueprint, jsonify

from .. import windows
from ..api import MAX_TIMEOUT, ApiError, json_body, json_field, json_timeout
from ..commands import CommandTimeout
from ..state import GuestState, current

bp = Blueprint("execute", __name__)


def _execute(data: dict):
    guest = current()
    command, shell = guest.command_from(data)
    timeout = json_timeout(data, guest.cfg.exec_timeout)
    try:
        r = guest.runner.run(command, shell, timeout)
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


@bp.route("/execute", methods=["POST"])
@bp.route("/setup/execute", methods=["POST"])
def execute():
    return _execute(json_body())


@bp.route("/execute_with_verification", methods=["POST"])
@bp.route("/setup/execute_with_verification", methods=["POST"])
def execute_with_verification():
    guest = current()
    data = json_body()
    command, shell = guest.command_from(data)
    verification = json_field(data, "verification", (dict,), {})
    max_wait = json_field(data, "max_wait_time", (int, float), 10)
    interval = max(0.05, json_field(data, "check_interval", (int, float), 1))
    if not (0 <= max_wait <= MAX_TIMEOUT):
        raise ApiError(400, "max_wait_time out of range")
    try:
        r = guest.runner.run(command, shell, json_timeout(data, guest.cfg.exec_timeout))
    except CommandTimeout as exc:
        raise ApiError(500, str(exc), output=exc.output, returncode=-1) from None
    except OSError as exc:
        raise ApiError(500, str(exc), output="", returncode=-1) from None
    base = {"output": r.output, "error": r.error, "returncode": r.returncode}
    if not verification:
        return jsonify({"status": "success", **base})
    start = time.monotonic()
    while time.monotonic() - start < max_wait:
        if _verified(guest, verification):
            return jsonify({"status": "success", **base, "verification": "passed",
                            "wait_time": time.monotonic() - start})
        time.sleep(interval)
    return jsonify({"status": "verification_failed", **base, "verification": "failed",
                    "wait_time": max_wait}), 500


def _verified(guest: GuestState, verification: dict) -> bool:
    """Whether the checks of ``verification`` hold now: a window whose title holds
    ``window_exists``, and the command ``command_success`` exiting 0."""
    ok = True
    if "window_exists" in verification:
        name = str(verification["window_exists"]).lower()
        titles = [w.title.lower() for w in windows.list_windows(guest.xc)]
        ok = any(name in t for t in titles)
    if ok and "command_success" in verification:
        check = verification["command_success"]
        try:
            ok = guest.runner.run(check, isinstance(check, str), 5).returncode == 0
        except (CommandTimeout, OSError):
            ok = False
    return ok


@bp.route("/setup/launch", methods=["POST"])
def launch():
    guest = current()
    data = json_body()
    command, shell = guest.command_from(data)
    if isinstance(command, list) and "google-chrome" in command \
            and platform.machine().lower() in ("arm64", "aarch64", "aarch32"):
        command[command.index("google-chrome")] = "chromium"
    try:
        flask.g.drums_launch_pid = guest.runner.launch(command, shell)  # the setup log watches its exit
    except OSError as exc:
        raise ApiError(500, str(exc)) from None
    shown = command if shell else " ".join(command)
    return "{} launched successfully".format(shown)


@bp.route("/run_python", methods=["POST"])
def run_python():
    guest = current()
    data = json_body()
    code = data.get("code")
    if not code:
        raise ApiError(400, "Code not supplied!")
    if not isinstance(code, str):
        raise ApiError(400, f"field 'code' must be a string, got {type(code).__name__}")
    fd, path = tempfile.mkstemp(prefix="python_exec_", suffix=".py", dir=guest.workdir)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(code)
        guest.runner.chown(path)
        try:
            r = guest.runner.run([sys.executable, path], False, guest.cfg.run_python_timeout)
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


@bp.route("/run_bash_script", methods=["POST"])
def run_bash_script():
    guest = current()
    data = json_body()
    script = data.get("script")

    def fail(status: int, output: str):
        return jsonify({"status": "error", "output": output, "error": "",
                        "message": output, "returncode": -1}), status

    if not script:
        return fail(400, "Script not supplied!")
    if not isinstance(script, str):
        return fail(400, f"field 'script' must be a string, got {type(script).__name__}")
    try:
        timeout = json_timeout(data, guest.cfg.bash_timeout)
        working_dir = json_field(data, "working_dir", (str,), None)
    except ApiError as exc:
        return fail(400, exc.body["message"])
    if working_dir:
        working_dir = guest.runner.expand_path(working_dir)
        if not os.path.isdir(working_dir):
            return fail(400, f"Working directory does not exist: {working_dir}")
    if "#!/bin/bash" not in script:
        script = "#!/bin/bash\n\n" + script
    fd, path = tempfile.mkstemp(prefix="bash_exec_", suffix=".sh", dir=guest.workdir)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(script)
        os.chmod(path, 0o755)
        guest.runner.chown(path)
        shell = "/bin/bash" if os.path.exists("/bin/bash") else "sh"
        try:
            r = guest.runner.run([shell, path], False, timeout, merge_stderr=True,
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
