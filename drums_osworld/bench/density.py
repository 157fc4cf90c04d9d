"""``density``: how many OSWorld desktops this host holds, and whether one hostile desktop among them hurts the others.

One daemon instance (100 slots), started with ``prctl(PR_SET_MEMORY_MERGE, 1)`` so that every
process it restores is KSM-mergeable (``/sys/kernel/mm/ksm/run`` stays 0, so nothing merges, until
the KSM measurement below).

1. **The desktop.** A cold ``osworld`` desktop opens Chromium (as OSWorld's Chrome tasks start it,
   with socat to 9222), GIMP, VLC and LibreOffice Impress; once every window is mapped it is
   checkpointed (``leave_running=False``). Every desktop after this one is a restore of that
   checkpoint. ``--desktop gnome``: the same applications on GNOME Shell (the heavier desktop,
   whose target is 90% of what memory allows rather than 40 desktops).
2. **Fill.** Siblings are restored ``--batch`` at a time (each its own ``restore(count=1)`` call,
   run concurrently; the daemon returns once the snapshot's window is mapped and more than 10% of
   the screen is non-blank), and each is then checked **alive** (the daemon's liveness verdict:
   every checkpointed process still there) and **answering a screenshot** (the guest's
   ``GET /screenshot``, a PNG with more than 10% non-blank pixels). Filling stops at the first of:
   ``--max`` desktops; memory (``MemAvailable`` minus ``--reserve-mib`` no longer fits one more
   desktop at the measured cost per desktop); a failed restore or check (its error's class,
   reason, message, detail and any kernel counter it names are recorded: the honest end).
3. **What each desktop uses**, over all held desktops: PSS (``/proc/<pid>/smaps_rollup`` of every
   process of the session) with KSM off, then with KSM on (``run=1``, ``pages_to_scan`` 2000 every
   20 ms, two full scans after it is switched on; then unmerged with ``run=2`` and the host's
   settings put back, whatever happens), processes and tasks (threads: what the pids controller and
   ``kernel.pid_max`` count), inotify instances (fds of every process pointing at
   ``anon_inode:inotify``, one instance shared by several fds counted once, by ``kcmp``) and
   their watches (``/proc/<pid>/fdinfo``), ``MemAvailable`` at the start and its drop per desktop.
4. **A hostile neighbour.** Enough desktops are let go for one round's work to fit above the
   reserve. Then rounds, the two arms taking turns going first: ``without`` and ``with hostile``.
   In the hostile arm a restored sibling runs :mod:`drums_osworld.bench.hostile_desktop` as the
   desktop user (inotify instances until refused, tasks until refused, a 20 TiB sparse file, a file
   with 3,000 hard links, a 16 MiB argument area through ``PR_SET_MM_MAP``; held and let go in a
   loop) and the bench checkpoints it (``leave_running``) while it holds; in the arm without it an
   honest restored sibling (the control) is checkpointed the same way at the same point, so the
   arms differ by the attacks alone. In both arms the bench, meanwhile, restores ``--batch`` new
   siblings (timed, checked alive and answering a screenshot), takes a
   screenshot of every held desktop and checkpoints one of them (``leave_running``, the snapshot
   deleted at once). Every failure among the others is counted; the hostile desktop's own outcomes
   are recorded apart. The figure: the others' restore p50 with the hostile desktop over without.

Everything made is destroyed at the end, on an error or an interrupt (SIGINT, SIGTERM) too; KSM's
settings go back. An interrupt in the hostile rounds (the long part) still writes the report, with
the rounds done so far and ``interrupted`` saying when; the command then exits 1. KSM is switched
on only under a host-wide lock shared with the ``memory`` suite
(:func:`drums_osworld.bench.memory.ksm_lock`), and not at all when another user already runs it.
"""
from __future__ import annotations

import contextlib
import ctypes
import io
import json
import math
import os
import re
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from drums_core.config import Instance, check_name
from drums_core.errors import DrumsError

from . import common
from ..desktop import DEFAULT_DESKTOP
from ..progress import progress
from .common import BenchInstance, error_record, pct, ratio
from .memory import KSM, KSM_KEYS, KsmArm, ksm_lock, ksm_read, wait_full_scans

MiB = 1 << 20
IMAGE = "osworld"
CHROME = ["google-chrome", "--remote-debugging-port=1337"]  # as OSWorld's Chrome tasks start it
SOCAT = ["socat", "tcp-listen:9222,fork", "tcp:localhost:1337"]
VLC = "VLC_VERBOSE=-1 vlc --no-audio --no-video-title-show"
# what to launch, and what a mapped window's title or WM class (lower case) holds once it is up
APPS = (("chromium", CHROME, "chromium"), ("gimp", ["gimp"], "gnu image manipulation program"),
        ("vlc", VLC, "vlc media player"), ("impress", ["libreoffice", "--impress"], "libreoffice-impress"))
