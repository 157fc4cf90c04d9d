"""pid 1 of a session: starts the desktop's programs, reaps every child, never exits on its own.

Started by :mod:`drums_core.session.launch` inside the new namespaces with ``--tag drums:<run>`` in its argv
(the ledger's ownership mark). It reads the session spec from ``/etc/drums/session.json`` in the
session root, brings up loopback, writes the user's X authority, then starts, in order: Xvfb on
``:0``, the window manager, the system D-Bus (when the spec asks), the session D-Bus (where dbus is
installed) with the AT-SPI bus (when the spec asks for accessibility), the desktop session (when the
spec has one instead of a window manager: e.g. ``gnome-session``, which starts GNOME Shell), and the
spec's programs, each with the desktop's and the spec's ``env`` over the user's environment. The
window manager's (or the desktop's) ``_NET_SUPPORTING_WM_CHECK`` is waited for before anything
that maps windows starts. CRIU dumps and restores this
process with the rest of the tree; after a restore it simply goes on reaping.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import time

SPEC_PATH = "/etc/drums/session.json"
LOG_DIR = "/run/drums"
WM_SETTLE_SECONDS = 0.2
BUS_TIMEOUT = 10.0
DESKTOP_TIMEOUT = 60.0  # a desktop session's window manager up (GNOME Shell: ~0.5 s here, more on a busy host)
AT_SPI_LAUNCHER = "/usr/libexec/at-spi-bus-launcher"
# Xvfb keeps every pixmap in its heap. glibc raises its mmap threshold each time a large block is
# freed, so after a few windows come and go the big pixmaps land in the heap and their pages stay
# (and are checkpointed, and restored in every sibling) after they are freed. A fixed threshold
# keeps blocks of 128 KiB and more in their own mappings, returned to the kernel when freed
# (a restored osworld desktop's Xvfb: 81 MiB anon without, 72 MiB with).
XVFB_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(128 << 10)}
# Xauthority families (X11's Xauth.h): any host, and this host by name.
_FAMILY_WILD, _FAMILY_LOCAL = 0xFFFF, 256
_COOKIE = b"MIT-MAGIC-COOKIE-1"


def _user_env(spec: dict) -> dict:
    uid = spec["uid"]
    return {
        "HOME": spec["home"], "USER": spec["user"], "LOGNAME": spec["user"], "SHELL": "/bin/bash",
        "PATH": spec["path"], "LANG": "C.UTF-8", "DISPLAY": ":0",
        "XDG_RUNTIME_DIR": f"/run/user/{uid}",
        "DBUS_SESSION_BUS_ADDRESS": f"unix:path=/run/user/{uid}/bus",
        "XAUTHORITY": f"{spec['home']}/.Xauthority",
        # toolkits export accessibility only when the session runs the AT-SPI bus
        **({} if spec.get("accessibility") else {"NO_AT_BRIDGE": "1"}),
        **{str(k): str(v) for k, v in ((spec.get("desktop") or {}).get("env") or {}).items()},
        **{str(k): str(v) for k, v in (spec.get("env") or {}).items()},
    }


def _xauth_entry(family: int, address: bytes, cookie: bytes) -> bytes:
    def counted(b: bytes) -> bytes:
        return struct.pack(">H", len(b)) + b
    return struct.pack(">H", family) + counted(address) + counted(b"0") + counted(_COOKIE) + counted(cookie)


def _write_xauthority(spec: dict) -> None:
    """A real cookie for display 0, for any host and for this host's name, so clients (python-xlib
    among them) find X authority details instead of warning on every start. Xvfb itself runs with
    ``-ac``: only the session's own processes can reach its socket, and a restored sibling's new
    hostname must not lock its clients out."""
    cookie = os.urandom(16)
    data = _xauth_entry(_FAMILY_WILD, b"", cookie) + _xauth_entry(_FAMILY_LOCAL, socket.gethostname().encode(), cookie)
    path = f"{spec['home']}/.Xauthority"
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, data)
        os.fchown(fd, spec["uid"], spec["uid"])
    finally:
        os.close(fd)


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


def _xprop(env: dict, *args: str) -> str:
    return subprocess.run(["xprop", *args], env=env, capture_output=True, text=True, check=False,
                          stdin=subprocess.DEVNULL).stdout


def _wait_wm(spec: dict, timeout: float, name: str = "") -> bool:
    """Programs mapped before the window manager owns the screen stay unmanaged: wait for it (and,
    given ``name``, for the check window's ``_NET_WM_NAME`` to be that: mutter advertises "GNOME Shell")."""
    deadline = time.monotonic() + timeout
    env = _user_env(spec)
    while time.monotonic() < deadline:
        out = _xprop(env, "-root", "_NET_SUPPORTING_WM_CHECK")
        if "window id" in out:
            if not name:
                return True
            check = out.split("#")[-1].strip().split()[0]
            if f'"{name}"' in _xprop(env, "-id", check, "_NET_WM_NAME"):
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
    _write_xauthority(spec)
    w, h = spec["screen"]
    desktop = spec.get("desktop") or {}
    extensions = [arg for ext in ["XFIXES", *desktop.get("x_extensions", [])] for arg in ("+extension", ext)]
    _start("xvfb", ["Xvfb", ":0", "-screen", "0", f"{w}x{h}x24", "-nolisten", "tcp", "-ac", "-noreset",
                    *extensions], spec, as_user=False, extra_env=XVFB_MALLOC_ENV)
    _wait_path("/tmp/.X11-unix/X0", 20)
    if spec.get("window_manager") and not desktop:
        _start("wm", [spec["window_manager"]], spec, as_user=True)
        _wait_wm(spec, 20)
        # openbox advertises itself before it handles requests; an Xt client (xterm) that maps in
        # that gap waits out its 5 s wmTimeout (seen in 3 of 10 cold boots; none with this pause)
        time.sleep(WM_SETTLE_SECONDS)
    if spec.get("system_bus") and shutil.which("dbus-daemon"):
        os.makedirs("/run/dbus", exist_ok=True)
        # systemd's tools (timedatectl, hostnamectl, localectl) talk to their D-Bus-activated
        # services only where sd_booted() holds, which is this directory's existence
        os.makedirs("/run/systemd/system", exist_ok=True)
        _start("dbus-system", ["dbus-daemon", "--system", "--nofork", "--nopidfile", "--nosyslog"], spec,
               as_user=False)
        _wait_path("/run/dbus/system_bus_socket", BUS_TIMEOUT)
    if spec.get("dbus") and shutil.which("dbus-daemon"):
        bus = f"/run/user/{spec['uid']}/bus"
        _start("dbus", ["dbus-daemon", "--session", f"--address=unix:path={bus}",
                        "--nofork", "--nopidfile", "--nosyslog"], spec, as_user=True)
        _wait_path(bus, BUS_TIMEOUT)  # programs that ask the bus at start-up (AT-SPI, PulseAudio) need it
        if spec.get("accessibility") and os.path.exists(AT_SPI_LAUNCHER):
            # started now, not on the first application's request: every desktop has its a11y bus
            # (and its registry) before anything is checkpointed, so siblings each restore their own
            _start("at-spi", [AT_SPI_LAUNCHER, "--launch-immediately"], spec, as_user=True)
    if desktop:
        # a session manager with its own window manager (gnome-session: GNOME Shell, the settings
        # daemons), on the buses above; the spec's programs start once its window manager is up
        _start("desktop", list(desktop["argv"]), spec, as_user=True)
        _wait_wm(spec, DESKTOP_TIMEOUT, desktop.get("wm_name", ""))
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
