"""Helpers of the guest server tests (tests/guest): a real Xvfb + openbox on a free display, and servers.

Everything started here carries ``DRUMS_GUEST_TEST_TAG=<uuid>`` in its environment, and so does
everything those processes start (xterms, LibreOffice, ffmpeg, commands). Teardown kills by that
tag, so nothing outlives the tests even when a launched application detached itself.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

import requests

from . import REPO
from .envtag import kill_env_tagged
from .wait import WaitTimeout, wait_until

TAG_VAR = "DRUMS_GUEST_TEST_TAG"
TAG = uuid.uuid4().hex
SCREEN = (1920, 1080)


def _server_python() -> str:
    """An interpreter with the guest's dependencies (the venv the sessions use, if present)."""
    if os.environ.get("DRUMS_GUEST_PYTHON"):
        return os.environ["DRUMS_GUEST_PYTHON"]
    probe = "import flask, Xlib, PIL, numpy, importlib.util as u; assert u.find_spec('pyautogui')"
    for cand in (sys.executable, "/opt/drums/venv/bin/python"):
        if cand and os.path.exists(cand) and subprocess.run(
                [cand, "-c", probe], capture_output=True).returncode == 0:
            return cand
    pytest.fail("no interpreter with flask, python-xlib, Pillow, numpy and pyautogui")


def kill_tagged(tag: str = TAG, timeout: float = 5.0) -> list[int]:
    """SIGTERM then SIGKILL every process carrying the tag; returns the survivors (should be [])."""
    return kill_env_tagged(TAG_VAR, tag, timeout)


def tagged_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRUMS_GUEST_")}
    env[TAG_VAR] = TAG
    env.pop("PYTHONPATH", None)
    env.update(extra)
    return env