READY = common.READY_FRACTION
HOSTILE_DIR = "/home/user/.cache/drums-hostile"
HOSTILE_SCRIPT = Path(__file__).with_name("hostile_desktop.py")
DEFAULT_RESERVE_MIB = 3072  # a full host grows: 44 desktops at 1.8 GiB available ended in a global OOM kill (no swap)
DEFAULT_BATCH = 4
FIRST_GUESS_MIB = 600  # the cost of a desktop before one is measured (issue 31: 417 MiB PSS)
SYS_KCMP, KCMP_FILE = 312, 0
FDINFO_LIMIT = 4 * MiB  # a process with thousands of watches has a long fdinfo; more is not read
# names of kernel counters an error may carry (the engine's HOST_BUDGET names its counter)
COUNTER_WORDS = [re.compile(w) for w in (r"max_user_instances|max_user_watches|max_inotify_\w+|max_user_namespaces"
                                          r"|max_mnt_namespaces|max_mqueue\w*|pid_max|pids\.max|RLIMIT_\w+",
                                          r"inotify|mqueue|user namespace")]

_libc = ctypes.CDLL(None, use_errno=True)


# ----------------------------------------------------------------------------------- host facts
def meminfo_mib(key: str = "MemAvailable") -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def _read(path: str, limit: int = 1 << 16) -> str:
    with open(path, "rb") as f:
        return f.read(limit).decode(errors="replace")


def host_kernel_counts() -> dict:
    """The host's per-user kernel limits and what every process on it holds of them now."""
    out: dict = {}
    for key, path in (("inotify_max_user_instances", "/proc/sys/fs/inotify/max_user_instances"),
                      ("inotify_max_user_watches", "/proc/sys/fs/inotify/max_user_watches"),
                      ("pid_max", "/proc/sys/kernel/pid_max"),
                      ("user_max_inotify_instances", "/proc/sys/user/max_inotify_instances"),
                      ("user_max_user_namespaces", "/proc/sys/user/max_user_namespaces")):
        with contextlib.suppress(OSError, ValueError):
            out[key] = int(_read(path).strip())
    instances = tasks = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        with contextlib.suppress(OSError):
            tasks += len(os.listdir(f"/proc/{name}/task"))
            for fd in os.listdir(f"/proc/{name}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{name}/fd/{fd}") == "anon_inode:inotify":
                        instances += 1
    out["inotify_fds_on_host"] = instances
    out["tasks_on_host"] = tasks
    return out


def counter_named(err: dict) -> str | None:
    """The kernel counter an error record names (its detail first, then its message), or None."""
    detail = err.get("detail")
    if isinstance(detail, dict):
        for k in ("counter", "budget", "limit_name"):
            if detail.get(k):
                return str(detail[k])
    texts = (json.dumps(detail, default=str) if detail else "", err.get("message") or "",
             json.dumps(err.get("criu_log") or ""))
    for words in COUNTER_WORDS:  # the exact name of a counter first, then a word for one
        for text in texts:
            if m := words.search(text):
                return m.group(0)
    return None


# ----------------------------------------------------------------------------------- one desktop's use
def _kcmp_same(pid1: int, fd1: int, pid2: int, fd2: int) -> bool:
    return _libc.syscall(SYS_KCMP, pid1, pid2, KCMP_FILE, fd1, fd2) == 0


def desktop_usage(client, session: dict) -> dict:
    """PSS, processes, tasks, inotify instances and watches of one session (host-side, from /proc)."""
    tot = {"pss_kib": 0, "pss_anon_kib": 0, "pss_file_kib": 0, "processes": 0, "tasks": 0,
           "inotify_instances": 0, "inotify_watches": 0}
    inotify: list[tuple[int, int, int]] = []  # (pid, fd, watches)
    for p in client.processes(session["id"]):
        pid = p["pid"]
        with contextlib.suppress(OSError):
            for line in _read(f"/proc/{pid}/smaps_rollup").splitlines():
                parts = line.split()
                if len(parts) >= 2 and parts[1].isdigit():
                    key = {"Pss:": "pss_kib", "Pss_Anon:": "pss_anon_kib", "Pss_File:": "pss_file_kib"}.get(parts[0])
                    if key:
                        tot[key] += int(parts[1])
        try:
            tot["tasks"] += len(os.listdir(f"/proc/{pid}/task"))
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue  # gone meanwhile
        tot["processes"] += 1
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") != "anon_inode:inotify":
                    continue
                watches = _read(f"/proc/{pid}/fdinfo/{fd}", FDINFO_LIMIT).count("inotify wd:")
            except OSError:
                continue
            inotify.append((pid, int(fd), watches))
    unique: list[tuple[int, int, int]] = []
    for ent in inotify:  # an instance inherited over fork is one instance, held by several fds
        if not any(u[0] != ent[0] and _kcmp_same(ent[0], ent[1], u[0], u[1]) for u in unique):
            unique.append(ent)
    tot["charged_kib"] = _charged_kib(session["id"])
    tot["inotify_instances"] = len(unique)
    tot["inotify_watches"] = sum(u[2] for u in unique)
    tot["inotify_fds"] = len(inotify)
    return tot


