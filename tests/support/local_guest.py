"""Test-only stand-in for a desktop's guest server: runs the requests on this host.

``LocalDesktop`` starts a private Xvfb (on a free display) and openbox; ``LocalGuest`` has the
methods of :class:`drums_osworld.guest.client.GuestClient` and does what the guest server would
(``/execute``: ``shlex.split`` for a non-shell string, ``~/`` expansion, 120 s limit; ``/file``;
``/setup/upload``; ``/setup/launch``; wmctrl for windows), as the current user with ``HOME`` set
to a scratch directory and a ``python`` on ``PATH`` that has pyautogui. So a task's setup,
solution and evaluator can be checked end to end before Drums sessions exist.

Every process started here carries ``DRUMS_LOCAL_GUEST=<token>`` in its environment;
``LocalGuest.kill_all()`` ends exactly those (found by pid through ``/proc/<pid>/environ``).
"""
from __future__ import annotations

import contextlib
import io
import os
import shlex
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import Any

from drums_osworld.guest.client import ExecResult, GuestHTTPError, python_command

from .envtag import kill_env_tagged, pids_with_env
from .wait import WaitTimeout, wait_until

MARK = "DRUMS_LOCAL_GUEST"


OSL_PIPE_PREFIX = "/tmp/OSL_PIPE_"  # LibreOffice's single-instance socket: always in /tmp, whatever TMPDIR says


def _unix_socket_paths(pids: list[int], prefix: str) -> set[str]:
    """The paths under ``prefix`` of the unix sockets that ``pids`` hold open."""
    inodes = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if link.startswith("socket:["):
                        inodes.add(link[8:-1])
    paths = set()
    with contextlib.suppress(OSError), open("/proc/net/unix") as f:
        for line in f.readlines()[1:]:
            parts = line.split()
            if len(parts) >= 8 and parts[6] in inodes and parts[7].startswith(prefix):
                paths.add(parts[7])
    return paths


