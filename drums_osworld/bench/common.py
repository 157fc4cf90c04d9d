"""What every suite shares: its own daemon instance, agent-ready, the Writer desktop, statistics.

A suite runs against a daemon instance of its own (``bench`` by default: its own state tmpfs,
socket, slots 300..363 and nftables table), started fresh and stopped, swept and unmounted at the
end; :func:`drums_core.host.hoststate.instance_leaks` then looks for anything of it left on the host.

*Agent-ready* is what an agent needs before its first action: a mapped window whose title holds
``LibreOffice Writer`` and a screenshot that differs from blank (the top-left pixel's colour) in
more than 10% of its pixels. The check talks to the session's X server directly, as the daemon's
own readiness check does, with two round trips for the window and one full-screen grab.
"""
from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from drums_core.client import Client
from drums_core.config import Instance
from drums_core.errors import DrumsError
from drums_core.host.hoststate import instance_leaks
from drums_osworld.tasks import tasks_dir

REPO = Path(__file__).resolve().parents[2]
TASKS_DIR = tasks_dir()  # the source checkout's tasks/, or the installed share/drums/tasks
WRITER_TASK = TASKS_DIR / "libreoffice_writer" / "drums-writer-type-and-save.json"
OS_TASK = TASKS_DIR / "os" / "e0df059f-28a6-4169-924f-b9623e7184cc.json"
WRITER_TITLE = "LibreOffice Writer"
READY_FRACTION = 0.10
DEFAULT_OUT = Path("/var/tmp/drums-bench")
BENCH_NAME = "bench"
BENCH_SLOT_BASE = 300
SLOT_SPAN = 100  # an instance family takes slots base..base+99: main 64, KSM 20, profile 16


def instances(opts) -> dict[str, Instance]:
    """The suite's instances: ``main`` (64 slots), ``ksm`` (+64, 20 slots) and ``profile`` (+84, 16)."""
    from drums_core.config import check_name

    name = check_name(getattr(opts, "instance", None) or BENCH_NAME, "instance")
    base = getattr(opts, "slot_base", None)
    base = BENCH_SLOT_BASE if base is None else int(base)
    return {"main": Instance(name=name, slot_base=base, slot_count=64),
            "ksm": Instance(name=f"{name}-ksm", slot_base=base + 64, slot_count=20),
            "profile": Instance(name=f"{name}-prof", slot_base=base + 84, slot_count=16)}

class BenchError(RuntimeError):
    """A suite could not produce its figures (not a measured failure: those are counted)."""