def _charged_kib(sid: str) -> int:
    """What the session's memory cgroup is charged (cgroup v1 ``memory.usage_in_bytes``, v2
    ``memory.current``): its anonymous memory, its tmpfs and shared memory (which PSS counts only
    where mapped) and the kernel's memory for it (slab, stacks, page tables), which PSS omits."""
    for pattern, name in (("/sys/fs/cgroup/memory/drums/*/", "memory.usage_in_bytes"),
                          ("/sys/fs/cgroup/drums/*/", "memory.current")):
        for d in Path("/").glob(pattern.lstrip("/") + sid):
            with contextlib.suppress(OSError, ValueError):
                return int(_read(str(d / name), 64)) >> 10
    return 0


def nonblank(png: bytes) -> float:
    import numpy as np
    from PIL import Image

    img = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
    px = img.reshape(-1, 3)
    return float(np.count_nonzero((px != px[0]).any(axis=1))) / len(px)


def screenshot_check(session: dict) -> float:
    """The guest's screenshot of ``session``: its non-blank share (BenchError below the threshold)."""
    from drums_osworld.desktop import GUEST_PORT
    from drums_osworld.guest.client import GuestClient

    g = GuestClient(session["address"], GUEST_PORT, timeout=30.0)
    try:
        frac = nonblank(g.screenshot())
    finally:
        g.close()
    if frac <= READY:
        raise common.BenchError(f"the screenshot of {session['id']} is blank ({frac:.3f} non-blank)")
    return round(frac, 4)


# ----------------------------------------------------------------------------------- the desktop
def _windows_up(client, sid: str) -> set[str]:
    up = set()
    for w in client.windows(sid):
        if w["mapped"]:
            label = f"{w['title']} {w['wm_class']}".lower()
            up |= {name for name, _, want in APPS if want in label}
    return up


def apps_checkpoint(client, settle: float, timeout: float = 240.0, desktop: str = DEFAULT_DESKTOP) -> dict:
    """A cold osworld desktop (``desktop``: openbox or GNOME) with Chromium, GIMP, VLC and Impress
    open, checkpointed (consumed)."""
    from drums_osworld.desktop import Desktop, desktop_spec

    t0 = time.monotonic()
    desk = Desktop(client, client.create(desktop_spec(image=IMAGE, desktop=desktop)))
    try:
        t_boot = time.monotonic() - t0
        for name, argv, _ in APPS:
            desk.guest.launch(argv, shell=isinstance(argv, str))
            if name == "chromium":
                desk.guest.launch(SOCAT)
        deadline = time.monotonic() + timeout
        while (up := _windows_up(client, desk.id)) != {a[0] for a in APPS}:
            if time.monotonic() > deadline:
                raise common.BenchError(f"the applications' windows did not all come up in {timeout:.0f}s: "
                                        f"up {sorted(up)}")
            time.sleep(0.5)
        t_apps = time.monotonic() - t0
        time.sleep(settle)  # let the applications finish their start-up work
        usage = desktop_usage(client, desk.session)
        t1 = time.monotonic()
        snap = desk.checkpoint(name="density-apps", leave_running=False)
        return {"snapshot": snap, "boot_s": round(t_boot, 3), "apps_up_s": round(t_apps, 3),
                "checkpoint_s": round(time.monotonic() - t1, 3), "cold_usage": usage,
                "windows": snap.get("windows")}
    finally:
        with contextlib.suppress(DrumsError):
            desk.close()


