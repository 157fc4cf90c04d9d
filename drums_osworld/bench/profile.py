"""``profile``: where a restore's time goes, between the CRIU call and agent-ready.

The suite runs a :class:`~drums_core.session.supervisor.Supervisor` in its own process (instance
``bench-prof``: slots 384..399 by default) with timing wrappers around the engine's functions, so every
phase of ``Supervisor.restore`` is measured where it happens: overlay mount, the CRIU call,
veth creation and configuration, the reseed (hostname through ``nsenter``, the guest's RNG over
HTTP), the X readiness wait (window listing, grab, blank test) and the port wait. Nothing of the
engine is changed; the wrappers are removed afterwards.

Then, side by side on the same restored desktops: the engine's readiness test
(:func:`drums_core.session.display.wait_ready`) against the bench's lean one (:func:`common.ready_state`:
``_NET_CLIENT_LIST`` instead of walking the window tree, the blank test on the raw 32-bit pixels
without a copy): what the engine would gain by switching.

Finally one restore with CRIU logging at level 4: its timestamps split CRIU's own time into
kernel-feature probing (``kerndat``, cached in ``/run/criu.kdat`` only when ``/run`` is a tmpfs),
netns restore (``ip``/``iptables-restore`` helpers), forking and mounts, page restore and the
final resume.
"""
from __future__ import annotations

import functools
import re
import threading
import time
from collections import defaultdict

from . import common, inprocess
from ..progress import progress
from .common import summary

RESTORE_PHASES = [
    ("drums_core.session.supervisor.Supervisor", "_record_session"),
    ("drums_core.session.supervisor.Supervisor", "_prepare_dirs"),
    ("drums_core.session.supervisor.Supervisor", "_mount_root"),
    ("drums_core.session.netns", "wait_link_gone"),
    ("drums_core.session.criu", "restore"),
    ("drums_core.session.netns", "create_veth"),
    ("drums_core.session.netns", "configure_host_side"),
    ("drums_core.session.netns", "configure_guest_side"),
    ("drums_core.session.supervisor.Supervisor", "_reseed"),
    ("drums_core.session.rootfs", "write_session_files"),
    ("subprocess", "run"),
    ("requests", "post"),
    ("drums_core.session.supervisor.Supervisor", "_x11_link"),
    ("drums_core.session.display", "wait_ready"),
    ("drums_core.session.display", "connect"),
    ("drums_core.session.display", "windows"),
    ("drums_core.session.display", "grab"),
    ("drums_core.session.display", "nonblank_fraction"),
    ("drums_core.session.supervisor.Supervisor", "_wait_port"),
    ("drums_core.session.supervisor.Supervisor", "_set_state"),
]

CRIU_MILESTONES = [
    ("start", r"CRIU run id"),
    ("kerndat done", r"Reading image tree"),
    ("netns restored", r"mnt-v2: Mounting|Create plain mountpoint"),
    ("first task restored", r": Restored$"),
    ("last task restored", r": Restored$"),
    ("end", r"."),
]


class _Wrapped:
    """Timing wrappers around module or class attributes; undone on exit."""

    def __init__(self) -> None:
        self.acc: dict[str, list[float]] = defaultdict(list)
        self._undo: list[tuple[object, str, object]] = []
        self._lock = threading.Lock()

    def wrap(self, owner, name: str, label: str) -> None:
        orig = getattr(owner, name)

        @functools.wraps(orig)
        def timed(*a, **k):
            t = time.perf_counter()
            try:
                return orig(*a, **k)
            finally:
                with self._lock:
                    self.acc[label].append(time.perf_counter() - t)

        setattr(owner, name, timed)
        self._undo.append((owner, name, orig))

    def undo(self) -> None:
        for owner, name, orig in reversed(self._undo):
            setattr(owner, name, orig)
        self._undo.clear()


def _resolve(path: str):
    import importlib

    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for p in parts[i:]:
            obj = getattr(obj, p)
        return obj
    raise ImportError(path)


