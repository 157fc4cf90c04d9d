"""The desktop's windows and apps: ``/window_size``, ``/setup/activate_window``, ``/setup/close_window``,
``/setup/open_file``, ``/setup/change_wallpaper``, ``/wallpaper``."""
from __future__ import annotations

import os
import shutil
import time

from flask import Blueprint, jsonify, request, send_file

from .. import windows
from ..api import ApiError, error_reply, form_value, json_body, json_flag, json_text, json_timeout
from ..commands import CommandTimeout
from ..state import GuestState, current

bp = Blueprint("desktop", __name__)

#: Files ``/setup/open_file`` opens with LibreOffice (when installed) rather than xdg-open.
LIBREOFFICE_EXTENSIONS = {
    ".doc", ".docx", ".docm", ".dot", ".dotx", ".odt", ".ott", ".fodt", ".rtf",
    ".xls", ".xlsx", ".xlsm", ".xlt", ".xltx", ".ods", ".ots", ".fods", ".csv",
    ".ppt", ".pptx", ".pptm", ".pot", ".potx", ".odp", ".otp", ".fodp",
    ".odg", ".otg", ".fodg", ".odf", ".odb",
}


@bp.route("/window_size", methods=["POST"])
def window_size():
    guest = current()
    name = form_value("app_class_name")
    if not name:
        return error_reply("app_class_name is required", 400)
    wins = windows.list_windows(guest.xc)
    for w in sorted(wins, key=lambda w: w.id):
        if name.lower() in (w.instance.lower(), w.wm_class.lower()):
            return jsonify({"width": w.width, "height": w.height})
    return error_reply("Window not found", 404, f"no window of class {name!r}")


@bp.route("/setup/activate_window", methods=["POST"])
@bp.route("/setup/close_window", methods=["POST"])
def window_action():
    guest = current()
    data = json_body()
    name = json_text(data, "window_name", "window_name required")
    strict, by_class = json_flag(data, "strict"), json_flag(data, "by_class")
    closing = request.path.endswith("close_window")
    if not windows.wmctrl_by_name(guest.xc, "c" if closing else "a", name, strict, by_class):
        raise ApiError(404, f"Window {name} not found")
    return "Window closed successfully." if closing else "Window activated successfully"


@bp.route("/setup/open_file", methods=["POST"])
def open_file():
    guest = current()
    data = json_body()
    raw = json_text(data, "path", "Path not supplied!")
    timeout = json_timeout(data, guest.cfg.open_timeout)
    argv, names = _what_opens(guest, raw)
    try:
        pid = guest.runner.launch(argv, False)
    except OSError as exc:
        raise ApiError(500, f"Failed to open {raw}. Error: {exc}") from None
    _activate_when_shown(guest, names, pid, timeout, raw, argv[0])
    return "File opened and window activated successfully"


def _what_opens(guest: GuestState, raw: str) -> tuple[list[str], list[str]]:
    """The command that opens ``raw`` (a file, else a program on PATH) and the window titles to wait for."""
    path = guest.path_from(raw)
    env_path = guest.runner.env.get("PATH")
    if not os.path.exists(path):
        if not shutil.which(raw, path=env_path):
            raise ApiError(404, f"Application/file not found: {raw}")
        return [raw], [raw]
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
    return opener + [path], [n for n in (base, stem) if n]


def _activate_when_shown(guest: GuestState, names: list[str], pid: int, timeout: float, raw: str,
                         program: str) -> None:
    """Wait for a window whose title holds one of ``names`` and activate it; ApiError 500 when the
    opener (``pid``) fails or ``timeout`` passes first."""
    deadline = time.monotonic() + timeout
    while True:
        for w in windows.list_windows(guest.xc):
            if any(n in w.title for n in names):
                windows.activate_id(guest.xc, w.id)
                return
        rc = guest.runner.exit_status(pid)
        if rc not in (None, 0):
            raise ApiError(500, f"Failed to open {raw}: {program} exited with status {rc}")
        if time.monotonic() >= deadline:
            t = int(timeout) if float(timeout).is_integer() else timeout
            raise ApiError(500, f"Failed to find window for {names[0]} within {t} seconds.")
        time.sleep(0.25)


@bp.route("/setup/change_wallpaper", methods=["POST"])
def change_wallpaper():
    guest = current()
    data = json_body()
    raw = json_text(data, "path", "Path not supplied!")
    path = guest.path_from(raw)
    if not os.path.exists(path):
        raise ApiError(404, f"File not found: {path}")
    try:
        r = guest.runner.run(["gsettings", "set", "org.gnome.desktop.background", "picture-uri",
                          f"file://{path}"], False, 30)
    except (OSError, CommandTimeout) as exc:
        raise ApiError(500, f"Failed to change wallpaper. Error: {exc}") from None
    if r.returncode != 0:
        raise ApiError(500, f"Failed to change wallpaper. Error: {r.error.strip()}")
    return "Wallpaper changed successfully"


@bp.route("/wallpaper", methods=["POST"])
def wallpaper():
    guest = current()
    try:
        r = guest.runner.run(["gsettings", "get", "org.gnome.desktop.background", "picture-uri"],
                         False, 30)
    except (OSError, CommandTimeout) as exc:
        raise ApiError(404, f"Wallpaper file not found ({exc})") from None
    p = r.output.strip().replace("file://", "").replace("'", "")
    if r.returncode != 0 or not p or not os.path.isfile(p):
        raise ApiError(404, "Wallpaper file not found")
    return send_file(p, mimetype="image/png")
