"""What the desktop shows as text: ``/accessibility`` (the tree) and ``/terminal``."""
from __future__ import annotations

from flask import Blueprint, jsonify

from .. import a11y
from ..state import current

bp = Blueprint("accessibility", __name__)


@bp.route("/accessibility", methods=["GET"])
def accessibility():
    guest = current()
    return jsonify(a11y.accessibility_reply(guest.xc))


@bp.route("/terminal", methods=["GET"])
def terminal():
    out, source = a11y.terminal_output()
    return jsonify({"output": out, "status": "success", "source": source})
