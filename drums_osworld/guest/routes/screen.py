"""The screen: ``/screenshot``, ``/screen_size``, ``/cursor_position``."""
from __future__ import annotations

from flask import Blueprint, Response, jsonify

from ..state import current

bp = Blueprint("screen", __name__)


@bp.route("/screenshot", methods=["GET"])
def screenshot():
    guest = current()
    png, info = guest.xc.screenshot_png(with_cursor=True)
    resp = Response(png, mimetype="image/png")
    resp.headers["Cache-Control"] = "no-store"
    resp.headers["X-Drums-Grab-Ms"] = str(info["grab_ms"])
    resp.headers["X-Drums-Encode-Ms"] = str(info["encode_ms"])
    return resp


@bp.route("/screen_size", methods=["POST", "GET"])
def screen_size():
    guest = current()
    w, h = guest.xc.screen_size()
    return jsonify({"width": w, "height": h})


@bp.route("/cursor_position", methods=["GET"])
def cursor_position():
    guest = current()
    x, y = guest.xc.pointer()
    return jsonify(x, y)
