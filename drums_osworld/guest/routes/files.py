"""Files: ``/file`` (download), ``/setup/upload``, ``/list_directory``, ``/desktop_path``."""
from __future__ import annotations

import os

from flask import Blueprint, jsonify, request, send_file

from ..api import ApiError, error_reply, form_value, json_body
from ..state import current

bp = Blueprint("files", __name__)


@bp.route("/file", methods=["POST"])
def get_file():
    guest = current()
    raw = form_value("file_path")
    if not raw:
        return error_reply("file_path is required", 400)
    path = guest.path_from(raw)
    if not os.path.exists(path):
        return error_reply("File not found", 404, f"File not found: {path}")
    if not os.path.isfile(path):
        return error_reply("Not a regular file", 400, f"Not a regular file: {path}")
    try:
        return send_file(path, as_attachment=True, conditional=False, etag=False,
                         max_age=0)
    except OSError as exc:
        return error_reply(f"Failed to serve file: {exc}", 500)


@bp.route("/setup/upload", methods=["POST"])
def upload():
    guest = current()
    raw = request.form.get("file_path")
    f = request.files.get("file_data")
    if not raw or f is None:
        return error_reply("file_path and file_data are required", 400)
    path = guest.path_from(raw)
    try:
        guest.makedirs(os.path.dirname(path))
        f.save(path)
        guest.runner.chown(path)
        size = os.path.getsize(path)
    except OSError as exc:
        try:
            if os.path.isfile(path):
                os.remove(path)
        except OSError:
            pass
        return error_reply(f"Failed to upload file: {exc}", 500)
    return f"File Uploaded: {size} bytes"


@bp.route("/list_directory", methods=["POST"])
def list_directory():
    guest = current()
    data = json_body()
    if not isinstance(data.get("path"), str) or not data["path"]:
        raise ApiError(400, "Missing 'path' parameter")
    start = guest.runner.expand_path(data["path"])
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


@bp.route("/desktop_path", methods=["POST", "GET"])
def desktop_path():
    guest = current()
    p = os.path.join(guest.runner.home, "Desktop")
    if os.path.exists(p):
        return jsonify(desktop_path=p)
    return error_reply("Unsupported operating system or desktop path not found", 404)