def restore_checked(client, snap_id: str) -> dict:
    """One sibling: restore (timed), liveness, screenshot. Returns ``{"session", ...}`` or ``{"error", "stage"}``."""
    t0 = time.monotonic()
    try:
        [s] = client.restore(snap_id, count=1, min_nonblank=READY)
    except DrumsError as exc:
        err = error_record(exc)
        return {"stage": "restore", "error": err, "counter": counter_named(err),
                "seconds": round(time.monotonic() - t0, 3)}
    row: dict = {"session": s, "restore_s": round(time.monotonic() - t0, 4)}
    try:
        live = client.wait_live(s["id"], timeout=60.0)
        if live.get("liveness") != "ok":
            raise common.BenchError(f"{s['id']}: liveness {live.get('liveness')!r} after 60 s")
    except (DrumsError, common.BenchError) as exc:
        return {**row, "stage": "liveness", "error": error_record(exc)}
    try:
        row["nonblank"] = screenshot_check(s)
    except Exception as exc:  # noqa: BLE001 - any way a screenshot fails is a failed screenshot
        return {**row, "stage": "screenshot", "error": error_record(exc)}
    return row


def restore_batch(client, snap_id: str, n: int) -> list[dict]:
    with ThreadPoolExecutor(max_workers=n) as ex:
        return list(ex.map(lambda _: restore_checked(client, snap_id), range(n)))


def destroy(client, sessions: list[dict]) -> list[str]:
    return common.destroy_all(client, sessions)


# ----------------------------------------------------------------------------------- the hostile desktop
def hostile_status(session: dict) -> dict | None:
    from drums_core.host import safepath

    try:
        data = safepath.read_file(session["root"], f"{HOSTILE_DIR}/status.json".lstrip("/"), limit=1 << 16)
        return json.loads(data)
    except (DrumsError, OSError, ValueError):
        return None


def start_hostile(client, snap_id: str, opts_h: dict, timeout: float = 120.0) -> dict:
    """Restore the hostile sibling, start its attacks as the desktop user, wait until it holds them."""
    rec = restore_checked(client, snap_id)
    if "error" in rec:
        return {"hostile": rec.get("session"), "error": rec}
    s = rec["session"]
    script = HOSTILE_SCRIPT.read_text()
    path = f"{HOSTILE_DIR}/hostile_desktop.py"
    out = client.exec(s["id"], ["sh", "-c", f"mkdir -p {HOSTILE_DIR} && cat > {path}"], user="user", input=script)
    if out["returncode"] != 0:
        return {"hostile": s, "error": {"stage": "copy", "stderr": out["stderr"][-500:]}}
    args = " ".join(f"--{k} {v}" for k, v in opts_h.items())
    cmd = (f"setsid python3 {path} --dir {HOSTILE_DIR}/files --status {HOSTILE_DIR}/status.json {args} "
           f"> {HOSTILE_DIR}/log 2>&1 < /dev/null &")
    out = client.exec(s["id"], ["sh", "-c", cmd], user="user")
    if out["returncode"] != 0:
        return {"hostile": s, "error": {"stage": "start", "stderr": out["stderr"][-500:]}}
    deadline = time.monotonic() + timeout
    while True:
        st = hostile_status(s)
        if st and st.get("cycle", 0) >= 1 and st.get("holding"):
            return {"hostile": s, "status": st, "restore_s": rec["restore_s"]}
        if time.monotonic() > deadline:
            return {"hostile": s, "error": {"stage": "attacks", "message": f"not holding after {timeout:.0f}s",
                                            "status": st}}
        time.sleep(0.2)


def checkpoint_and_delete(client, session: dict) -> dict:
    """A ``leave_running`` checkpoint of ``session`` (timed), its snapshot deleted at once."""
    t0 = time.monotonic()
    try:
        snap = client.checkpoint(session["id"], leave_running=True)
    except DrumsError as exc:
        err = error_record(exc)
        return {"session": session["id"], "error": err, "counter": counter_named(err),
                "seconds": round(time.monotonic() - t0, 3)}
    row = {"session": session["id"], "seconds": round(time.monotonic() - t0, 3), "size_mib": round(
        (snap.get("size") or 0) / MiB, 1), "store_actions": (snap.get("store") or {}).get("actions")}
    try:
        client.delete_snapshot(snap["id"])
    except DrumsError as exc:
        row["delete_error"] = error_record(exc)
    return row


# ----------------------------------------------------------------------------------- the suite
def _summ(values: list[float]) -> dict:
    return {"n": len(values), "p50": _r(pct(values, 50)), "p90": _r(pct(values, 90)),
            "max": _r(max(values) if values else None)}


def _r(x, d: int = 4):
    return None if x is None else round(x, d)


