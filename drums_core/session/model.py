"""What a session is: its spec (what the desktop is made of), its record and its states."""
from __future__ import annotations

import enum
import re
import threading
from dataclasses import asdict, dataclass, field

from . import cgroups, netpolicy
from ..config import check_name
from ..errors import InvalidArgument
from ..reasons import Reason
from ..host import procs


class Liveness(enum.StrEnum):
    """Whether a restored session's settled processes outlived the restore (see ``SETTLED_AGE``)."""

    UNCHECKED = "unchecked"
    OK = "ok"
    FAILED = "failed"


class State(str, enum.Enum):
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    CHECKPOINTING = "CHECKPOINTING"
    RESTORING = "RESTORING"
    STOPPING = "STOPPING"
    BROKEN = "BROKEN"


# Processes at least this old (seconds) when a session is checkpointed must still be alive a
# liveness delay after each restore; younger ones may end by themselves.
SETTLED_AGE = 3.0


# A desktop session's fields (``SessionSpec.desktop``): see :class:`SessionSpec`.
DESKTOP_FIELDS = frozenset({"name", "argv", "env", "x_extensions", "wm_name", "ready_nonblank"})
_ENV_NAME = r"[A-Za-z_][A-Za-z0-9_]{0,63}"


def _good_env(env: object, most: int = 64) -> bool:
    return isinstance(env, dict) and len(env) <= most and all(
        isinstance(k, str) and re.fullmatch(_ENV_NAME, k) and isinstance(v, str) and len(v) <= 4096
        and "\0" not in v for k, v in env.items())


def _check_desktop(desktop: object) -> None:
    """``desktop`` is ``{}`` or a desktop session as :class:`SessionSpec` describes it (BAD_SPEC if not)."""
    def bad(why: str) -> InvalidArgument:
        return InvalidArgument(f"bad desktop: {why}", reason=Reason.BAD_SPEC)

    if not isinstance(desktop, dict):
        raise bad("a JSON object")
    if not desktop:
        return
    unknown = set(desktop) - DESKTOP_FIELDS
    if unknown:
        raise bad(f"unknown fields {sorted(unknown)} (known: {sorted(DESKTOP_FIELDS)})")
    name = desktop.get("name")
    if not isinstance(name, str) or not re.fullmatch(r"[a-z][a-z0-9-]{0,31}", name):
        raise bad(f"name {name!r}: lower-case letters, digits and - (e.g. gnome)")
    argv = desktop.get("argv")
    if not isinstance(argv, list) or not argv or len(argv) > 64 or not all(
            isinstance(a, str) and a and len(a) <= 4096 and "\0" not in a for a in argv):
        raise bad("argv: a non-empty list of at most 64 strings")
    if not _good_env(desktop.get("env", {})):
        raise bad("env: at most 64 NAME=value strings (names of letters, digits and _)")
    ext = desktop.get("x_extensions", [])
    if not isinstance(ext, list) or len(ext) > 8 or not all(
            isinstance(e, str) and re.fullmatch(r"[A-Za-z][A-Za-z0-9-]{0,31}", e) for e in ext):
        raise bad("x_extensions: at most 8 X extension names (e.g. GLX)")
    wm_name = desktop.get("wm_name", "")
    if not isinstance(wm_name, str) or len(wm_name) > 64 or "\0" in wm_name:
        raise bad("wm_name: the window manager's name, at most 64 characters")
    drawn = desktop.get("ready_nonblank", 0.0)
    if isinstance(drawn, bool) or not isinstance(drawn, (int, float)) or not 0.0 <= drawn < 1.0:
        raise bad("ready_nonblank: a share of the screen in [0, 1)")


