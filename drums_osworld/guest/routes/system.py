"""The server and the machine: ``/platform``, ``/start_recording``, ``/end_recording``, and
Drums' own ``/drums/reseed`` and ``/drums/health``."""
from __future__ import annotations

import os
import platform
import random
import sys
import tempfile
import time

from flask import Blueprint, jsonify, send_file

from ..api import VERSION, ApiError
from ..recording import RecordingError
from ..state import current

bp = Blueprint("system", __name__)


@bp.route("/platform", methods=["GET"])
def get_platform():
    return platform.system()


@bp.route("/start_recording", methods=["POST"])
def start_recording():
    guest = current()
    try:
        guest.recorder.start()
    except RecordingError as exc:
        raise ApiError(exc.status, exc.message) from None
    return jsonify({"status": "success", "message": "Started recording successfully."})


@bp.route("/end_recording", methods=["POST"])
def end_recording():
    guest = current()
    try:
        path = guest.recorder.stop()
    except RecordingError as exc:
        raise ApiError(exc.status, exc.message) from None
    return send_file(path, mimetype="video/mp4", as_attachment=True,
                     download_name="recording.mp4", conditional=False, etag=False)


@bp.route("/drums/reseed", methods=["POST"])
def reseed():
    guest = current()
    with guest.reseed_lock:
        reseeded = ["random"]
        random.seed(int.from_bytes(os.urandom(32), "big"))
        np = sys.modules.get("numpy")
        if np is not None:
            np.random.seed(int.from_bytes(os.urandom(4), "big"))
            reseeded.append("numpy.random")
        if hasattr(tempfile, "_name_sequence"):
            tempfile._name_sequence = None  # its private Random is rebuilt from os.urandom
            reseeded.append("tempfile")
        guest.reseeds += 1
        draw = random.getrandbits(64)
    return jsonify({"draw": draw, "pid": os.getpid(), "reseeded": reseeded,
                    "reseeds": guest.reseeds, "time": time.time()})


@bp.route("/drums/health", methods=["GET"])
def health():
    guest = current()
    return jsonify({"ok": True, "pid": os.getpid(),
                    "uptime": round(time.time() - guest.started_at, 3),
                    "started_at": guest.started_at, "version": VERSION,
                    "display": guest.xc.name, "user": guest.runner.user_name,
                    "home": guest.runner.home, "children": len(guest.runner.children())})