class XServer:
    """Xvfb + openbox on the first free display in 91..99, then 60..90."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []
        self.number: int | None = None
        self.logdir = tempfile.mkdtemp(prefix="drums-guest-x-")

    @property
    def display(self) -> str:
        return f":{self.number}"

    def start(self) -> None:
        if not shutil.which("Xvfb") or not shutil.which("openbox"):
            pytest.fail("Xvfb and openbox are needed")
        for n in list(range(91, 100)) + list(range(60, 91)):
            if os.path.exists(f"/tmp/.X{n}-lock") or os.path.exists(f"/tmp/.X11-unix/X{n}"):
                continue
            log = open(os.path.join(self.logdir, f"xvfb{n}.log"), "wb")
            p = subprocess.Popen(["Xvfb", f":{n}", "-screen", "0", f"{SCREEN[0]}x{SCREEN[1]}x24",
                                  "-nolisten", "tcp", "-noreset"],
                                 stdout=log, stderr=log, env=tagged_env(), start_new_session=True)
            with contextlib.suppress(WaitTimeout):  # judged just below: the next display is tried
                wait_until(lambda p=p, n=n: p.poll() is not None or os.path.exists(f"/tmp/.X11-unix/X{n}"), 10,
                           f"Xvfb on :{n}")
            if p.poll() is None and os.path.exists(f"/tmp/.X11-unix/X{n}"):
                self.number = n
                self.procs.append(p)
                break
            p.kill()
            p.wait()
        else:
            pytest.fail("no free X display number")
        env = tagged_env(DISPLAY=self.display)
        log = open(os.path.join(self.logdir, "openbox.log"), "wb")
        self.procs.append(subprocess.Popen(["openbox"], stdout=log, stderr=log, env=env,
                                           start_new_session=True))
        self._wait_wm()

    def _wait_wm(self) -> None:
        from Xlib import X
        from Xlib import display as xdisplay

        d = xdisplay.Display(self.display)
        try:
            root = d.screen().root
            atom = d.intern_atom("_NET_SUPPORTING_WM_CHECK")

            def wm_check() -> bool:
                p = root.get_full_property(atom, X.AnyPropertyType)
                return p is not None and len(p.value) > 0

            try:
                wait_until(wm_check, 15, "openbox's _NET_SUPPORTING_WM_CHECK")
            except WaitTimeout as exc:
                raise RuntimeError(f"openbox did not start: {exc}") from None
            # openbox sets the check early and offers no later sign that its start-up is done
            time.sleep(0.3)
        finally:
            d.close()

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        self.procs.clear()
        shutil.rmtree(self.logdir, ignore_errors=True)
        if getattr(self, "number", None) is not None:  # a killed Xvfb leaves its socket and lock
            for path in (f"/tmp/.X11-unix/X{self.number}", f"/tmp/.X{self.number}-lock"):
                if os.path.exists(path):
                    os.unlink(path)


class GuestServer:
    """One guest server subprocess on 127.0.0.1 with a private HOME."""

    def __init__(self, display: str, *, args: tuple[str, ...] = (), env: dict | None = None,
                 desktop_dir: bool = True) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="drums-guest-test-"))
        self.home = self.tmp / "home"
        self.home.mkdir()
        if desktop_dir:
            (self.home / "Desktop").mkdir()
        self.port_file = self.tmp / "port"
        self.log_path = self.tmp / "server.log"
        self.display = display
        self.args = args
        self.env = env or {}
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def start(self) -> GuestServer:
        env = tagged_env(DISPLAY=self.display, HOME=str(self.home), PYTHONPATH=str(REPO))
        env.update(self.env)
        py = _server_python()
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [py, "-m", "drums_osworld.guest", "--host", "127.0.0.1", "--port", "0",
             "--port-file", str(self.port_file), "--workdir", str(self.tmp / "work"), *self.args],
            stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=str(self.tmp),
            start_new_session=True)
        def healthy() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"guest server exited: {self.log()}")
            if not self.port_file.exists():
                return False
            self.url = f"http://127.0.0.1:{int(self.port_file.read_text())}"
            return requests.get(self.url + "/drums/health", timeout=2).ok

        try:
            wait_until(healthy, 30, "the guest server's /drums/health", ignore=(requests.RequestException,))
        except WaitTimeout as exc:
            raise RuntimeError(f"guest server did not come up ({exc}): {self.log()}") from None
        return self

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-5000:]
        except OSError:
            return ""

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if hasattr(self, "_log"):
            self._log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    # -- small client helpers ------------------------------------------------------------------
    def get(self, path: str, **kw) -> requests.Response:
        kw.setdefault("timeout", 60)
        return requests.get(self.url + path, **kw)

    def post(self, path: str, **kw) -> requests.Response:
        kw.setdefault("timeout", 60)
        return requests.post(self.url + path, **kw)

    def execute(self, command, shell: bool = False, **extra) -> requests.Response:
        return self.post("/execute", json={"command": command, "shell": shell, **extra},
                         timeout=180)

    def pyautogui(self, code: str) -> dict:
        r = self.execute(["python", "-c", "import pyautogui; import time; "
                          "pyautogui.FAILSAFE = False; " + code])
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["returncode"] == 0, body
        return body

    def windows(self) -> list[dict]:
        """Frames of the X11 accessibility tree: [{name, class, active, focused, x, y, w, h}]."""
        import xml.etree.ElementTree as ET

        st = "{https://accessibility.ubuntu.example.org/ns/state}"
        at = "{https://accessibility.ubuntu.example.org/ns/attributes}"
        cp = "{https://accessibility.ubuntu.example.org/ns/component}"
        root = ET.fromstring(self.get("/accessibility").json()["AT"])
        out = []
        for el in root.iter():
            if el.tag in ("frame", "dialog"):
                out.append({"name": el.get("name"), "class": el.get(at + "class"),
                            "active": el.get(st + "active") == "true",
                            "focused": el.get(st + "focused") == "true",
                            "coord": el.get(cp + "screencoord"), "size": el.get(cp + "size")})
        return out

    def wait_window(self, title: str, timeout: float = 20, present: bool = True) -> dict | None:
        def seen():
            found = [w for w in self.windows() if title in (w["name"] or "")]
            return found[0] if present and found else not present and not found

        try:
            got = wait_until(seen, timeout, f"window {title!r} to {'appear' if present else 'go'}", every=0.1)
        except WaitTimeout as exc:
            raise AssertionError(f"{exc}; windows: {self.windows()}") from None
        return got if present else None