def kill_token(token: str, timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL, every process whose environment carries ``token``; then remove the
    LibreOffice pipes they listened on (a LibreOffice that is killed leaves its pipe in /tmp)."""
    pipes = _unix_socket_paths(pids_with_env(MARK, token), OSL_PIPE_PREFIX)
    kill_env_tagged(MARK, token, timeout)
    for path in pipes:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def find_pyautogui_python(display: str) -> str:
    """A Python interpreter that can ``import pyautogui`` on ``display``."""
    candidates = [os.environ.get("DRUMS_TEST_PYAUTOGUI_PYTHON"), "/opt/drums/venv/bin/python",
                  shutil.which("python3"), shutil.which("python")]
    home = tempfile.mkdtemp(prefix="drums-pyag-")
    try:
        Path(home, ".Xauthority").touch()
        errors = []
        for cand in [c for c in candidates if c]:
            r = subprocess.run([cand, "-c", "import pyautogui"], capture_output=True, text=True,
                               env={**os.environ, "DISPLAY": display, "HOME": home}, timeout=60)
            if r.returncode == 0:
                return cand
            errors.append(f"{cand}: {(r.stderr or r.stdout).strip().splitlines()[-1:]}")
        raise RuntimeError("no Python with a working pyautogui for the local desktop: " + "; ".join(errors))
    finally:
        shutil.rmtree(home, ignore_errors=True)


class LocalDesktop:
    """A private Xvfb + openbox, for the lifetime of the object (``close()`` ends both)."""

    def __init__(self, width: int = 1920, height: int = 1080, first_display: int = 920) -> None:
        for tool in ("Xvfb", "openbox", "wmctrl"):
            if shutil.which(tool) is None:
                raise RuntimeError(f"the local desktop needs {tool} on PATH")
        self.token = uuid.uuid4().hex
        self.size = (width, height)
        env = {**os.environ, MARK: self.token}
        self._xvfb_log = tempfile.NamedTemporaryFile(prefix="drums-local-xvfb-", suffix=".log")
        for n in range(first_display, first_display + 100):
            if os.path.exists(f"/tmp/.X11-unix/X{n}") or os.path.exists(f"/tmp/.X{n}-lock"):
                continue
            self.display = f":{n}"
            self._xvfb_log.truncate(0)
            self._xvfb = subprocess.Popen(
                ["Xvfb", self.display, "-screen", "0", f"{width}x{height}x24", "-nolisten", "tcp", "-noreset"],
                env=env, stdout=self._xvfb_log, stderr=subprocess.STDOUT, start_new_session=True)
            with contextlib.suppress(WaitTimeout):  # judged just below: the next display is tried
                wait_until(lambda n=n: self._xvfb.poll() is not None or os.path.exists(f"/tmp/.X11-unix/X{n}"), 15,
                           f"Xvfb on {self.display}", every=0.1)
            if self._xvfb.poll() is None and os.path.exists(f"/tmp/.X11-unix/X{n}"):
                break
            self._xvfb.wait()
        else:
            raise RuntimeError("no free X display for the local desktop")
        # the socket exists before the server answers: wait for an X client to be served
        self._wait_served()
        self._wm_log = tempfile.NamedTemporaryFile(prefix="drums-local-openbox-", suffix=".log")
        self._openbox = subprocess.Popen(["openbox"], env={**env, "DISPLAY": self.display},
                                         stdout=self._wm_log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        with contextlib.suppress(WaitTimeout):  # judged just below
            wait_until(lambda: self._wm_running() or self._openbox.poll() is not None, 15, "openbox", every=0.2)
        if not self._wm_running():
            problem = self.problem() or "openbox did not take the display in 15 s"
            self.close()
            raise RuntimeError(f"the local desktop {self.display} has no window manager: {problem}")

    def _wait_served(self, timeout: float = 15.0) -> None:
        from Xlib import display as xdisplay
        from Xlib.error import DisplayError

        def served() -> bool:
            try:
                xdisplay.Display(self.display).close()
                return True
            except DisplayError:
                if self._xvfb.poll() is not None:  # Xvfb exited: no use waiting
                    raise WaitTimeout(f"Xvfb exited ({self._xvfb.returncode})") from None
                raise

        try:
            wait_until(served, timeout, f"an X client to be served on {self.display}", every=0.2,
                       ignore=(DisplayError,))
        except WaitTimeout as exc:
            problem = f"no X client is served on {self.display}: {exc}; {self._logs()}"
            self.close()
            raise RuntimeError(f"the local desktop has no X server: {problem}") from exc

    def _logs(self) -> str:
        out = []
        for name, log in (("Xvfb", self._xvfb_log), ("openbox", getattr(self, "_wm_log", None))):
            if log is not None and not log.closed:
                log.seek(0)
                text = log.read().decode(errors="replace").strip()[-2000:]
                out.append(f"{name} said: {text or '(nothing)'}")
        return "; ".join(out)

    def _wm_running(self) -> bool:
        r = subprocess.run(["wmctrl", "-m"], env={**os.environ, "DISPLAY": self.display},
                           capture_output=True, text=True)
        return r.returncode == 0 and "Openbox" in r.stdout

    def problem(self) -> str | None:
        """Why this desktop cannot be used (Xvfb or openbox gone, no window manager), or None."""
        gone = [f"{name} exited with {proc.returncode}" for name, proc in
                (("Xvfb", self._xvfb), ("openbox", self._openbox)) if proc.poll() is not None]
        if not gone and self._wm_running():
            return None
        return "; ".join(gone or ["wmctrl sees no window manager"]) + f"; {self._logs()}"

    def close(self) -> None:
        for proc in (getattr(self, "_openbox", None), self._xvfb):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        kill_token(self.token)
        for log in (getattr(self, "_wm_log", None), self._xvfb_log):
            if log is not None:
                log.close()
        n = self.display.lstrip(":")  # a killed Xvfb leaves its socket and lock
        for path in (f"/tmp/.X11-unix/X{n}", f"/tmp/.X{n}-lock"):
            if os.path.exists(path):
                os.unlink(path)


class LocalGuest:
    """The guest server's behaviour, run locally in a scratch ``HOME`` on ``desktop``."""

    def __init__(self, desktop: LocalDesktop | None, python: str, home: Path,
                 extra_env: dict[str, str] | None = None) -> None:
        self.desktop = desktop
        self.token = uuid.uuid4().hex
        self.home = Path(home)
        for d in ("Desktop", "Documents", "Downloads"):
            (self.home / d).mkdir(parents=True, exist_ok=True)
        (self.home / ".Xauthority").touch()
        self.bin = self.home / ".drums-local-bin"
        self.bin.mkdir(exist_ok=True)
        wrapper = self.bin / "python"  # a wrapper, not a symlink: a venv is found from argv[0]
        wrapper.write_text(f'#!/bin/sh\nexec {shlex.quote(python)} "$@"\n')
        wrapper.chmod(0o755)
        self.env = {
            "HOME": str(self.home), "USER": os.environ.get("USER", "root"), "LANG": "C.UTF-8",
            "PATH": f"{self.bin}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
            MARK: self.token,
        }
        if desktop is not None:
            self.env["DISPLAY"] = desktop.display
        self.env.update(extra_env or {})
        self.calls: list[tuple[str, Any]] = []

    def _expand(self, path: str) -> str:
        if path == "~" or path.startswith("~/"):
            path = str(self.home) + path[1:]
        for k, v in self.env.items():
            path = path.replace("${" + k + "}", v).replace("$" + k, v)
        return path

    def _argv(self, command: str | list[str], shell: bool) -> str | list[str]:
        if isinstance(command, str) and not shell:
            command = shlex.split(command)
        if isinstance(command, list):
            command = [self._expand(a) if a.startswith("~/") else a for a in command]
        return command

    # -- GuestClient's methods -----------------------------------------------------------------
    def wait_ready(self, timeout: float = 100.0, interval: float = 1.0) -> None:
        self.calls.append(("wait_ready", None))

    def execute(self, command: str | list[str], shell: bool = False, *, setup: bool = False,
                timeout: Any = None) -> ExecResult:
        self.calls.append(("setup/execute" if setup else "execute", command))
        try:
            r = subprocess.run(self._argv(command, shell), shell=shell, capture_output=True, text=True,
                               timeout=120, env=self.env, cwd=self.home)
        except Exception as exc:  # noqa: BLE001 - the server answers 500 for anything
            raise GuestHTTPError(f"execute failed: {exc}", status_code=500,
                                 body=f'{{"status": "error", "message": "{exc}"}}') from exc
        payload = {"status": "success", "output": r.stdout, "error": r.stderr, "returncode": r.returncode}
        return ExecResult.from_json(payload)

    def run_python(self, code: str, **kw: Any) -> ExecResult:
        return self.execute(python_command(code), shell=False, **kw)

    def launch(self, command: str | list[str], shell: bool = False) -> str:
        self.calls.append(("launch", command))
        argv = self._argv(command, shell)
        subprocess.Popen(argv, shell=shell, env=self.env, cwd=self.home, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
        return f"{argv} launched successfully"

    def upload(self, path: str, data: bytes, **kw: Any) -> str:
        self.calls.append(("upload", path))
        target = Path(self._expand(path))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        return f"File Uploaded: {len(data)} bytes"

    def get_file(self, path: str) -> bytes | None:
        self.calls.append(("file", path))
        p = Path(self._expand(path))
        return p.read_bytes() if p.is_file() else None

    def open_file(self, path: str, **kw: Any) -> str:
        raise GuestHTTPError("open_file is not supported by the local adapter", status_code=500, body="")

    def _wmctrl(self, args: list[str]) -> str:
        r = subprocess.run(["wmctrl", *args], env=self.env, capture_output=True, text=True)
        return r.stdout

    def activate_window(self, window_name: str, strict: bool = False, by_class: bool = False) -> str:
        self.calls.append(("activate_window", window_name))
        return self._wmctrl(["-x" if by_class else "-F", "-a", window_name] if (strict or by_class)
                            else ["-a", window_name])

    def close_window(self, window_name: str, strict: bool = False, by_class: bool = False) -> str:
        self.calls.append(("close_window", window_name))
        return self._wmctrl(["-x" if by_class else "-F", "-c", window_name] if (strict or by_class)
                            else ["-c", window_name])

    def screenshot(self) -> bytes:
        from PIL import ImageGrab

        if self.desktop is None:
            raise GuestHTTPError("no display", status_code=500, body="")
        buf = io.BytesIO()
        ImageGrab.grab(xdisplay=self.desktop.display).save(buf, "PNG")
        return buf.getvalue()

    def accessibility(self) -> str | None:
        return None

    def terminal(self) -> str | None:
        return None

    def windows(self) -> str:
        return self._wmctrl(["-l"])

    def kill_all(self) -> None:
        """End every process this guest started (and their children, which inherit the token)."""
        kill_token(self.token)


class LocalGuestServer:
    """An HTTP front for a :class:`LocalGuest` on 127.0.0.1, speaking the guest server's API.

    Every request is recorded in ``requests`` as ``(method, path, body)`` with the body decoded
    (JSON; form fields; for an upload its ``file_path`` and the sha256 of its data), so two clients
    can be compared request by request. Used to run OSWorld's own controllers and Drums' client
    against the same guest behaviour.
    """

    def __init__(self, guest: LocalGuest) -> None:
        import hashlib
        import json
        import threading
        from email import policy as email_policy
        from email.parser import BytesParser
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        from urllib.parse import parse_qs

        self.guest = guest
        self.requests: list[tuple[str, str, Any]] = []
        server_self = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _reply(self, status: int, body: bytes | str | dict, ctype: str | None = None) -> None:
                if isinstance(body, dict):
                    body, ctype = json.dumps(body).encode(), "application/json"
                elif isinstance(body, str):
                    body, ctype = body.encode(), ctype or "text/html; charset=utf-8"
                self.send_response(status)
                self.send_header("Content-Type", ctype or "application/octet-stream")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                server_self.requests.append(("GET", self.path, None))
                if self.path == "/terminal":
                    self._reply(200, {"output": None, "status": "success"})
                elif self.path == "/screenshot":
                    try:
                        self._reply(200, server_self.guest.screenshot(), "image/png")
                    except GuestHTTPError as exc:
                        self._reply(500, {"status": "error", "message": str(exc)})
                else:
                    self._reply(404, {"error": "not found"})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                ctype = self.headers.get("Content-Type", "")
                g = server_self.guest
                if ctype.startswith("application/json"):
                    body: Any = json.loads(raw or b"null")
                elif ctype.startswith("multipart/form-data"):
                    head = f"Content-Type: {ctype}\r\n\r\n".encode()
                    msg = BytesParser(policy=email_policy.default).parsebytes(head + raw)
                    body = {}
                    for part in msg.iter_parts():
                        name = part.get_param("name", header="content-disposition")
                        body[name] = part.get_payload(decode=True)
                else:
                    body = {k: v[0] for k, v in parse_qs(raw.decode()).items()}
                path = self.path
                if path == "/setup/upload":
                    data = body.get("file_data", b"")
                    fp = body.get("file_path", b"").decode()
                    server_self.requests.append(("POST", path, {"file_path": fp,
                                                                "sha256": hashlib.sha256(data).hexdigest()}))
                    self._reply(200, g.upload(fp, data))
                    return
                server_self.requests.append(("POST", path, body))
                try:
                    if path in ("/execute", "/setup/execute"):
                        res = g.execute(body.get("command"), body.get("shell", False), setup=path.startswith("/setup"))
                        self._reply(200, res.raw)
                    elif path == "/setup/launch":
                        self._reply(200, g.launch(body.get("command"), body.get("shell", False)))
                    elif path == "/file":
                        data = g.get_file(body.get("file_path", ""))
                        if data is None:
                            self._reply(404, {"error": "File not found"})
                        else:
                            self._reply(200, data)
                    elif path in ("/setup/activate_window", "/setup/close_window", "/setup/open_file"):
                        self._reply(200, "ok")
                    else:
                        self._reply(404, {"error": "not found"})
                except GuestHTTPError as exc:
                    self._reply(exc.status_code, {"status": "error", "message": str(exc)})

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(10)
