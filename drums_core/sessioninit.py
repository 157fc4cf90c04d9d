"""pid 1 of a session: starts the desktop's programs, reaps every child, never exits on its own.

Started by :mod:`drums_core.launch` inside the new namespaces with ``--tag drums:<run>`` in its argv
(the ledger's ownership mark). It reads the session spec from ``/etc/drums/session.json`` in the
session root, brings up loopback, then starts, in order: Xvfb on ``:0``, the window manager, the
session D-Bus (where dbus is installed) and the spec's programs. CRIU dumps and restores this
process with the rest of the tree; after a restore it simply goes on reaping.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import time

SPEC_PATH = "/etc/drums/session.json"
LOG_DIR = "/run/drums"
WM_SETTLE_SECONDS = 0.2


def _user_env(spec: dict) -> dict:
    uid = spec["uid"]
    return {
        "HOME": spec["home"], "USER": spec["user"], "LOGNAME": spec["user"], "SHELL": "/bin/bash",
        "PATH": spec["path"], "LANG": "C.UTF-8", "DISPLAY": ":0",
        "XDG_RUNTIME_DIR": f"/run/user/{uid}",
        "DBUS_SESSION_BUS_ADDRESS": f"unix:path=/run/user/{uid}/bus",
        "NO_AT_BRIDGE": "1",
    }


def _start(name: str, argv: list[str], spec: dict, as_user: bool, extra_env: dict | None = None) -> subprocess.Popen:
    os.makedirs(LOG_DIR, exist_ok=True)
    log = open(f"{LOG_DIR}/{name}.log", "ab", buffering=0)
    env = _user_env(spec)
    env.update(extra_env or {})
    kwargs: dict = {}
    if as_user:
        kwargs = {"user": spec["uid"], "group": spec["uid"], "extra_groups": [], "cwd": spec["home"]}
    else:
        kwargs = {"cwd": "/"}
    try:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                                close_fds=True, **kwargs)
    finally:
        log.close()


def _wait_path(path: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path):
            return True
        time.sleep(0.01)
    return False


def _wait_wm(spec: dict, timeout: float) -> bool:
    """Programs mapped before the window manager owns the screen stay unmanaged: wait for it."""
    deadline = time.monotonic() + timeout
    env = _user_env(spec)
    while time.monotonic() < deadline:
        out = subprocess.run(["xprop", "-root", "_NET_SUPPORTING_WM_CHECK"], env=env, capture_output=True,
                             text=True, check=False, stdin=subprocess.DEVNULL)
        if "window id" in out.stdout:
            return True
        time.sleep(0.02)
    return False


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tag", required=True)
    parser.add_argument("--session", required=True)
    parser.add_argument("--ready-fd", type=int, default=-1)
    args = parser.parse_args()
    if args.ready_fd >= 0:
        os.write(args.ready_fd, b"ok")
        os.close(args.ready_fd)
    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGPIPE, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_IGN)
    spec = json.load(open(SPEC_PATH))
    subprocess.run(["ip", "link", "set", "lo", "up"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=False)
    w, h = spec["screen"]
    _start("xvfb", ["Xvfb", ":0", "-screen", "0", f"{w}x{h}x24", "-nolisten", "tcp", "-ac", "-noreset",
                    "+extension", "XFIXES"], spec, as_user=False)
    _wait_path("/tmp/.X11-unix/X0", 20)
    if spec.get("window_manager"):
        _start("wm", [spec["window_manager"]], spec, as_user=True)
        _wait_wm(spec, 20)
        # openbox advertises itself before it handles requests; an Xt client (xterm) that maps in
        # that gap waits out its 5 s wmTimeout (seen in 3 of 10 cold boots; none with this pause)
        time.sleep(WM_SETTLE_SECONDS)
    if spec.get("dbus") and shutil.which("dbus-daemon"):
        _start("dbus", ["dbus-daemon", "--session", f"--address=unix:path=/run/user/{spec['uid']}/bus",
                        "--nofork", "--nopidfile", "--nosyslog"], spec, as_user=True)
    for prog in spec.get("programs", []):
        _start(prog["name"], prog["argv"], spec, as_user=prog.get("user", True), extra_env=prog.get("env"))
    while True:
        try:
            os.wait()
        except ChildProcessError:
            time.sleep(1.0)
        except InterruptedError:
            continue


if __name__ == "__main__":
    main()