def _per_desktop(usages: list[dict]) -> dict:
    n = len(usages)
    if not n:
        return {}
    out = {k: round(sum(u[k] for u in usages) / n, 2) for k in usages[0] if isinstance(usages[0][k], int)}
    out["pss_mib"] = round(out.pop("pss_kib") / 1024, 1)
    out["pss_anon_mib"] = round(out.pop("pss_anon_kib") / 1024, 1)
    out["pss_file_mib"] = round(out.pop("pss_file_kib") / 1024, 1)
    out["charged_mib"] = round(out.pop("charged_kib") / 1024, 1)
    out["pss_mib_min"] = round(min(u["pss_kib"] for u in usages) / 1024, 1)
    out["pss_mib_max"] = round(max(u["pss_kib"] for u in usages) / 1024, 1)
    out["desktops"] = n
    return out


def measure_all(client, held: list[dict]) -> list[dict]:
    with ThreadPoolExecutor(max_workers=2) as ex:
        return list(ex.map(lambda s: desktop_usage(client, s), held))


def _instance(opts) -> Instance:
    name = check_name(getattr(opts, "instance", None) or common.BENCH_NAME, "instance")
    base = getattr(opts, "slot_base", None)
    return Instance(name=name, slot_base=common.BENCH_SLOT_BASE if base is None else int(base),
                    slot_count=64)  # 64 x 2,048 pids fit the pid budget provisioning sets


class _Interrupted(KeyboardInterrupt):
    pass


def _on_term(signum, frame):  # SIGTERM ends the run as SIGINT does: through every finally
    raise _Interrupted(f"signal {signum}")