def criu_timeline(log: list[str]) -> dict:
    """Milestones (ms since CRIU started) from a level-4 CRIU log."""
    ts = []
    for line in log:
        m = re.match(r"\((\d+\.\d+)\)\s?(.*)", line)
        if m:
            ts.append((float(m.group(1)) * 1e3, m.group(2)))
    if not ts:
        return {}
    out: dict[str, float] = {}
    restored = [t for t, msg in ts if re.search(r"\d+: Restored$", msg)]
    for t, msg in ts:
        if "kerndat done" not in out and "Reading image tree" in msg:
            out["kerndat done (image tree read starts)"] = round(t, 1)
        if "netns done" not in out and "mnt-v2:" in msg:
            out["netns done (mounts start)"] = round(t, 1)
        if "first page read" not in out and "Opened local page read" in msg:
            out["first page read"] = round(t, 1)
    if restored:
        out["first task restored"] = round(min(restored), 1)
        out["last task restored"] = round(max(restored), 1)
    out["end"] = round(ts[-1][0], 1)
    helpers = [msg for _, msg in ts if "Running ip" in msg or "tables-restore" in msg or "-restore -V" in msg]
    out["helper commands"] = len(helpers)
    out["kdat cache loaded"] = any("Loaded kdat cache" in msg for _, msg in ts)
    return out


def _stamped(log: list[str]) -> list[tuple[float, str]]:
    out = []
    for line in log:
        m = re.match(r"\((\d+\.\d+)\)\s?(.*)", line)
        if m:
            out.append((float(m.group(1)) * 1e3, m.group(2)))
    return out


def dump_timeline(log: list[str]) -> dict:
    """Split a level-4 CRIU dump log: fixed work before the first task, each task's fixed part (seize,
    parasite, files, mm) and its pages, namespaces and images, in ms. ``floor without pages`` is the
    dump's time minus every task's page-writing time: what even a dump that wrote no memory would cost."""
    ts = _stamped(log)
    if not ts:
        return {}
    tasks: list[dict] = []
    ns_start = None
    for t, msg in ts:
        m = re.match(r"Dumping task \(pid: (\d+) comm: (.*)\)", msg)
        if m:
            if tasks:
                tasks[-1]["end"] = t
            tasks.append({"comm": m.group(2), "start": t, "pages": None})
        elif tasks and msg.startswith("Dumping pages (type") and tasks[-1]["pages"] is None:
            tasks[-1]["pages"] = t
        elif tasks and ns_start is None and ("Dumping mount namespaces" in msg or "mnt: Dumping mountpoints" in msg):
            ns_start = t
    end = ts[-1][0]
    if not tasks:
        return {"end": round(end, 1)}
    tasks[-1].setdefault("end", ns_start or end)
    per_task = [{"comm": x["comm"], "fixed": round((x["pages"] or x["end"]) - x["start"], 1),
                 "pages and after": round(x["end"] - (x["pages"] or x["end"]), 1)} for x in tasks]
    pages_total = sum(x["pages and after"] for x in per_task)
    return {"before first task": round(tasks[0]["start"], 1), "tasks": len(per_task),
            "tasks fixed total": round(sum(x["fixed"] for x in per_task), 1),
            "tasks pages total": round(pages_total, 1),
            "after last task (namespaces, images)": round(end - tasks[-1]["end"], 1), "end": round(end, 1),
            "floor without pages": round(end - pages_total, 1), "per task": per_task}


def _profile_restores(sup, n: int, w: _Wrapped, per_restore: list[dict], ready_cmp: list[dict], bar):
    """``n`` restores of a Writer snapshot with every phase timed, each followed by the two readiness
    tests side by side on the settled desktop; returns the snapshot."""
    from drums_core.session import display as dmod

    snap = inprocess.writer_snapshot(sup, "profile")
    bar.update()
    for path, name in RESTORE_PHASES:
        w.wrap(_resolve(path), name, f"{path.rsplit('.', 1)[-1]}.{name}")
    for _ in range(n):
        w.acc.clear()
        t0 = time.perf_counter()
        [r] = sup.restore(snap.id)
        total = time.perf_counter() - t0
        per_restore.append({"restore_call": round(total, 4), **{k: round(sum(v), 4) for k, v in w.acc.items()},
                            "timings": dict(r.timings)})
        # readiness, side by side on this settled desktop: the engine's test and the lean one
        t1 = time.perf_counter()
        dmod.wait_ready(r.display, snap.windows[0] if snap.windows else None, 30.0,
                        require_window=bool(snap.windows))
        t2 = time.perf_counter()
        common.ready_state(r.display)
        t3 = time.perf_counter()
        ready_cmp.append({"engine_wait_ready": round(t2 - t1, 4), "lean_ready_state": round(t3 - t2, 4)})
        sup.destroy(r.id)
        bar.update()
    w.undo()
    return snap