@dataclass
class SessionSpec:
    """What a desktop is made of. ``programs`` are started by the session init after X, the window
    manager or desktop session, and the buses.

    ``window_manager`` is a program the init starts right after Xvfb (``openbox`` by default; ``""``
    for none). ``desktop``, when not empty, is a desktop session started instead, after the system
    bus, the session bus and the AT-SPI bus (a session manager that brings its own window manager,
    such as ``gnome-session``): ``{"name": ..., "argv": [...], "env": {...}, "x_extensions": [...],
    "wm_name": ...}``: its program as the user, ``env`` in the environment of every program of the
    session (under the spec's own ``env``), X extensions Xvfb enables for it (``GLX``), and the name
    its window manager advertises (``_NET_SUPPORTING_WM_CHECK``'s ``_NET_WM_NAME``), which the init
    waits for before it starts ``programs``, and ``ready_nonblank``: a cold boot is ready only once
    more than that share of the screen differs from its top-left pixel (the desktop has drawn its
    wallpaper and panels). A spec with a desktop has no ``window_manager``.
    """

    image: str = "default"
    screen: tuple[int, int] = (1920, 1080)
    window_manager: str = "openbox"
    desktop: dict = field(default_factory=dict)
    dbus: bool = True
    system_bus: bool = False  # a system D-Bus in the session (timedatectl and other system services)
    accessibility: bool = False  # the AT-SPI bus, and toolkits export their accessibility trees to it
    env: dict = field(default_factory=dict)  # over the user's environment, for every program
    programs: list[dict] = field(default_factory=list)
    wait_port: int | None = None
    reseed_path: str | None = None
    expect_window: str | None = None
    ready_timeout: float = 60.0
    tmp_size: str = "1g"
    shm_size: str = "512m"
    run_size: str = "256m"
    writable_size: str = "2g"
    limits: dict = field(default_factory=dict)  # cgroups.Limits fields: memory_max, memory_high, pids_max, cpu_weight
    network: dict = field(default_factory=lambda: {"policy": "none"})  # see drums_core.session.netpolicy

    def network_policy(self) -> netpolicy.NetworkPolicy:
        return netpolicy.NetworkPolicy.from_spec(self.network)

    def cgroup_limits(self) -> cgroups.Limits:
        return cgroups.Limits(**self.limits)

    def sizes(self) -> dict:
        return {"tmp": self.tmp_size, "shm": self.shm_size, "run": self.run_size}

    @classmethod
    def from_dict(cls, data: dict | None) -> "SessionSpec":
        data = dict(data or {})
        known = set(cls.__dataclass_fields__)
        unknown = set(data) - known
        if unknown:
            raise InvalidArgument(f"unknown session spec fields: {sorted(unknown)}", reason=Reason.BAD_SPEC)
        if "screen" in data:
            w, h = data["screen"]
            if not (64 <= int(w) <= 8192 and 64 <= int(h) <= 8192):
                raise InvalidArgument(f"bad screen size {data['screen']}", reason=Reason.BAD_SPEC)
            data["screen"] = (int(w), int(h))
        _check_desktop(data.get("desktop", {}))
        if data.get("desktop") and "window_manager" not in data:
            data["window_manager"] = ""  # the desktop session brings its own
        spec = cls(**data)
        if spec.desktop and spec.window_manager:
            raise InvalidArgument(f"a desktop session ({spec.desktop['name']}) brings "
                                  f"its own window manager: window_manager must be empty, not "
                                  f"{spec.window_manager!r}", reason=Reason.BAD_SPEC)
        check_name(spec.image, "image")
        for size in (spec.tmp_size, spec.shm_size, spec.run_size, spec.writable_size):
            if not isinstance(size, str) or not re.fullmatch(r"[1-9][0-9]{0,6}[kmg]", size):
                raise InvalidArgument(f"bad tmpfs size {size!r}: a number with k, m or g", reason=Reason.BAD_SPEC)
        if not _good_env(spec.env):
            raise InvalidArgument("bad env: at most 64 NAME=value strings (names of letters, digits and _)",
                                  reason=Reason.BAD_SPEC)
        if not isinstance(spec.limits, dict) or set(spec.limits) - set(cgroups.Limits.__dataclass_fields__):
            raise InvalidArgument(f"bad limits {spec.limits!r}: use memory_max, memory_high, pids_max, cpu_weight",
                                  reason=Reason.BAD_SPEC)
        try:
            spec.cgroup_limits()
        except InvalidArgument as exc:
            raise InvalidArgument(exc.message, reason=Reason.BAD_SPEC) from exc
        for prog in spec.programs:
            if not isinstance(prog, dict) or not isinstance(prog.get("argv"), list) or not prog.get("name") \
                    or not prog["argv"] or not all(isinstance(a, str) and a and "\0" not in a for a in prog["argv"]):
                raise InvalidArgument(f"bad program entry {prog!r}: a name and a non-empty argv of strings",
                                      reason=Reason.BAD_SPEC)
            check_name(prog["name"], "program name")
        spec.network = spec.network_policy().to_spec()
        return spec


@dataclass
class Session:
    id: str
    slot: int
    state: State
    spec: SessionSpec
    dir: str
    root: str
    ifname: str
    host_address: str
    address: str
    display: int
    hostname: str
    machine_id: str
    created: float
    init_pid: int = 0
    init_start: int = 0
    snapshot: str | None = None
    layers: list[str] = field(default_factory=list)
    broken: str | None = None
    liveness: Liveness = Liveness.UNCHECKED
    timings: dict = field(default_factory=dict)
    cgroup: cgroups.SessionCgroup | None = field(default=None, repr=False)
    oom_kills: int = 0
    image_hash: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def public(self) -> dict:
        d = {name: getattr(self, name) for name in self.__dataclass_fields__ if name not in ("lock", "cgroup")}
        d["cgroup"] = self.cgroup.name if self.cgroup else None
        d["state"] = self.state.value
        d["liveness"] = Liveness(self.liveness).value
        d["spec"] = asdict(self.spec)
        d["layers"] = list(self.layers)
        d["timings"] = dict(self.timings)
        return d


def init_start_time(init_pid: int) -> int:
    """The start time of an init just launched or restored; ProcessLookupError when it is gone already."""
    start = procs.starttime(init_pid)
    if start is None:
        raise ProcessLookupError(init_pid)
    return start
