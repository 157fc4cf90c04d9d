"""GuestClient against a scripted HTTP server on loopback."""
from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from email import policy
from email.parser import BytesParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

import pytest

from drums_core.errors import DrumsError, Unavailable
from drums_osworld.guest.client import (
    GuestClient,
    GuestError,
    GuestHTTPError,
    GuestProtocolError,
    GuestTimeout,
    GuestUnavailable,
    python_command,
)

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16


class Scripted:
    """path -> handler(body) returning (status, content_type, bytes) or the string "drop"/"hang"."""

    def __init__(self) -> None:
        self.routes: dict[str, Callable[[Any], Any]] = {}
        self.seen: list[tuple[str, str, Any]] = []


@pytest.fixture
def server() -> Iterator[tuple[Scripted, str]]:
    script = Scripted()
    release = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a: Any) -> None:
            pass

        def _handle(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            ctype = self.headers.get("Content-Type", "")
            if ctype.startswith("application/json"):
                body: Any = json.loads(raw)
            elif ctype.startswith("multipart/form-data"):
                msg = BytesParser(policy=policy.default).parsebytes(
                    f"Content-Type: {ctype}\r\n\r\n".encode() + raw)
                body = {p.get_param("name", header="content-disposition"): p.get_payload(decode=True)
                        for p in msg.iter_parts()}
            elif raw:
                body = {k: v[0] for k, v in parse_qs(raw.decode()).items()}
            else:
                body = None
            script.seen.append((method, self.path, body))
            handler = script.routes.get(self.path)
            result = handler(body) if handler else (404, "application/json", b'{"error": "nf"}')
            if result == "drop":
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            if result == "hang":
                release.wait(5)
                return
            status, ctype, data = result
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._handle("GET")

        def do_POST(self) -> None:
            self._handle("POST")

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield script, f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        release.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


def js(obj: Any, status: int = 200) -> tuple[int, str, bytes]:
    return status, "application/json", json.dumps(obj).encode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_base_url():
    assert GuestClient("169.254.0.2").base_url == "http://169.254.0.2:5000"
    assert GuestClient("10.0.0.1", 5001).base_url == "http://10.0.0.1:5001"
    assert GuestClient("fe80::1").base_url == "http://[fe80::1]:5000"
    assert GuestClient(base_url="http://127.0.0.1:9/").base_url == "http://127.0.0.1:9"
    with pytest.raises(ValueError):
        GuestClient()


def test_execute_and_setup_execute(server):
    script, url = server
    reply = {"status": "success", "output": "out", "error": "err", "returncode": 3}
    script.routes["/execute"] = lambda body: js(reply)
    script.routes["/setup/execute"] = lambda body: js(reply)
    with GuestClient(base_url=url) as g:
        res = g.execute(["ls", "-l"])
        assert (res.output, res.error, res.returncode, res.status) == ("out", "err", 3, "success")
        assert res.raw == reply
        g.execute("echo hi", shell=True, setup=True)
        g.run_python("pyautogui.click(1, 2)")
    assert script.seen[0] == ("POST", "/execute", {"command": ["ls", "-l"], "shell": False})
    assert script.seen[1] == ("POST", "/setup/execute", {"command": "echo hi", "shell": True})
    assert script.seen[2][2] == {"command": python_command("pyautogui.click(1, 2)"), "shell": False}
    assert python_command("x()")[2] == "import pyautogui; import time; pyautogui.FAILSAFE = False; x()"


def test_http_errors_are_typed(server):
    script, url = server
    script.routes["/execute"] = lambda body: js({"status": "error", "message": "boom"}, 500)
    with GuestClient(base_url=url) as g:
        with pytest.raises(GuestHTTPError) as info:
            g.execute("x")
    err = info.value
    assert err.status_code == 500 and "boom" in err.body and isinstance(err, DrumsError)
    assert err.reason == "GUEST_HTTP_ERROR" and len(script.seen) == 1


def test_bad_replies_are_protocol_errors(server):
    script, url = server
    script.routes["/execute"] = lambda body: (200, "text/html", b"<html>")
    script.routes["/screenshot"] = lambda body: (200, "image/png", b"not an image")
    script.routes["/terminal"] = lambda body: js([1])
    with GuestClient(base_url=url) as g:
        with pytest.raises(GuestProtocolError):
            g.execute("x")
        with pytest.raises(GuestProtocolError):
            g.screenshot()
        with pytest.raises(GuestProtocolError):
            g.terminal()


def test_files(server):
    script, url = server
    script.routes["/file"] = lambda body: (200, "application/octet-stream", b"\x00bytes") \
        if body["file_path"] == "~/a" else js({"error": "File not found"}, 404)
    script.routes["/setup/upload"] = lambda body: (200, "text/html", b"File Uploaded: 5 bytes")
    with GuestClient(base_url=url) as g:
        assert g.get_file("~/a") == b"\x00bytes"
        assert g.get_file("~/missing") is None
        assert g.upload("~/dir/x.bin", b"\x01\x02abc") == "File Uploaded: 5 bytes"
    assert script.seen[-1] == ("POST", "/setup/upload", {"file_path": b"~/dir/x.bin", "file_data": b"\x01\x02abc"})
    script.routes["/file"] = lambda body: js({"error": "x"}, 500)
    with GuestClient(base_url=url) as g, pytest.raises(GuestHTTPError):
        g.get_file("~/a")


def test_windows_launch_and_observations(server):
    script, url = server
    for path in ("/setup/launch", "/setup/open_file", "/setup/activate_window", "/setup/close_window"):
        script.routes[path] = lambda body: (200, "text/html", b"ok")
    script.routes["/screenshot"] = lambda body: (200, "image/png", PNG)
    script.routes["/accessibility"] = lambda body: js({"AT": "<desktop-frame/>"})
    script.routes["/terminal"] = lambda body: js({"output": None, "status": "success"})
    with GuestClient(base_url=url) as g:
        assert g.launch(["libreoffice", "--writer"]) == "ok"
        g.open_file("~/x.odt")
        g.activate_window("Writer", strict=True)
        g.close_window("Tip", by_class=True)
        assert g.screenshot() == PNG
        assert g.accessibility() == "<desktop-frame/>"
        assert g.terminal() is None
    bodies = [s[2] for s in script.seen[:4]]
    assert bodies == [{"command": ["libreoffice", "--writer"], "shell": False}, {"path": "~/x.odt"},
                      {"window_name": "Writer", "strict": True, "by_class": False},
                      {"window_name": "Tip", "strict": False, "by_class": True}]


def test_connection_refused_is_retried_a_bounded_number_of_times():
    port = free_port()
    g = GuestClient("127.0.0.1", port, connect_retries=2, retry_interval=0.05)
    t0 = time.monotonic()
    with pytest.raises(GuestUnavailable) as info:
        g.execute("x")
    assert time.monotonic() - t0 < 5
    assert isinstance(info.value, Unavailable) and info.value.reason == "GUEST_UNREACHABLE"
    assert "3 attempts" in str(info.value)


def test_a_delivered_request_is_never_sent_twice(server):
    script, url = server
    script.routes["/execute"] = lambda body: "drop"
    with GuestClient(base_url=url, connect_retries=3, retry_interval=0.01) as g:
        with pytest.raises(GuestError) as info:
            g.execute("touch ~/once")
    assert not isinstance(info.value, GuestUnavailable)
    assert len(script.seen) == 1


def test_read_timeout(server):
    script, url = server
    script.routes["/execute"] = lambda body: "hang"
    with GuestClient(base_url=url, timeout=0.3, connect_retries=3) as g:
        with pytest.raises(GuestTimeout):
            g.execute("sleep 100")
    assert len(script.seen) == 1


def test_proxies_from_the_environment_are_ignored(server, monkeypatch):
    script, url = server
    script.routes["/terminal"] = lambda body: js({"output": "t", "status": "success"})
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    with GuestClient(base_url=url) as g:
        assert g.terminal() == "t"


def test_wait_ready(server):
    script, url = server
    script.routes["/terminal"] = lambda body: js({"status": "error"}, 500)
    with GuestClient(base_url=url) as g:
        g.wait_ready(timeout=2)  # any HTTP answer counts, as in OSWorld's probe
    g = GuestClient("127.0.0.1", free_port())
    with pytest.raises(GuestUnavailable, match="did not answer within"):
        g.wait_ready(timeout=0.3, interval=0.1)