def run_profile(opts) -> dict:
    from drums_core.session import criu

    n = opts.rounds or (2 if opts.quick else 10)
    inst = common.instances(opts)["profile"]
    host = common.host_facts([inst.name])
    w = _Wrapped()
    per_restore: list[dict] = []
    ready_cmp: list[dict] = []
    timeline: dict = {}
    logs: list[list[str]] = []
    cleanup: dict = {}
    bar = progress(2 + n, "profile", opts.no_progress)
    try:
        with inprocess.supervisor(inst, cleanup) as sup:
            snap = _profile_restores(sup, n, w, per_restore, ready_cmp, bar)
            with inprocess.criu_level4(criu, "restore") as logs:  # CRIU's own timeline of one restore
                [r] = sup.restore(snap.id)
            timeline = criu_timeline(logs[0]) if logs else {}
            sup.destroy(r.id)
            bar.update()
    finally:
        w.undo()
        bar.close()
    phases = sorted({k for row in per_restore for k in row if k not in ("timings",)})
    stats = {k: summary([row.get(k, 0.0) for row in per_restore]) for k in phases}
    order = ["restore_call"] + [f"{p.rsplit('.', 1)[-1]}.{nm}" for p, nm in RESTORE_PHASES]
    table = [{"phase": k, "mean ms": round(stats[k]["mean"] * 1e3, 1), "p50 ms": round(stats[k]["p50"] * 1e3, 1),
              "share of restore": round(stats[k]["mean"] / stats["restore_call"]["mean"], 3)}
             for k in order if k in stats]
    rc = {k: summary([x[k] for x in ready_cmp]) for k in ("engine_wait_ready", "lean_ready_state")}
    table.append({"phase": "readiness test, engine (display.wait_ready) on a ready desktop",
                  "mean ms": round(rc["engine_wait_ready"]["mean"] * 1e3, 1),
                  "p50 ms": round(rc["engine_wait_ready"]["p50"] * 1e3, 1)})
    table.append({"phase": "readiness test, lean (bench ready_state) on the same desktop",
                  "mean ms": round(rc["lean_ready_state"]["mean"] * 1e3, 1),
                  "p50 ms": round(rc["lean_ready_state"]["p50"] * 1e3, 1)})
    return {
        "suite": "profile", "quick": opts.quick, "host": host,
        "params": {"restores": n, "instance": inst.name, "in_process_supervisor": True},
        "per_restore": per_restore, "phase_stats_s": stats, "readiness_side_by_side_s": rc,
        "criu_timeline_ms": timeline, "criu_log_level4": logs[0] if logs else [],
        "cleanup": cleanup,
        "summary": {"restore call p50 ms": round(stats["restore_call"]["p50"] * 1e3, 1),
                    "criu p50 ms": round(stats.get("criu.restore", {"p50": 0})["p50"] * 1e3, 1),
                    "display.wait_ready p50 ms": round(stats.get("display.wait_ready", {"p50": 0})["p50"] * 1e3, 1),
                    "lean readiness test p50 ms": round(rc["lean_ready_state"]["p50"] * 1e3, 1),
                    "CRIU kdat cache loaded": timeline.get("kdat cache loaded"),
                    "leaked resources after": cleanup.get("leaked")},
        "table": table,
        "plot": {"title": "Restore phases (in-process supervisor)", "ylabel": "milliseconds",
                 "series": {k: [row.get(k, 0.0) * 1e3 for row in per_restore] for k in order if k in stats
                            and stats[k]["mean"] > 0.002}, "log": True},
    }
