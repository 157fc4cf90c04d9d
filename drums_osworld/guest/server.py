"""The guest HTTP server: OSWorld's in-desktop API (desktop-env 1.0.2) plus Drums' own endpoints.

Request and reply shapes follow what OSWorld's ``PythonController``, ``SetupController`` and
evaluator getters send and parse (the table :data:`~.routes.ENDPOINTS` names the callers). Errors are
always JSON with a reason: ``{"status": "error", "message": ..., "error": ...}`` (plus the
endpoint's own fields where OSWorld defines them); no reply ever carries a traceback. Status
codes follow OSWorld's guest where its clients look at them (for example a command that fails
to start or times out is a 500 with ``status: "error"``, as upstream).

The parts: :func:`create_app` wires the routes (:mod:`.routes`, a blueprint an area), the error
replies and request parsing (:mod:`.api`) and the shared state (:mod:`.state`) into one Flask
application; :func:`serve` runs it.
"""
from __future__ import annotations

import json
import logging
import os
import signal

from flask import Flask
from werkzeug.serving import WSGIRequestHandler, make_server

from . import routes, setup_log
from .api import VERSION, install_error_handlers, read_body
from .state import GuestConfig, GuestState, attach, current

log = logging.getLogger("drums.guest")

__all__ = ["VERSION", "GuestConfig", "create_app", "serve"]


def create_app(cfg: GuestConfig | None = None) -> Flask:
    """The guest server's Flask application, with a new :class:`GuestState` made from ``cfg``."""
    guest = GuestState(cfg or GuestConfig())
    app = Flask("drums_osworld.guest")
    attach(app, guest)
    setup_log.install(app, guest.setup_log)
    app.config["MAX_CONTENT_LENGTH"] = None
    install_error_handlers(app)

    @app.before_request
    def _before() -> None:
        guest.runner.reap()
        read_body()

    routes.register(app)
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
    guest = current(app)
    srv = make_server(host, port, app, threaded=True, request_handler=_Handler)
    real_port = srv.socket.getsockname()[1]
    log.info("drums guest server on %s:%d (display %s, commands as %s, home %s)",
             host, real_port, guest.xc.name, guest.runner.user_name, guest.runner.home)
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
        guest.close()