def run_density(opts) -> dict:
    quick = bool(opts.quick)
    max_n = getattr(opts, "max", None) or (3 if quick else None)
    batch = max(1, getattr(opts, "batch", None) or (2 if quick else DEFAULT_BATCH))
    reserve = float(getattr(opts, "reserve_mib", None) or DEFAULT_RESERVE_MIB)
    desktop = getattr(opts, "desktop", None) or DEFAULT_DESKTOP
    rounds = opts.rounds or (1 if quick else 6)
    settle = 2.0 if quick else 5.0
    hostile_opts = {"hold": 3.0 if quick else 5.0, "sparse-tib": 20, "links": 3000,
                    "link-mib": 8 if quick else 64, "argv-mib": 16,
                    "inotify-cap": getattr(opts, "hostile_inotify_cap", None) or 0,
                    "pids-cap": getattr(opts, "hostile_pids_cap", None) or 0}
    if not KSM.is_dir():
        raise common.BenchError("this kernel has no KSM (/sys/kernel/mm/ksm)")
    inst = _instance(opts)
    bi = BenchInstance(inst, ksm=True)
    held: list[dict] = []
    held_full: int | None = None
    extra: list[dict] = []  # sessions of a round in flight (destroyed at the round's end or below)
    fill: list[dict] = []
    failures: list[dict] = []
    stop: dict = {}
    ksm: dict = {}
    rounds_out: list[dict] = []
    hostile_log: list[dict] = []
    room: dict = {}
    usage_off: list[dict] = []
    usage_on: list[dict] = []
    desk: dict = {}
    cleanup: dict = {}
    bar = None
    old_term = None
    interrupted: dict | None = None
    if threading.current_thread() is threading.main_thread():
        old_term = signal.signal(signal.SIGTERM, _on_term)
    try:
        bi.start()
        c = bi.client
        host = common.host_facts([inst.name])
        counts_start = host_kernel_counts()
        guess = max_n or int(meminfo_mib() // FIRST_GUESS_MIB)
        bar = progress(1 + guess + 2 + 2 * rounds, "density", opts.no_progress)
        bar.set_postfix_str("cold desktop + 4 applications")
        desk = apps_checkpoint(c, settle, desktop=desktop)
        snap = desk["snapshot"]
        bar.update()
        avail0 = meminfo_mib()
        est = float(FIRST_GUESS_MIB)
        # ---------------------------------------------------------------- fill
        while True:
            avail = meminfo_mib()
            if max_n is not None and len(held) >= max_n:
                stop = {"reason": "max", "message": f"--max {max_n} desktops reached"}
                break
            room_for = int((avail - reserve) // est)
            if room_for < 1:
                stop = {"reason": "memory", "message": f"{avail:.0f} MiB available: under the reserve "
                        f"{reserve:.0f} MiB plus one desktop ({est:.0f} MiB)", "mem_available_mib": round(avail)}
                break
            k = min(batch, room_for, *([max_n - len(held)] if max_n is not None else []))
            t0 = time.monotonic()
            rows = restore_batch(c, snap["id"], k)
            for row in rows:
                rec = {k2: v for k2, v in row.items() if k2 != "session"}
                rec.update(session=(row.get("session") or {}).get("id"), held_before=len(held),
                           batch_wall_s=round(time.monotonic() - t0, 3))
                fill.append(rec)
                if "session" in row and "error" not in row:
                    held.append(row["session"])
                elif "session" in row:
                    extra.append(row["session"])  # restored but failed a check: not held
            bar.update(k)
            bar.set_postfix_str(f"held {len(held)}, {meminfo_mib() / 1024:.1f} GiB available")
            if held:
                est = max(est * 0.5, (avail0 - meminfo_mib()) / len(held)) if len(held) >= 2 else est
            bad = [r for r in rows if "error" in r]
            if bad:
                first = bad[0]
                stop = {"reason": f"{first['stage']}_failed", "error": first["error"],
                        "counter": first.get("counter") or counter_named(first["error"]),
                        "counter_detail": {k2: v for k2, v in (first["error"].get("detail") or {}).items()
                                           if k2 in ("counter", "use", "limit", "need", "sysctl")}
                        if isinstance(first["error"].get("detail"), dict) else None,
                        "failed": len(bad), "of_batch": k, "host_counts": host_kernel_counts()}
                failures += [{"phase": "fill", **{k2: v for k2, v in r.items() if k2 != "session"}} for r in bad]
                destroy(c, extra)
                extra = []
                break
        avail_full = meminfo_mib()
        held_full = len(held)  # what the host held: the phases below let some go for their own room
        counts_full = host_kernel_counts()
        pre_need = reserve + (batch + 1) * est + 2 * (snap.get("size") or 0) / MiB + 256  # the hostile phase's room
        # ---------------------------------------------------------------- what each desktop uses
        bar.set_postfix_str(f"measuring {len(held)} desktops, KSM off")
        usage_off = measure_all(c, held)
        bar.update()
        with ksm_lock():
            saved = {k2: ksm_read(k2) for k2 in KSM_KEYS}
            if saved["run"] != "0":
                ksm = {"skipped": f"KSM was already running on this host (run={saved['run']}): not measured"}
            elif held:
                bar.set_postfix_str(f"KSM on, waiting for two full scans of {len(held)} desktops")
                with KsmArm(saved, 2000, 20):
                    t0 = time.monotonic()
                    converged = wait_full_scans(2, 30.0 + 10.0 * len(held))
                    usage_on = measure_all(c, held)
                    ksm = {"converged": converged, "scan_wait_s": round(time.monotonic() - t0, 1),
                           "pages_sharing": int(ksm_read("pages_sharing")),
                           "pages_shared": int(ksm_read("pages_shared")),
                           "mem_available_mib": round(meminfo_mib())}
                    # Leaving the arm unmerges every page at once, and the desktops grew while it ran
                    # (a full host went into a global OOM kill there): first let go of the desktops
                    # the hostile phase would let go of anyway, while their pages are still merged.
                    keep = max(1, len(held) - math.ceil(max(0.0, pre_need - avail_full) / max(est, 1.0)))
                    ksm["let_go_before_unmerge"] = len(held) - keep
                    while len(held) > keep:
                        destroy(c, [held.pop()])
                ksm["settings_back"] = {k2: ksm_read(k2) for k2 in KSM_KEYS} == saved
        bar.update()
        # ---------------------------------------------------------------- a hostile neighbour
        snap_mib = (snap.get("size") or 0) / MiB
        need = reserve + (batch + 1) * est + 2 * snap_mib + 256
        let_go = []
        while held and meminfo_mib() < need:
            s = held.pop()
            destroy(c, [s])
            let_go.append(s["id"])
        room = {"need_mib": round(need), "let_go": len(let_go), "held": len(held),
                "mem_available_mib": round(meminfo_mib())}
        samples = {"without": [], "with hostile": []}
        try:
            for r in range(rounds):
                for arm in common.rotated(["without", "with hostile"], r):
                    bar.set_postfix_str(f"round {r + 1}/{rounds}: {arm} ({len(held)} desktops held)")
                    row, hrow = _round(c, snap["id"], held, batch, arm, r, hostile_opts, extra)
                    rounds_out.append(row)
                    samples[arm] += row["restore_s"]
                    failures += [{"phase": "hostile", "arm": arm, "round": r, **f} for f in row["failures"]]
                    if hrow:
                        hostile_log.append(hrow)
                    bar.update()
        except KeyboardInterrupt as exc:  # SIGINT, or SIGTERM (_on_term): what was measured is still reported
            interrupted = {"phase": "hostile rounds", "arms_done": len(rounds_out),
                           "signal": "SIGTERM" if isinstance(exc, _Interrupted) else "SIGINT"}
        bar.close()
    finally:
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)
        if bar is not None:
            bar.close()
        if not bi.stopped and getattr(bi, "client", None) is not None:
            with contextlib.suppress(Exception):
                destroy(bi.client, extra + held)
        cleanup = bi.stop()
    # ---------------------------------------------------------------- the report
    # the desktops the fill held at once (a run interrupted in the fill: those held then); the KSM arm
    # and the hostile phase let some go afterwards for their own room (counted apart below)
    n = held_full if held_full is not None else len(held)
    off, on = _per_desktop(usage_off), _per_desktop(usage_on)
    fill_ok = [f["restore_s"] for f in fill if "error" not in f and "restore_s" in f]
    per_drop = round((avail0 - avail_full) / n, 1) if n else None
    allows = round(avail0 / off["pss_mib"], 1) if off.get("pss_mib") else None
    others = {arm: [f for f in failures if f.get("phase") == "hostile" and f.get("arm") == arm]
              for arm in ("without", "with hostile")}
    p50 = {arm: pct(samples[arm], 50) if room else None for arm in ("without", "with hostile")} if room else {}
    rr = ratio(p50.get("with hostile"), p50.get("without")) if p50 else None
    summary = {
        "desktops held": n, "stop reason": stop.get("reason"),
        "stop detail": stop.get("message") or (stop.get("error") or {}).get("message"),
        "stop error reason": (stop.get("error") or {}).get("reason"), "stop counter": stop.get("counter"),
        "PSS MiB/desktop, KSM off": off.get("pss_mib"), "PSS MiB/desktop, KSM on": on.get("pss_mib"),
        "KSM saving": (round(1 - on["pss_mib"] / off["pss_mib"], 3)
                       if on.get("pss_mib") and off.get("pss_mib") else None),
        "memory charged MiB/desktop (its cgroup), KSM off": off.get("charged_mib"),
        "MemAvailable at start MiB": round(avail0), "MemAvailable drop MiB/desktop": per_drop,
        "memory allows (MemAvailable at start / PSS)": allows,
        "held / memory allows": round(n / allows, 3) if allows else None,
        # what this measure can reach at all: with no reserve, held x drop = MemAvailable, so held /
        # allows = PSS / drop (the kernel's memory for a desktop, beside its PSS, is never in reach)
        "held / memory allows at a reserve of 0 (PSS / drop)": (
            round(off["pss_mib"] / per_drop, 3) if off.get("pss_mib") and per_drop else None),
        "inotify instances/desktop": off.get("inotify_instances"),
        "inotify watches/desktop": off.get("inotify_watches"),
        "processes/desktop": off.get("processes"), "tasks (pids)/desktop": off.get("tasks"),
        "fill restore p50 s": _r(pct(fill_ok, 50)), "fill restore p90 s": _r(pct(fill_ok, 90)),
        "let go after the fill (room for the KSM unmerge and the hostile phase)":
            n - room["held"] if room else None,
        "hostile phase: desktops held": room.get("held"),
        "restore p50 s without hostile": _r(p50.get("without")),
        "restore p50 s with hostile": _r(p50.get("with hostile")),
        "restore p50 with/without": rr,
        "failures among the others without hostile": len(others["without"]),
        "failures among the others with hostile": len(others["with hostile"]),
        # the two targets: 40 of today's desktop (openbox), 90% of memory for a heavier one
        **({"target >= 40 desktops": n >= 40} if desktop == "openbox" else
           {"target >= 90% of memory allows": bool(allows and n / allows >= 0.9)}),
        "target 0 failures among the others": not others["with hostile"] and not others["without"],
        "target p50 within 20%": bool(rr is not None and rr <= 1.2),
        "leaked resources after": cleanup.get("leaked"),
        "interrupted": (f"by {interrupted['signal']} in the {interrupted['phase']}, after "
                        f"{interrupted['arms_done']} arm(s)") if interrupted else None,
    }
    table = [{"phase": "fill", "desktops": n, "restores": len(fill_ok),
              "restore p50 s": summary["fill restore p50 s"], "restore p90 s": summary["fill restore p90 s"],
              "failures": len([f for f in failures if f.get("phase") == "fill"])}]
    for arm in ("without", "with hostile"):
        arm_rows = [r for r in rounds_out if r["arm"] == arm]
        table.append({"phase": f"neighbours, {arm}", "desktops": room.get("held"),
                      "restores": len(samples[arm]) if room else 0,
                      "restore p50 s": _r(pct(samples[arm], 50)) if room else None,
                      "restore p90 s": _r(pct(samples[arm], 90)) if room else None,
                      "screenshots": sum(r["screenshots"] for r in arm_rows),
                      "checkpoints": sum(len(r["checkpoints"]) for r in arm_rows),
                      "failures": len(others[arm])})
    return {
        "suite": "density", "quick": quick, "host": host, "interrupted": interrupted,
        "params": {"image": IMAGE, "desktop": desktop, "apps": [a[0] for a in APPS], "max": max_n, "batch": batch,
                   "reserve_mib": reserve, "rounds": rounds, "settle_s": settle, "hostile": hostile_opts,
                   "slots": inst.slot_count},
        "desktop": {k: v for k, v in desk.items() if k != "snapshot"} | (
            {"snapshot_mib": round((desk["snapshot"].get("size") or 0) / MiB, 1)} if desk else {}),
        "stop": stop, "fill": fill,
        "per_desktop": {"ksm_off": off, "ksm_on": on}, "ksm": ksm,
        "kernel_counts": {"start": counts_start, "full": counts_full},
        "hostile_phase": {"room": room, "rounds": rounds_out, "hostile": hostile_log},
        "failures": failures, "cleanup": cleanup, "summary": summary, "table": table,
        "plot": {"title": f"Restore seconds: filling to {n} desktops, then with and without a hostile one",
                 "ylabel": "seconds", "series": {"fill": fill_ok, "without hostile": samples["without"],
                                                 "with hostile": samples["with hostile"]}},
    }


def _round(c, snap_id: str, held: list[dict], batch: int, arm: str, r: int, hostile_opts: dict,
           extra: list[dict]) -> tuple[dict, dict | None]:
    """One round of work on the others (restores, screenshots, a checkpoint), with or without the hostile.

    Both arms have one more sibling than the others, checkpointed while the others' restores run:
    the hostile one (its attacks holding), or in the arm without it an honest one (the control).
    A checkpoint writes the desktop's ~550 MiB of images beside the restores either way, so the
    arms differ by the attacks alone (a first version checkpointed only the hostile one and
    measured the checkpoint's cost as the hostile's)."""
    row: dict = {"arm": arm, "round": r, "restore_s": [], "failures": [], "screenshots": 0, "checkpoints": []}
    hrow: dict | None = None
    h_thread = None
    h_result: dict = {}
    subject = None
    if arm == "with hostile":
        hrow = start_hostile(c, snap_id, hostile_opts)
        hrow["round"] = r
        row["hostile_holding"] = "error" not in hrow
        if hrow.get("hostile"):
            extra.append(hrow["hostile"])
        if "error" not in hrow:
            subject = hrow["hostile"]
    else:
        rec = restore_checked(c, snap_id)
        if rec.get("session"):
            extra.append(rec["session"])
        if "error" in rec:
            row["failures"].append({"op": f"control {rec['stage']}", "error": rec["error"],
                                    "counter": rec.get("counter")})
        else:
            subject = rec["session"]
    if subject is not None:
        h_thread = threading.Thread(target=lambda: h_result.update(checkpoint_and_delete(c, subject)), daemon=True)
        h_thread.start()
    try:
        rows = restore_batch(c, snap_id, batch)
        for x in rows:
            if x.get("session"):
                extra.append(x["session"])
            if "restore_s" in x and x.get("stage") != "restore":
                row["restore_s"].append(x["restore_s"])
            if "error" in x:
                row["failures"].append({"op": x["stage"], "error": x["error"], "counter": x.get("counter")})

        def shot(s):
            try:
                return s["id"], screenshot_check(s), None
            except Exception as exc:  # noqa: BLE001 - any failure of a screenshot counts
                return s["id"], None, error_record(exc)

        with ThreadPoolExecutor(max_workers=4) as ex:
            for sid, _, err in ex.map(shot, held):
                row["screenshots"] += 1
                if err:
                    row["failures"].append({"op": "screenshot", "session": sid, "error": err})
        if held:
            ck = checkpoint_and_delete(c, held[(2 * r + (arm == "with hostile")) % len(held)])
            row["checkpoints"].append(ck)
            if "error" in ck:
                row["failures"].append({"op": "checkpoint", **ck})
        if h_thread is not None:
            h_thread.join(timeout=300)
            ck = dict(h_result) or {"error": "still running after 300 s"}
            if hrow is not None:
                hrow["checkpoint"] = ck
                hrow["status_after"] = hostile_status(hrow["hostile"])
            else:
                row["control_checkpoint"] = ck
                if "error" in ck:
                    row["failures"].append({"op": "control checkpoint", **ck})
    finally:
        gone = [s for s in extra if s is not (hrow or {}).get("hostile")]
        if hrow and hrow.get("hostile"):
            gone.append(hrow["hostile"])
        errs = destroy(c, gone)
        extra.clear()
        if errs:
            row["destroy_errors"] = errs
    if hrow and hrow.get("hostile"):
        hrow["hostile"] = hrow["hostile"]["id"]
    return row, hrow