# ----------------------------------------------------------------------------------- statistics
def pct(values: Iterable[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation, as numpy's default."""
    s = sorted(float(v) for v in values)
    if not s:
        return None
    if len(s) == 1:
        return s[0]
    k = (len(s) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summary(values: Iterable[float], digits: int = 4) -> dict:
    v = [float(x) for x in values]
    if not v:
        return {"n": 0, "p50": None, "p95": None, "mean": None, "min": None, "max": None, "stdev": None}

    def r(x):
        return None if x is None else round(x, digits)

    return {"n": len(v), "p50": r(pct(v, 50)), "p95": r(pct(v, 95)), "mean": r(statistics.fmean(v)),
            "min": r(min(v)), "max": r(max(v)), "stdev": r(statistics.stdev(v)) if len(v) > 1 else 0.0}


def ratio(a: float | None, b: float | None, digits: int = 3) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return round(a / b, digits)


def slope(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of ys over xs."""
    if len(xs) < 2:
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    if den == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den


def rotated(items: list, i: int) -> list:
    """``items`` rotated by ``i``: arms take turns going first, so no arm always runs on a cold cache."""
    k = i % len(items)
    return items[k:] + items[:k]


# ----------------------------------------------------------------------------------- host facts
def loadavg() -> list[float]:
    try:
        return [float(x) for x in open("/proc/loadavg").read().split()[:3]]
    except OSError:
        return []


def other_daemons(own: Iterable[str]) -> list[str]:
    """Instances of drumsd running on this host besides ours (they share the 2 cores: noise)."""
    own = set(own)
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            argv = open(f"/proc/{name}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if b"drums_core.daemon" in argv and b"--instance" in argv:
            inst = argv[argv.index(b"--instance") + 1].decode(errors="replace")
            if inst not in own:
                found.append(inst)
    return sorted(set(found))


def host_facts(instances: Iterable[str] = ()) -> dict:
    mem = {}
    try:
        for line in open("/proc/meminfo"):
            k, v = line.split(":", 1)
            if k in ("MemTotal", "MemAvailable"):
                mem[k] = int(v.split()[0]) // 1024
    except OSError:
        pass
    from drums_core.session.criu import version as criu_version

    return {"kernel": platform.release(), "cpus": os.cpu_count(), "mem_mib": mem, "loadavg": loadavg(),
            "criu": criu_version(), "python": platform.python_version(),
            "other_drums_daemons": other_daemons(instances),
            "run_tmpfs": _fs_type("/run") == "tmpfs", "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def _fs_type(path: str) -> str:
    best, kind = "", ""
    with open("/proc/self/mounts") as f:
        for line in f:
            parts = line.split()
            mp = parts[1]
            if (path == mp or path.startswith(mp.rstrip("/") + "/")) and len(mp) >= len(best):
                best, kind = mp, parts[2]
    return kind


# ----------------------------------------------------------------------------------- daemon instances
def leaks_total(leaks: dict) -> int:
    return sum(len(v) for v in leaks.values())


LOG_DIR: Path | None = None  # ``drums bench`` sets it to ``<out>/logs``


def retire_daemon_log(instance: Instance) -> str | None:
    """Take the stopped daemon's log out of ``/run/drums``: moved into :data:`LOG_DIR` (``drums
    bench`` keeps it next to its results), or removed when the suite runs without one (a test).
    Returns where it went."""
    log = instance.log_file
    if not log.exists():
        return None
    if LOG_DIR is None:
        log.unlink(missing_ok=True)
        return None
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    dest = LOG_DIR / log.name
    with open(dest, "ab") as out, open(log, "rb") as src:
        shutil.copyfileobj(src, out)
    log.unlink()
    return str(dest)


@dataclass
class BenchInstance:
    """A daemon instance a suite owns from start to finish.

    ``ksm=True`` starts the daemon with ``prctl(PR_SET_MEMORY_MERGE, 1)`` applied to itself first:
    the flag is inherited over fork and exec, so every session it launches and every process CRIU
    restores (forked from its ``criu swrk`` child) is KSM-mergeable.
    """

    instance: Instance
    liveness_delay: float = 3.0
    ksm: bool = False
    client: Client = field(init=False)
    daemon_pid: int | None = field(default=None, init=False)
    stopped: bool = field(default=False, init=False)

    def start(self) -> "BenchInstance":
        if os.geteuid() != 0:
            raise BenchError("drums bench needs root (real namespaces, mounts, CRIU)")
        self._stop_leftover()
        env = {"DRUMS_LIVENESS_DELAY": str(self.liveness_delay)}
        if self.ksm:
            env["DRUMS_KSM"] = "1"  # the daemon applies prctl(PR_SET_MEMORY_MERGE, 1) to itself first
        self.client = Client(self.instance, daemon_env=env)
        self.daemon_pid = self.client.ping()["pid"]
        return self

    def _stop_leftover(self) -> None:
        """A previous bench run of this instance that died: stop its daemon and sweep (ours alone)."""
        probe = Client(self.instance, autostart=False)
        try:
            probe.ping()
        except DrumsError:
            pass
        else:
            probe.shutdown(destroy_sessions=True)
        self._sweep_and_unmount()

    def _sweep_and_unmount(self) -> dict:
        from drums_core.sweep import sweep_instance

        return sweep_instance(self.instance)["sweep"]

    def daemon_stats(self) -> dict:
        """The daemon's open fds, threads and RSS (leaks in the daemon itself show here)."""
        pid = self.daemon_pid
        out: dict[str, Any] = {"pid": pid}
        if pid is None:
            return out
        try:
            out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
            for line in open(f"/proc/{pid}/status"):
                if line.startswith(("VmRSS:", "Threads:")):
                    k, v = line.split(":", 1)
                    out[k.lower()] = int(v.split()[0])
        except OSError:
            pass
        return out

    def stop(self) -> dict:
        """Shut the daemon down destroying its sessions, sweep, unmount; then report any leak."""
        if self.stopped:
            return {}
        self.stopped = True
        with contextlib.suppress(DrumsError):
            Client(self.instance, autostart=False).shutdown(destroy_sessions=True)
        sweep_report = self._sweep_and_unmount()
        leaks = instance_leaks(self.instance)
        return {"sweep": sweep_report, "leaks": leaks, "leaked": leaks_total(leaks),
                "daemon_log": retire_daemon_log(self.instance)}

    def __enter__(self) -> "BenchInstance":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ----------------------------------------------------------------------------------- agent-ready
def _title(d, win, net_wm_name, utf8) -> str:
    from Xlib import error as xerror

    try:
        p = win.get_full_property(net_wm_name, utf8)
        if p and p.value:
            return p.value.decode("utf-8", "replace") if isinstance(p.value, bytes) else str(p.value)
        name = win.get_wm_name()
        return name.decode("latin-1") if isinstance(name, bytes) else (name or "")
    except xerror.XError:
        return ""


def route(session: dict) -> int:
    """Let this process reach a session's X server (through the session root, as the daemon does:
    :func:`drums_core.session.display.register_session`); returns its display number."""
    from drums_core.session import display

    display.register_session(int(session["display"]), int(session["init_pid"]))
    return int(session["display"])


def ready_state(display_number: int, title: str = WRITER_TITLE) -> tuple[str | None, float | None]:
    """(matching mapped window title or None, share of non-blank pixels or None) of one display."""
    import numpy as np
    from Xlib import X, display as xdisplay, error as xerror

    d = xdisplay.Display(f":{display_number}")
    try:
        screen = d.screen()
        root = screen.root
        net_wm_name, utf8 = d.intern_atom("_NET_WM_NAME"), d.intern_atom("UTF8_STRING")
        prop = root.get_full_property(d.intern_atom("_NET_CLIENT_LIST"), X.AnyPropertyType)
        ids = list(prop.value) if prop is not None else []
        if not ids:  # no window manager list: fall back to the top-level windows
            ids = [w.id for w in root.query_tree().children]
        match = None
        for wid in ids:
            win = d.create_resource_object("window", wid)
            t = _title(d, win, net_wm_name, utf8)
            if title in t:
                try:
                    if win.get_attributes().map_state == X.IsViewable:
                        match = t
                        break
                except xerror.XError:
                    continue
        if match is None:
            return None, None
        raw = root.get_image(0, 0, screen.width_in_pixels, screen.height_in_pixels, X.ZPixmap, 0xFFFFFFFF).data
        px = np.frombuffer(raw, dtype=np.uint32) & 0x00FFFFFF
        return match, float(np.count_nonzero(px != px[0])) / px.size
    finally:
        d.close()


def wait_agent_ready(display_number: int, t0: float, timeout: float = 120.0, title: str = WRITER_TITLE,
                     min_fraction: float = READY_FRACTION, alive: Callable[[], bool] | None = None) -> dict:
    """Poll until agent-ready; returns ``{"seconds": since t0, "title", "nonblank", "checks"}``."""
    deadline = time.monotonic() + timeout
    checks = 0
    last = "no check yet"
    while True:
        checks += 1
        try:
            t, frac = ready_state(display_number, title)
            if t is not None and frac is not None and frac > min_fraction:
                return {"seconds": time.monotonic() - t0, "title": t, "nonblank": round(frac, 4), "checks": checks}
            last = f"title={t!r} nonblank={frac}"
        except Exception as exc:  # noqa: BLE001 - X not up yet, a window vanished mid-query: poll again
            last = f"{type(exc).__name__}: {exc}"
        if time.monotonic() > deadline:
            raise BenchError(f"display :{display_number} not agent-ready after {timeout}s: {last}")
        if alive is not None and not alive():
            raise BenchError(f"session of display :{display_number} died before agent-ready: {last}")
        time.sleep(0.01)


# ----------------------------------------------------------------------------------- the Writer desktop
def boot_writer(client: Client, t0: float | None = None, launch_only: bool = False) -> dict:
    """A cold desktop + the Writer task's setup, to agent-ready. Returns timings and the session."""
    from drums_osworld.desktop import Desktop
    from drums_osworld.evaluation import run_task_setup

    t0 = time.monotonic() if t0 is None else t0
    desk = Desktop.boot(client)
    t_boot = time.monotonic() - t0
    try:
        if launch_only:
            desk.guest.launch(["libreoffice", "--writer"])
        else:
            run_task_setup(WRITER_TASK, desk.guest, strict=True)
        t_setup = time.monotonic() - t0
        ready = wait_agent_ready(route(desk.session), t0)
    except BaseException:
        with contextlib.suppress(DrumsError):
            desk.close()
        raise
    return {"desktop": desk, "session": desk.session, "boot": t_boot, "setup": t_setup,
            "ready": ready["seconds"], "nonblank": ready["nonblank"], "title": ready["title"],
            "session_timings": desk.session.get("timings", {})}


def writer_checkpoint(client: Client, name: str = "writer-post-setup") -> dict:
    """Boot the Writer task's desktop, run its setup, and checkpoint it (the session is consumed)."""
    res = boot_writer(client)
    desk = res["desktop"]
    time.sleep(0.5)  # let LibreOffice settle after the setup's last step
    snap = desk.checkpoint(name=name, leave_running=False)
    return {**snap.to_dict(), "_boot": {k: res[k] for k in ("boot", "setup", "ready")}}


def restore_ready(client: Client, snapshot: str, count: int = 1, timeout: float = 120.0,
                  daemon_checks: bool = False) -> dict:
    """Restore ``count`` siblings and wait until every one is agent-ready (checked in parallel).

    ``ready`` is when the bench's own check (run after the call) has seen every sibling agent-ready.
    With ``daemon_checks`` the daemon applies the agent-ready test itself (window titled
    ``WRITER_TITLE``, more than ``READY_FRACTION`` of the pixels non-blank, counted exactly) before
    the call returns; ``daemon_ready`` is then the call's wall time, and ``confirmed`` counts the
    siblings the bench found agent-ready on its first look after the call (all of them, or the
    daemon's verdict is not trusted: ``daemon_ready`` is None)."""
    from concurrent.futures import ThreadPoolExecutor

    t0 = time.monotonic()
    extra = {"expect_window": WRITER_TITLE, "min_nonblank": READY_FRACTION} if daemon_checks else {}
    sessions = client.restore(snapshot, count=count, **extra)
    t_call = time.monotonic() - t0
    with ThreadPoolExecutor(max_workers=min(count, 16)) as ex:
        ready = list(ex.map(lambda s: wait_agent_ready(route(s), t0, timeout), sessions))
    confirmed = sum(1 for r in ready if r["checks"] == 1)
    return {"sessions": sessions, "call": t_call, "ready": max(r["seconds"] for r in ready),
            "daemon_ready": t_call if daemon_checks and confirmed == len(ready) else None,
            "confirmed": confirmed,
            "each_ready": [r["seconds"] for r in ready], "nonblank": [r["nonblank"] for r in ready]}


def destroy_all(client: Client, sessions: Iterable[dict]) -> list[str]:
    """Destroy sessions in parallel; returns the errors (a failed destroy is a leak to report)."""
    from concurrent.futures import ThreadPoolExecutor

    errors: list[str] = []

    def one(s):
        for attempt in range(50):
            try:
                client.destroy(s["id"])
                return
            except BlockingIOError:  # the daemon's listen backlog is full (see the report): try again
                time.sleep(0.05 * (attempt + 1))
            except DrumsError as exc:
                errors.append(f"{s['id']}: {exc}")
                return
        errors.append(f"{s['id']}: could not reach the daemon (listen backlog full)")

    sessions = list(sessions)
    if sessions:
        with ThreadPoolExecutor(max_workers=min(len(sessions), 4)) as ex:
            list(ex.map(one, sessions))
    return errors


def snapshot_images_bytes(instance: Instance, snap_id: str) -> int:
    """Size of a snapshot's CRIU images alone (the snapshot's ``size`` adds its frozen layer)."""
    from drums_core.session.rootfs import dir_size

    return dir_size(instance.snapshots_dir / snap_id / "images")


def error_record(exc: BaseException) -> dict:
    rec: dict[str, Any] = {"type": type(exc).__name__, "message": str(exc)[:2000]}
    if isinstance(exc, DrumsError):
        rec["reason"] = exc.reason
        detail = exc.detail
        if isinstance(detail, dict) and "criu_log" in detail:
            rec["criu_log"] = detail["criu_log"]
        elif detail is not None:
            rec["detail"] = json.loads(json.dumps(detail, default=str))
    return rec


def liveness(client: Client, sessions: Iterable[dict], timeout: float = 30.0) -> list[dict]:
    """Wait for each session's liveness verdict; returns the failures (empty when all are alive)."""
    bad = []
    for s in sessions:
        try:
            got = client.wait_live(s["id"], timeout=timeout)
            if got.get("liveness") != "ok":
                bad.append({"session": s["id"], "liveness": got.get("liveness")})
        except DrumsError as exc:
            bad.append({"session": s["id"], **error_record(exc)})
    return bad
