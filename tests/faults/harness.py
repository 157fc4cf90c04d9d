"""The fault-window driver: kill a real drumsd at one named point, then check what the sweep leaves.

Three windows run at once (``DRUMS_FW_PARALLEL``; no two ``nat`` windows together: they share the
stand-in upstream), each on its own daemon instance (own state tmpfs, socket, slot range, nftables
table). Each window's checks tell the other window's live processes, CRIU and mounts from leftovers
(:class:`Running`): its tagged processes, CRIU and mounts are skipped by the check before a window,
a copy of the host's mount table held by one of its processes before a pivot is not a holder of this
run's mounts (P1), and a ``/tmp/.criu.*`` mount counts only when it stays (every CRIU run mounts a
probe there for milliseconds: :func:`lasting_criu_mounts`). For every window:

1. refuse to run on an unclean host (anything of this harness left over, a ``/tmp/.criu.*`` mount
   that stays): the window is recorded ``INVALID`` and the next one is tried;
2. a healthy daemon builds a session (bare X, xterm, or bare X plus a crowd of 300 tasks and 64 MiB
   of memory, so that CRIU's restore lasts well beyond the timed windows), checkpoints it and stops
   cleanly;
3. a daemon started with ``DRUMS_FAULT_AT=<window>`` runs the one operation that reaches the window
   (a restore; a restore then a checkpoint; a restore then a destroy; an injected readiness failure
   then a restore for ``restore-teardown-done``); the harness waits until the daemon is gone;
4. a decoy process tagged with another run (``--tag drums:<run>0``, a prefix collision) and a decoy
   tmpfs at ``sessions/<sid>0`` (a path no ledger recorded, a prefix collision of a recorded one)
   are made; the host is snapshotted and O1 is checked against the dead run's ledger;
5. ``python -m drums_core.sweep --ledger <state>/ledger --json`` runs as a subprocess (for the
   sweep windows it is first run with ``DRUMS_FAULT_AT=sweep-*`` and must die, then rerun);
6. P1..P6 are checked, a further sweep must be a no-op; not gating, ``X1`` lists directories of the
   run the sweep left (session dirs, snapshot staging dirs) and ``N1`` checks that a fresh daemon on
   the same instance still restores the snapshot (the host is not poisoned); for the snapshot
   store's windows (``evict``/``spill``) ``S1`` then checks the store that daemon recovered: every
   snapshot it serves verifies whole, nothing retired or half-swapped is left, the spill directory
   holds only what the store links, and the victim is whole or gone (gating for those windows);
7. the instance is stopped and removed whatever happened (``tests.support.suite.stop_instance``, then
   anything still there is removed by force and reported in the row).

One JSON row per window goes to the results file (``DRUMS_FW_RESULTS``, default
``results/fault-windows.jsonl``, appended). Standalone::

    python -m tests.faults.harness [--runs 3] [--windows a,b] [--results FILE]

Criteria (the issue's): F0 the window was reached (the daemon died there; the killed sweep died);
O1 before the sweep, every mount under the run's directories (the instance's ``sessions/`` and
``snapshots/.staging/``: each window has the instance to itself) is one its ledger recorded; P1 no
process of the run and no ``criu`` of the run (by tag, recorded pid+start time, recorded paths,
pid namespace of a recorded init, foreign mount namespace holding the run's mounts); P2 no mount
under the run's directories or ``/tmp/.criu.*``; P3 no ``dvh*`` link, nft table, X11 link or cgroup
(``drums/<run>/...``) of the run, and no host setting it held (a ``nat`` window's stand-in
upstream has its forwarding back as it was, no shared record names the run); P4 the run's ledger
is gone; P5 both decoys untouched; P6 a further sweep is a no-op.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tests.support import REPO
from tests.support.wait import WaitTimeout, wait_until

from drums_core.host import mounttable, ownedpaths, procs
from drums_core.client import Client
from drums_core.config import STATE_ROOT, X11_DIR, Instance
from drums_core.errors import DrumsError, Unavailable
from drums_core.host.hoststate import ledger_claims, snapshot_host_state
from drums_core.sweep.ledger import Ledger

DEFAULT_RESULTS = REPO / "results" / "fault-windows.jsonl"
SLOTS_PER_WINDOW = 4
CLIENT_TIMEOUT = 180.0  # no operation here takes minutes; a hung daemon must not hang the suite
XTERM = {"programs": [{"name": "xterm", "argv": ["xterm", "-xrm", "*allowTitleOps: false", "-title", "fwin"]}],
         "expect_window": "fwin"}
# For the timed windows CRIU's restore must last well beyond 250 ms on any host: 300 small tasks
# (forked and restored one by one) plus 64 MiB of touched memory give ~1 s on a loaded 2-CPU VM.
CROWD_TASKS = 300
CROWD_MIB = 64
CROWD_READY = "/tmp/crowd-ready"
CROWD = {"programs": [{"name": "crowd", "argv": [
    "/bin/sh", "-c",
    f"for i in $(seq {CROWD_TASKS}); do sleep 10000000 & done; exec /usr/bin/python3 -c "
    f"\"import time; x = b'\\x01' * ({CROWD_MIB} << 20); open('{CROWD_READY}', 'w').close(); "
    f"time.sleep(10 ** 7)\""]}]}
SPECS = {"bare": {}, "xterm": XTERM, "crowd": CROWD}  # and "nat": a bare session routed through a stand-in
NAT_DNS = "203.0.113.153"
CRITERIA = ("F0", "O1", "P1", "P2", "P3", "P4", "P5", "P6")
INSTANCE_RE = re.compile(r"^fw\d+-\d\d$")  # every instance this harness makes
TAG_RE = re.compile(r"^drums:fw\d+-\d\d-")
NFT_RE = re.compile(r"^drums_fw\d+_\d\d_")


@dataclass(frozen=True)
class Window:
    """One fault window: its name, the operation that reaches it, the session it needs.

    ``op``: ``restore``; ``restore-fail`` (inject a readiness failure, then restore); ``checkpoint``,
    ``checkpoint-running`` (``leave_running``: the desktop runs on) and ``destroy`` (of a session the
    faulty daemon restored first); ``sweep`` (the daemon dies at
    ``daemon_window``, then the sweep is killed at ``name`` and rerun); ``evict`` (under a budget of
    2.5 snapshots, a restored session is checkpointed as a cache state, then another one must evict
    it); ``spill`` (under a budget of 1.5 snapshots, a cold session's checkpoint must spill the base).
    """

    name: str
    op: str
    spec: str = "bare"
    daemon_window: str | None = None

    @property
    def daemon_fault(self) -> str:
        return self.daemon_window if self.op == "sweep" else self.name


WINDOWS: tuple[Window, ...] = (
    Window("restore-before-overlay", "restore"),
    Window("restore-after-writable-layer", "restore"),
    Window("restore-after-cgroup", "restore"),
    Window("restore-after-overlay", "restore"),
    *(Window(f"criu+{ms}ms", "restore", "crowd") for ms in (30, 80, 150, 250)),
    *(Window(f"criu-top+{ms}ms", "restore", "crowd") for ms in (30, 80, 150, 250)),
    Window("restore-after-criu", "restore"),
    Window("restore-after-register", "restore", "xterm"),
    Window("restore-mid-reseed", "restore"),
    Window("restore-teardown-done", "restore-fail"),
    Window("checkpoint-before-staging", "checkpoint"),
    Window("checkpoint-after-dump", "checkpoint"),
    Window("checkpoint-mid-staging", "checkpoint"),
    Window("checkpoint-mid-freeze", "checkpoint"),
    Window("checkpoint-staged", "checkpoint"),
    Window("checkpoint-published", "checkpoint"),
    Window("checkpoint-committed", "checkpoint"),
    Window("checkpoint-mid-copy", "checkpoint-running"),
    Window("destroy-after-kill", "destroy"),
    Window("destroy-before-cgroup-remove", "destroy"),
    Window("destroy-after-unmount", "destroy"),
    Window("evict-before-retire", "evict", "xterm"),
    Window("evict-retired", "evict", "xterm"),
    Window("purge-mid-delete", "evict", "xterm"),
    Window("spill-mid-copy", "spill", "xterm"),
    Window("spill-copied", "spill", "xterm"),
    Window("spill-swapped", "spill", "xterm"),
    Window("nat-hold-recorded", "restore", "nat"),
    Window("nat-hold-applied", "restore", "nat"),
    Window("nat-release-before-restore", "destroy", "nat"),
    Window("nat-release-restored", "destroy", "nat"),
    Window("sweep-after-kill", "sweep", "xterm", daemon_window="restore-after-register"),
    Window("sweep-after-unmount", "sweep", "xterm", daemon_window="restore-after-register"),
    Window("sweep-before-cgroup-remove", "sweep", "xterm", daemon_window="restore-after-register"),
    Window("sweep-after-cgroup-remove", "sweep", "xterm", daemon_window="restore-after-register"),
    Window("sweep-after-links", "sweep", "xterm", daemon_window="restore-after-register"),
)
WINDOW_NAMES = tuple(w.name for w in WINDOWS)
TIMED_RE = re.compile(r"^(criu|criu-top)\+\d+ms$")


def engine_windows() -> set[str]:
    """Every literal ``faults.hit("...")`` in the engine, plus the sweep's own windows."""
    from drums_core.sweep.hostops import FAULT_WINDOWS

    found: set[str] = set(FAULT_WINDOWS)
    for path in (REPO / "drums_core").rglob("*.py"):
        found |= set(re.findall(r"""faults\.hit\(\s*["']([^"']+)["']\s*\)""", path.read_text()))
    return found


def results_path() -> Path:
    return Path(os.environ.get("DRUMS_FW_RESULTS") or DEFAULT_RESULTS)


def selected_windows(names: str | None = None) -> list[Window]:
    names = names if names is not None else os.environ.get("DRUMS_FW_WINDOWS", "")
    if not names.strip():
        return list(WINDOWS)
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in WINDOW_NAMES]
    if unknown:
        raise ValueError(f"unknown fault windows {unknown}; known: {list(WINDOW_NAMES)}")
    return [w for w in WINDOWS if w.name in wanted]


def _slot_base() -> int:
    """The first slot of the windows: ``DRUMS_FW_SLOT_BASE``, else the fault-window part of this
    process's slot block (tests/support/slots.py), which no other test process on the host uses."""
    from tests.support.slots import my_block

    return int(os.environ.get("DRUMS_FW_SLOT_BASE") or my_block().faults.start)


def _criterion(ok: bool, detail=None) -> dict:
    out: dict = {"pass": bool(ok)}
    if detail:
        out["detail"] = detail
    return out


def _run(argv: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, **kw)


# ---------------------------------------------------------------------------------------------
# host probes


def _x11_links() -> dict[str, str | None]:
    try:
        names = os.listdir(X11_DIR)
    except FileNotFoundError:
        return {}
    return {str(X11_DIR / n): procs.readlink(str(X11_DIR / n)) for n in names if os.path.islink(X11_DIR / n)}


def _links() -> set[str]:
    try:
        return {n for n in os.listdir("/sys/class/net") if n.startswith("dvh")}
    except OSError:
        return set()


def _nft_names() -> set[str]:
    from drums_core.sweep.hostops import nft_tables

    return {name for _family, name in nft_tables()}


def _pidns(pid: int) -> str | None:
    return procs.readlink(f"/proc/{pid}/ns/pid")


def _harness_instance_of(path: str) -> str | None:
    """The harness instance whose state dir holds ``path`` (by component), or None."""
    if not ownedpaths.path_within(path, str(STATE_ROOT)) or path == str(STATE_ROOT):
        return None
    first = Path(path).relative_to(STATE_ROOT).parts[0]
    return first if INSTANCE_RE.match(first) else None


def _criu_tmp_dirs() -> list[str]:
    try:
        return [f"/tmp/{n}" for n in os.listdir("/tmp") if n.startswith(".criu.")]
    except OSError:
        return []


def lasting_criu_mounts(points: list[str], timeout: float = 2.0) -> list[str]:
    """Those of the ``/tmp/.criu.*`` mount points ``points`` that are still mounted after ``timeout``.

    Every CRIU run on a host whose ``/run`` is not a tmpfs (this one's; CRIU then keeps no kerndat
    cache) mounts a probe tmpfs at ``/tmp/.criu.move_mount_set_group.*`` in the host's mount table
    and removes it milliseconds later: one seen while another window's CRIU runs is that probe.
    What a killed CRIU left stays, and is returned."""
    def still() -> list[str]:
        try:
            now = {m.mountpoint for m in mounttable.read_mountinfo()}
        except (OSError, ValueError):
            return list(points)
        return [p for p in points if p in now]

    with contextlib.suppress(WaitTimeout):
        wait_until(lambda: not still(), timeout, "CRIU's probe mounts to go", every=0.05)
    return still()


def harness_footprint(slot_lo: int, slot_hi: int, exclude_pids: set[int] = frozenset(),
                      running: Iterable[Instance] = ()) -> list[str]:
    """What this harness (any run of it) could have left on the host, plus ``/tmp/.criu.*`` mounts
    that last (:func:`lasting_criu_mounts`).

    Empty on a clean host. Used before each window (a window never runs on an unclean host) and
    by the tests of the harness itself. ``running``: the instances of windows this harness runs at
    the same time (their tagged processes, CRIU, mounts, slots and tables are theirs, not leftovers).
    """
    running = list(running)
    busy = {inst.name for inst in running}
    busy_tags = tuple(f"drums:{name}-" for name in busy)
    busy_slots = {s for inst in running for s in range(inst.slot_base, inst.slot_base + inst.slot_count)}
    busy_tables = tuple("drums_" + name.replace("-", "_") + "_" for name in busy)
    out: list[str] = []
    table = procs.scan_processes()
    for p in table.values():
        if p.zombie or p.pid in exclude_pids:
            continue
        bad = [t for t in p.tags if TAG_RE.match(t) and not t.startswith(busy_tags)]
        if bad:
            out.append(f"process {p.describe()} tagged {bad[0]}")
            continue
        if p.is_criu and any(_harness_instance_of(n) not in (None, *busy) for n in procs.proc_paths(p.pid).all()):
            out.append(f"criu {p.describe()} names a harness instance")
    try:
        mounts = mounttable.read_mountinfo()
    except (OSError, ValueError) as exc:
        return out + [f"mountinfo unreadable: {exc}"]
    criu_points = [m.mountpoint for m in mounts if m.mountpoint.startswith("/tmp/.criu.")]
    out += [f"mount {p} (left by CRIU)" for p in lasting_criu_mounts(criu_points)] if criu_points else []
    for m in mounts:
        if _harness_instance_of(m.mountpoint) not in (None, *busy):
            out.append(f"mount {m.mountpoint} ({m.fstype})")
    mine = {f"dvh{s}" for s in range(slot_lo, slot_hi) if s not in busy_slots}
    out += [f"link {n}" for n in sorted(_links() & mine)]
    xmine = {str(X11_DIR / f"X{100 + s}") for s in range(slot_lo, slot_hi) if s not in busy_slots}
    out += [f"x11 link {p}" for p in sorted(set(_x11_links()) & xmine)]
    try:
        out += [f"nft table {n}" for n in sorted(_nft_names()) if NFT_RE.match(n) and not n.startswith(busy_tables)]
    except OSError as exc:
        out.append(f"nft unreadable: {exc}")
    return out


def instance_footprint(inst: Instance, exclude_pids: set[int] = frozenset()) -> dict[str, list]:
    """Everything on the host that belongs to ``inst`` (its state dir, slots, table prefix, run tags)."""
    prefix = f"drums:{inst.name}-"
    slots = range(inst.slot_base, inst.slot_base + inst.slot_count)
    out: dict[str, list] = {"processes": [], "mounts": [], "links": [], "nft": [], "x11links": []}
    for p in procs.scan_processes().values():
        if not p.zombie and p.pid not in exclude_pids and any(t.startswith(prefix) for t in p.tags):
            out["processes"].append([p.pid, p.starttime, p.describe()])
    with contextlib.suppress(OSError, ValueError):
        out["mounts"] = [m.mountpoint for m in
                         mounttable.mounts_within(mounttable.read_mountinfo(), [str(inst.state_dir)])]
    out["links"] = sorted(_links() & {f"dvh{s}" for s in slots})
    table_prefix = "drums_" + inst.name.replace("-", "_") + "_"
    with contextlib.suppress(OSError):
        out["nft"] = sorted(n for n in _nft_names() if n.startswith(table_prefix))
    out["x11links"] = sorted(set(_x11_links()) & {str(X11_DIR / f"X{100 + s}") for s in slots})
    return out


def force_clean(inst: Instance, exclude_pids: set[int] = frozenset()) -> dict[str, list]:
    """Remove by force whatever of ``inst`` is still on the host; returns what it found (empty: nothing)."""
    found = instance_footprint(inst, exclude_pids)
    for pid, start, _ in found["processes"]:
        with contextlib.suppress(ProcessLookupError):
            if procs.is_alive(pid, start):
                os.kill(pid, signal.SIGKILL)
    for pid, start, _ in found["processes"]:
        with contextlib.suppress(WaitTimeout):  # reported by the caller's footprint check
            wait_until(lambda pid=pid, start=start: not procs.is_alive(pid, start), 5, f"{pid} to die")
    for m in found["mounts"]:  # deepest first
        with contextlib.suppress(OSError):
            mounttable.umount_detach(m)
    for name in found["links"]:
        _run(["ip", "link", "del", name])
    for name in found["nft"]:
        _run(["nft", "delete", "table", "inet", name])
    for path in found["x11links"]:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    return {k: v for k, v in found.items() if v}


# ---------------------------------------------------------------------------------------------
# decoys


class Decoys:
    """A process tagged with another run and a tmpfs at a path no ledger recorded."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.start: int | None = None
        self.tag: str | None = None
        self.mount: Path | None = None
        self.marker: Path | None = None

    def make(self, other_run: str, mount_at: Path) -> None:
        self.tag = procs.run_tag(other_run)
        self.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)", "--tag", self.tag],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     cwd="/")
        wait_until(lambda: self.tag in procs.tags_of(procs.read_cmdline(self.proc.pid)), 10, "the decoy process")
        self.start = procs.starttime(self.proc.pid)
        mount_at.mkdir(parents=True, exist_ok=True)
        out = _run(["mount", "-t", "tmpfs", "-o", "size=1m", "drums-fw-decoy", str(mount_at)])
        if out.returncode != 0:
            raise RuntimeError(f"decoy tmpfs: {out.stderr.strip()}")
        self.mount = mount_at
        self.marker = mount_at / "decoy-marker"
        self.marker.write_text("decoy")

    @property
    def pids(self) -> set[int]:
        return {self.proc.pid} if self.proc else set()

    def problems(self) -> list[str]:
        out = []
        if self.proc is not None:
            if not procs.is_alive(self.proc.pid, self.start):
                out.append(f"decoy process {self.proc.pid} ({self.tag}) was killed")
            elif self.tag not in procs.tags_of(procs.read_cmdline(self.proc.pid)):
                out.append(f"decoy process {self.proc.pid} lost its tag")
        if self.mount is not None:
            mounted = [m for m in mounttable.read_mountinfo() if m.mountpoint == str(self.mount)]
            if not mounted or mounted[-1].fstype != "tmpfs":
                out.append(f"decoy tmpfs {self.mount} was unmounted")
            elif not (self.marker and self.marker.is_file() and self.marker.read_text() == "decoy"):
                out.append(f"decoy tmpfs {self.mount} lost its file")
        return out

    def close(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
        if self.mount is not None:
            with contextlib.suppress(OSError):
                mounttable.umount_detach(str(self.mount))
            with contextlib.suppress(OSError):
                self.mount.rmdir()


# ---------------------------------------------------------------------------------------------
# one window


def daemon_env(fault: str | None) -> dict:
    return {"DRUMS_FAULT_AT": fault or "", "DRUMS_TEST_HOOKS": "1", "DRUMS_LIVENESS_DELAY": "3"}


def wait_crowd(client: Client, sid: str, timeout: float = 60.0) -> None:
    """Wait until the crowd session has forked its tasks and touched its memory (else the dump misses them)."""
    def ready() -> bool:
        return client.exec(sid, ["test", "-e", CROWD_READY], timeout=10)["returncode"] == 0

    wait_until(ready, timeout, f"crowd session {sid} to be ready", every=0.1)


def build_snapshot(inst: Instance, spec_name: str, spec: dict | None = None) -> dict:
    """A healthy daemon makes a session and checkpoints it, then stops (leaving no ledger)."""
    healthy = Client(inst, daemon_env=daemon_env(None), timeout=CLIENT_TIMEOUT)
    info = healthy.ping()
    s = healthy.create(spec if spec is not None else SPECS[spec_name])
    if spec_name == "crowd":
        wait_crowd(healthy, s["id"])
    snap = healthy.checkpoint(s["id"])
    healthy.shutdown(destroy_sessions=True)
    with contextlib.suppress(WaitTimeout):  # a daemon that outlives its shutdown shows in the window's checks
        wait_until(lambda: not procs.is_alive(info["pid"]), 30, "the daemon to exit")
    return {"snapshot": snap["id"], "run": info["run"], "session": s["id"], "size": snap["size"]}


STORE_OPS = {"evict": 2.5, "spill": 1.5}  # the faulty daemon's store budget, in base snapshots


def spill_dir(inst: Instance) -> Path:
    return Path("/var/lib/drums/spill") / inst.name


def sweep_cli(ledger_root: Path, fault: str | None = None, timeout: float = 180) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "DRUMS_FAULT_AT"}
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if fault:
        env["DRUMS_FAULT_AT"] = fault
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "drums_core.sweep", "--ledger", str(ledger_root), "--json"],
                         capture_output=True, text=True, timeout=timeout, env=env, cwd=str(REPO))
    res = {"rc": out.returncode, "seconds": round(time.monotonic() - t0, 3), "stderr": out.stderr[-3000:]}
    try:
        res["report"] = json.loads(out.stdout) if out.stdout.strip() else None
    except ValueError:
        res["report"] = None
        res["stdout"] = out.stdout[-2000:]
    return res


_COUNT_KEYS = ("processes_killed", "mounts_unmounted", "cgroups_removed", "links_deleted", "nft_deleted",
               "x11links_removed", "dirs_removed", "entries_forgotten", "ledgers_removed", "survivors", "errors")


def sweep_counts(report: dict | None) -> dict:
    if not report:
        return {}
    out = {k: report.get(k) for k in _COUNT_KEYS}
    out["status"] = {r["run"]: r["status"] for r in report.get("runs", [])}
    errs = [e for r in report.get("runs", []) for e in r.get("errors", [])] + report.get("global_errors", [])
    if errs:
        out["error_lines"] = errs[:10]
    surv = [s for r in report.get("runs", []) for s in r.get("survivors", [])]
    if surv:
        out["survivor_list"] = surv[:10]
    return out


class Running:
    """The instances of the windows this harness runs at this moment (two run at once, see
    :func:`run_windows`): each window's checks tell a neighbour's live processes, CRIU and mounts from
    leftovers of its own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._instances: dict[str, Instance] = {}

    def add(self, inst: Instance) -> None:
        with self._lock:
            self._instances[inst.name] = inst

    def remove(self, inst: Instance) -> None:
        with self._lock:
            self._instances.pop(inst.name, None)

    def others(self, inst: Instance) -> list[Instance]:
        with self._lock:
            return [i for name, i in self._instances.items() if name != inst.name]


class WindowRun:
    def __init__(self, window: Window, index: int, *, harness_run: str, iteration: int,
                 slot_lo: int, slot_hi: int, running: Running | None = None) -> None:
        self.w = window
        self.running = running or Running()
        self.index = index
        self.inst = Instance(name=f"fw{os.getpid()}-{index:02d}", slot_base=slot_lo + index * SLOTS_PER_WINDOW,
                             slot_count=SLOTS_PER_WINDOW)
        self.slot_lo, self.slot_hi = slot_lo, slot_hi
        self.row: dict = {"window": window.name, "op": window.op, "spec": window.spec, "instance": self.inst.name,
                          "harness_run": harness_run, "iteration": iteration, "time": time.time()}
        self.criteria: dict = {}
        self.decoys = Decoys()
        self.run: str | None = None
        self.criu_tmp_before = set(_criu_tmp_dirs())
        self.host_root: tuple[str, str] | None = None  # (dev, root) of the host's "/", read before the sweep
        self.notes: list[str] = []

    # -------------------------------------------------------------- driver
    def execute(self) -> dict:
        t0 = time.monotonic()
        dirty = harness_footprint(self.slot_lo, self.slot_hi, running=self.running.others(self.inst))
        if self.inst.state_dir.exists() and any(self.inst.state_dir.iterdir()):
            dirty.append(f"state dir {self.inst.state_dir} exists and is not empty")
        if dirty:
            self.row.update(status="INVALID", **{"pass": False}, invalid=dirty[:20], criteria={},
                            seconds=round(time.monotonic() - t0, 2))
            return self.row
        self.running.add(self.inst)
        try:
            self._drive()
        except Exception as exc:  # noqa: BLE001 - the row records it; the next window still runs
            self.notes.append(f"harness error: {exc!r}")
            self.row["traceback"] = traceback.format_exc()[-4000:]
        finally:
            try:
                self._cleanup()
            finally:
                self.running.remove(self.inst)
        for c in CRITERIA:
            self.criteria.setdefault(c, {"pass": False, "detail": "not checked"})
        self.row["criteria"] = {c: self.criteria[c] for c in CRITERIA}
        extra = {k: v for k, v in self.criteria.items() if k not in CRITERIA}
        if extra:
            self.row["extra"] = extra
        gating = CRITERIA + (("S1",) if self.w.op in STORE_OPS else ())
        ok = all(self.criteria.get(c, {"pass": False})["pass"] for c in gating) and not any(
            n.startswith("harness error") for n in self.notes)
        self.row["pass"] = ok
        self.row["status"] = "PASS" if ok else "FAIL"
        if self.notes:
            self.row["notes"] = self.notes
        if not ok:
            self.row["log_tail"] = self._log_tail()
        else:
            with contextlib.suppress(OSError):
                self.inst.log_file.unlink()
        self.row["seconds"] = round(time.monotonic() - t0, 2)
        return self.row

    def _log_tail(self, n: int = 40) -> list[str]:
        try:
            lines = self.inst.log_file.read_text().splitlines()
        except OSError:
            return []
        return lines[-n:]

    def _drive(self) -> None:
        w = self.w
        t = time.monotonic()
        spec = None
        if w.spec == "nat":  # a stand-in upstream of its own (tests.support.netstandin), kept until the cleanup
            from tests.support.netstandin import StandIn

            self.standin = StandIn(f"dsf{os.getpid() % 100000}", 3, {"dns.fw.test": NAT_DNS},
                                   routed="203.0.113.128/25", name="fault-windows").start()
            self.nat_prior = self.standin.forwarding()
            spec = {"network": {"policy": "nat", "upstream": self.standin.ifname, "dns": [NAT_DNS]}}
        base = build_snapshot(self.inst, w.spec, spec)
        self.snapshot = base["snapshot"]
        self.base_size = base["size"]
        self.row["setup_seconds"] = round(time.monotonic() - t, 2)
        left = Ledger.runs(self.inst.ledger_root)
        if left:
            self.notes.append(f"the healthy daemon left ledgers {left}")

        t = time.monotonic()
        reached = self._fault(base)
        self.row["fault_seconds"] = round(time.monotonic() - t, 2)
        if not reached:
            return
        self._inspect_and_sweep(base)

    def _fault(self, base: dict) -> bool:
        w, inst = self.w, self.inst
        env = daemon_env(w.daemon_fault)
        if w.op in STORE_OPS:
            env.update(DRUMS_STORE_BUDGET=str(int(STORE_OPS[w.op] * self.base_size)), DRUMS_STORE_MEM_FLOOR="0",
                       DRUMS_SPILL_DIR=str(spill_dir(inst)))
        faulty = Client(inst, daemon_env=env, timeout=CLIENT_TIMEOUT)
        info = faulty.ping()
        self.run = info["run"]
        self.row["run"] = self.run
        pid = info["pid"]
        outcome = None
        stage = "the armed operation"
        try:
            if w.op in ("checkpoint", "checkpoint-running", "destroy"):
                stage = "the restore before the armed operation"
                (r,) = faulty.restore(self.snapshot)
                self.row["session"] = r["id"]
                stage = "the armed operation"
                if w.op == "destroy":
                    outcome = faulty.destroy(r["id"])
                else:
                    outcome = faulty.checkpoint(r["id"], leave_running=w.op == "checkpoint-running")
            elif w.op == "evict":
                stage = "the checkpoint of a cache state before the armed operation"
                (r,) = faulty.restore(self.snapshot)
                self.victim = faulty.checkpoint(r["id"], cache=True)["id"]
                (r,) = faulty.restore(self.snapshot)
                self.row["session"] = r["id"]
                stage = "the armed operation"
                outcome = faulty.checkpoint(r["id"])
            elif w.op == "spill":
                stage = "the cold boot before the armed operation"
                s = faulty.create(SPECS[w.spec])
                self.row["session"] = s["id"]
                self.victim = self.snapshot
                stage = "the armed operation"
                outcome = faulty.checkpoint(s["id"])
            elif w.op == "restore-fail":
                faulty.call("inject", point="restore-readiness", times=1)
                outcome = faulty.restore(self.snapshot)
            else:
                outcome = faulty.restore(self.snapshot)
        except Unavailable as exc:
            if exc.reason != "DAEMON_DIED":
                self.criteria["F0"] = _criterion(False, f"operation failed without the daemon dying: {exc!r}")
                return False
            if stage != "the armed operation":
                self.criteria["F0"] = _criterion(False, f"the daemon died during {stage}, not at {w.daemon_fault}")
                return False
        except DrumsError as exc:
            self.criteria["F0"] = _criterion(False, f"operation failed without the daemon dying: {exc!r}")
            return False
        if outcome is not None:
            timings = [o.get("timings") for o in outcome] if isinstance(outcome, list) else outcome
            self.criteria["F0"] = _criterion(False, f"window {w.daemon_fault} not reached: the operation "
                                                    f"completed (timings {str(timings)[:300]})")
            return False
        try:
            wait_until(lambda: not procs.is_alive(pid), 15, f"daemon {pid} to die")
        except WaitTimeout:
            self.criteria["F0"] = _criterion(False, f"daemon {pid} still alive 15 s after the connection died")
            return False
        self.criteria["F0"] = _criterion(True, f"daemon {pid} died at {w.daemon_fault}")
        return True

    # -------------------------------------------------------------- checks
    def _inspect_and_sweep(self, base: dict) -> None:
        inst, run = self.inst, self.run
        root = inst.ledger_root
        runs = Ledger.runs(root)
        if runs != [run]:
            self.notes.append(f"ledgers before the sweep: {runs} (expected only {run})")
        entries = Ledger(root, run).entries() if (root / run).is_dir() else []
        claims = ledger_claims(root, run) if (root / run).is_dir() else {"links": [], "nft_tables": [],
                                                                          "x11_links": [], "paths": []}
        mount_parts = set()
        recorded: set[tuple[int, int]] = set()
        sids: list[str] = []
        for e in entries:
            d = e.data
            if e.kind == "mount":
                mount_parts.add(d.get("path") or e.key)
            if e.kind == "session":
                sids.append(e.key)
                if d.get("root"):
                    mount_parts.add(d["root"])
                if isinstance(d.get("init_pid"), int) and isinstance(d.get("starttime"), int) and d["init_pid"] > 1:
                    recorded.add((d["init_pid"], d["starttime"]))
            if e.kind == "process" and isinstance(d.get("pid"), int) and isinstance(d.get("starttime"), int):
                recorded.add((d["pid"], d["starttime"]))
        host_pidns = _pidns(os.getpid())
        pidns = {ns for pid, start in recorded if procs.is_alive(pid, start)
                 for ns in [_pidns(pid)] if ns and ns != host_pidns}
        self.row["ledger_before"] = {"entries": len(entries), "kinds": sorted({e.kind for e in entries}),
                                     "sessions": sids, "recorded_processes": len(recorded)}
        self.run_tags = {procs.run_tag(run), procs.run_tag(base["run"])}
        self.run_dirs = [str(inst.sessions_dir), str(inst.snapshots_dir / ".staging")]

        # decoys, then the host as the dead daemon left it (O1)
        sid = sids[0] if sids else "decoy"
        self.decoys.make(f"{run}0", inst.sessions_dir / f"{sid}0")
        before = snapshot_host_state({run: self.run_dirs})
        decoy_mount = str(self.decoys.mount)
        self.host_points = {m["mountpoint"] for m in before["mounts"].get(run, [])} | {decoy_mount}
        host_tops = [m for m in mounttable.read_mountinfo() if m.mountpoint == "/"]
        self.host_root = (host_tops[-1].dev, host_tops[-1].root) if host_tops else None
        mounts = [m["mountpoint"] for m in before["mounts"].get(run, []) if m["mountpoint"] != decoy_mount]
        unrecorded = [m for m in mounts if not ownedpaths.within_any(m, claims["paths"])]
        exact = [m for m in mounts if m in mount_parts]
        self.criteria["O1"] = _criterion(not unrecorded and not before["errors"], {
            "mounts": len(mounts), "recorded_exactly": len(exact), "under_recorded_dir": len(mounts) - len(exact)
            - len(unrecorded), "unrecorded": unrecorded, "errors": before["errors"],
            "criu_tmp_mounts": [m["mountpoint"] for m in before["criu_mounts"]]})
        self.row["before"] = {
            "tagged": sum(len(before["tagged"].get(t[len("drums:"):], [])) for t in self.run_tags),
            "criu": len([p for p in before["criu"] if run in p.get("runs", [])]),
            "ns_holders_naive": len(before["ns_holders"].get(run, [])),
            "processes_of_run": len(self._run_processes(recorded, pidns, before)),
            "recorded_alive": len([1 for pid, st in recorded if procs.is_alive(pid, st)]),
            "mounts": len(mounts), "links": sorted(set(claims["links"]) & _links()),
            "nft": claims["nft_tables"], "x11": [p for p in claims["x11_links"] if os.path.lexists(p)]}

        # the sweep (for the sweep windows: killed at its window first, then rerun)
        if self.w.op == "sweep":
            killed = sweep_cli(root, fault=self.w.name)
            self.row["sweep_killed"] = {"rc": killed["rc"], "seconds": killed["seconds"]}
            if killed["rc"] != -signal.SIGKILL:
                self.criteria["F0"] = _criterion(False, f"sweep at {self.w.name} exited {killed['rc']}, "
                                                        f"not SIGKILL: {killed['stderr'][-500:]}")
            else:
                self.criteria["F0"]["detail"] += f"; sweep killed at {self.w.name}"
        first = sweep_cli(root)
        self.row["sweep"] = {"rc": first["rc"], "seconds": first["seconds"], **sweep_counts(first["report"])}
        if first["report"] is None:
            self.notes.append(f"sweep printed no report: {first['stderr'][-1000:]}")

        self._check_after(recorded, pidns, claims)
        second = sweep_cli(root)
        counts = sweep_counts(second["report"])
        noop = (second["rc"] == 0 and second["report"] is not None
                and all(v == 0 for k, v in counts.items() if k in _COUNT_KEYS))
        self.criteria["P6"] = _criterion(noop, None if noop else {"rc": second["rc"], **counts,
                                                                  "stderr": second["stderr"][-500:]})
        hurt = self.decoys.problems()
        self.criteria["P5"] = _criterion(not hurt, hurt)
        if os.environ.get("DRUMS_FW_NEXT", "1") == "1":
            self.criteria["N1"] = self._next_daemon_restores()
            if self.w.op in STORE_OPS:
                self.criteria["S1"] = self._store_consistent()
            hurt = self.decoys.problems()
            if hurt and self.criteria["P5"]["pass"]:
                self.criteria["N1"] = _criterion(False, {"next daemon hurt the decoys": hurt,
                                                         "was": self.criteria["N1"]})
        # informational: /tmp/.criu.* dirs that appeared during the window and are still there
        # (CRIU removes its own unless killed; on a shared host another instance's CRIU may add some)
        new_tmp = sorted(set(_criu_tmp_dirs()) - self.criu_tmp_before)
        if new_tmp:
            self.row["criu_tmp_dirs_new"] = new_tmp

    def _run_processes(self, recorded: set[tuple[int, int]], pidns: set[str], state: dict) -> list[str]:
        """P1: live processes of the run, by evidence that cannot collide by accident.

        By its tags (the dead run's, and the run whose snapshot its sessions were restored from: a
        restored process carries the tag it was dumped with); by recorded pid + start time; by the
        pid namespace of a recorded session init; ``criu`` naming the run's directories (cwd, root,
        open files) and everything below it; any process naming them in its cwd/root/exe/open files;
        a foreign mount namespace whose ``/`` is one of the run's overlays, or that holds a mount
        under the run's directories that is not a plain copy of a host mount (same mount point as
        one the host had there before the sweep: a namespace some unrelated process cloned, e.g.
        another instance's CRIU, meanwhile). Decoys, this process and its ancestors excluded.
        """
        run, decoys = self.run, self.decoys.pids
        me = procs.self_and_ancestors()
        table = procs.scan_processes()
        out: list[str] = []
        seen: set[int] = set()

        def add(pid: int, what: str) -> None:
            if pid not in decoys and pid not in me and pid not in seen:
                seen.add(pid)
                out.append(what)

        for tag in self.run_tags:
            for p in state["tagged"].get(tag[len("drums:"):], []):
                add(p["pid"], f"tagged {tag}: {p['cmd']}")
        criu = [p["pid"] for p in state["criu"] if run in p.get("runs", [])]
        for p in state["criu"]:
            if run in p.get("runs", []):
                add(p["pid"], f"criu naming the run's dirs: {p['cmd']}")
        for pid in procs.descendants(table, criu):
            if pid in table and not table[pid].zombie:
                add(pid, f"below the run's criu: {table[pid].describe()}")
        for pid, start in recorded:
            if procs.is_alive(pid, start):
                add(pid, f"recorded pid {pid} (start {start}) alive")
        own_ns = procs.mnt_ns("self")
        neighbours = self._neighbour_processes(table)
        ns_verdict: dict[str, str | None] = {}
        for p in table.values():
            if p.zombie or p.pid in me or p.pid in decoys:
                continue
            if pidns and _pidns(p.pid) in pidns:
                add(p.pid, f"in a recorded session's pid namespace: {p.describe()}")
                continue
            ns = procs.mnt_ns(p.pid)
            if ns and ns != own_ns:
                if ns not in ns_verdict:
                    ns_verdict[ns] = self._holds_run_mounts(p.pid, neighbours)
                if ns_verdict[ns]:
                    add(p.pid, f"mount namespace {ns_verdict[ns]}: {p.describe()}")
                continue
            hit = next((n for n in procs.proc_paths(p.pid).all() if ownedpaths.within_any(n, self.run_dirs)), None)
            if hit:
                add(p.pid, f"names {hit}: {p.describe()}")
        return out

    def _neighbour_processes(self, table: dict[int, procs.ProcInfo]) -> set[int]:
        """Processes of the windows running beside this one: tagged with one of their runs, or a
        ``criu`` naming one of their state dirs, and everything below those."""
        others = self.running.others(self.inst)
        if not others:
            return set()
        tags = tuple(f"drums:{inst.name}-" for inst in others)
        dirs = [str(inst.state_dir) for inst in others]
        roots = [p.pid for p in table.values() if not p.zombie and (
            any(t.startswith(tags) for t in p.tags)
            or (p.is_criu and any(ownedpaths.within_any(n, dirs) for n in procs.proc_paths(p.pid).all())))]
        return set(roots) | procs.descendants(table, roots)

    def _holds_run_mounts(self, pid: int, neighbours: set[int] = frozenset()) -> str | None:
        """Why ``pid``'s mount namespace holds the run's mounts, or None. A neighbour window's process
        in a namespace whose root is still the host's (its CRIU restore or session launch before the
        pivot) holds a copy of the host's table taken while this run's mounts were there: not the
        run's. Nothing of this run is ever below a neighbour's process."""
        try:
            mounts = mounttable.read_mountinfo(pid)
        except (OSError, ValueError):
            return None
        roots = [m for m in mounts if m.mountpoint == "/"]
        if roots and any(ownedpaths.within_any(ref, self.run_dirs) for ref in roots[-1].referenced_paths()):
            return f"rooted in the run's overlay ({roots[-1].superopts[:120]})"
        if pid in neighbours and roots and (roots[-1].dev, roots[-1].root) == self.host_root:
            self.row["neighbour_copies"] = self.row.get("neighbour_copies", 0) + 1  # evidence, not gating
            return None
        for m in mounts:
            if m.mountpoint == "/" or m.mountpoint in self.host_points:
                continue
            hit = next((ref for ref in m.referenced_paths() if ownedpaths.within_any(ref, self.run_dirs)), None)
            if hit:
                return f"holds {m.mountpoint} ({m.fstype}) naming {hit}"
        return None

    def _check_after(self, recorded: set[tuple[int, int]], pidns: set[str], claims: dict) -> None:
        inst, run = self.inst, self.run
        after = snapshot_host_state({run: self.run_dirs})
        left = self._run_processes(recorded, pidns, after)
        self.criteria["P1"] = _criterion(not left, left)
        decoy_mount = str(self.decoys.mount)
        mounts = [f"{m['mountpoint']} ({m['fstype']})" for m in after["mounts"].get(run, [])
                  if m["mountpoint"] != decoy_mount]
        criu_points = [m["mountpoint"] for m in after["criu_mounts"]]
        lasting = lasting_criu_mounts(criu_points) if criu_points else []
        if len(lasting) < len(criu_points):
            self.row["criu_probe_mounts_gone"] = sorted(set(criu_points) - set(lasting))  # evidence, not gating
        mounts += [f"{p} (left by CRIU)" for p in lasting]
        self.criteria["P2"] = _criterion(not mounts and not after["errors"], mounts + after["errors"])
        slots = range(inst.slot_base, inst.slot_base + inst.slot_count)
        links = sorted((set(after["links"]) & ({f"dvh{s}" for s in slots} | set(claims["links"]))))
        table_prefix = "drums_" + inst.name.replace("-", "_") + "_"
        tables = sorted({t["name"] for t in after["nft_tables"]
                         if t["name"].startswith(table_prefix) or t["name"] in claims["nft_tables"]})
        xl = {x["path"] for x in after["x11_links"]}
        x11 = sorted(xl & ({str(X11_DIR / f"X{100 + s}") for s in slots} | set(claims["x11_links"])))
        p3 = [f"link {n}" for n in links] + [f"nft table {n}" for n in tables] + [f"x11 link {p}" for p in x11]
        p3 += [f"cgroup {p}" for p in after["cgroups"].get(run, [])]
        p3 += [f"hostnet record for {r.get('ifname')} still names the run" for r in after["hostnet"]
               if run in (r.get("holders") or {})]
        if getattr(self, "standin", None) is not None and self.standin.forwarding() != self.nat_prior:
            p3.append(f"forwarding on {self.standin.ifname} is {self.standin.forwarding()}, was {self.nat_prior}")
        self.criteria["P3"] = _criterion(not p3, p3)
        led = inst.ledger_root / run
        left = sorted(os.listdir(led)) if led.is_dir() else []
        self.criteria["X1"] = self._leftover_dirs()
        self.criteria["P4"] = _criterion(not led.exists(), {"ledger": str(led), "files": left[:20]} if left else None)

    def _leftover_dirs(self) -> dict:
        """Not gating (P1-P6 do not ask for it): directories the run made that the sweep left
        (session dirs, snapshot staging dirs)."""
        left = []
        for d in (self.inst.sessions_dir, self.inst.snapshots_dir / ".staging"):
            with contextlib.suppress(FileNotFoundError):
                left += [str(d / n) for n in sorted(os.listdir(d)) if d / n != self.decoys.mount]
        return _criterion(not left, left or None)

    def _next_daemon_restores(self) -> dict:
        """Not gating: a fresh daemon on the same instance restores the snapshot (the host is not poisoned)."""
        try:
            c = Client(self.inst, daemon_env=daemon_env(None), timeout=CLIENT_TIMEOUT)
            pid = c.ping()["pid"]
            adopted = [s["id"] for s in c.list()]
            (r,) = c.restore(self.snapshot)
            rc = c.exec(r["id"], ["true"])["returncode"]
            c.destroy(r["id"])
            c.shutdown(destroy_sessions=True)
            with contextlib.suppress(WaitTimeout):  # judged by the criteria that follow, as before
                wait_until(lambda: not procs.is_alive(pid), 30, "the daemon to exit")
            ok = rc == 0 and not adopted
            return _criterion(ok, None if ok else {"exec_rc": rc, "sessions_at_start": adopted})
        except Exception as exc:  # noqa: BLE001 - reported in the row
            return _criterion(False, repr(exc)[:1000])

    def _store_consistent(self) -> dict:
        """S1 (store windows): the store as the next daemon recovered it serves only whole snapshots."""
        from drums_core.store.snapshots import SnapshotStore

        store = SnapshotStore(self.inst.snapshots_dir, spill_root=spill_dir(self.inst))
        problems: list[str] = []
        left = [p.name for p in store.root.iterdir() if p.name.startswith((".rm-", ".spill-"))]
        problems += [f"left in the store: {n}" for n in left]
        linked = {os.readlink(p) for p in store.root.iterdir() if p.is_symlink()}
        if store.spill_root.exists():
            problems += [f"spill dir holds {p.name}, which no store link names" for p in store.spill_root.iterdir()
                         if str(p) not in linked]
        served = {}
        for snap in store.list():
            try:
                store.verify(snap)
                served[snap.id] = "disk" if store.is_spilled(snap.id) else "memory"
            except DrumsError as exc:
                problems.append(f"{snap.id} does not verify: {exc}")
        victim = getattr(self, "victim", None)
        if self.w.op == "evict" and self.w.name != "evict-before-retire" and victim in served:
            problems.append(f"the victim {victim} is still served after {self.w.name}")
        if self.w.op == "spill" and victim not in served:
            problems.append(f"the spilled snapshot {victim} is gone")
        return _criterion(not problems, problems or {"served": served})

    # -------------------------------------------------------------- cleanup
    def _cleanup(self) -> None:
        from tests.support.suite import stop_instance

        errors = []
        self.decoys.close()
        try:
            stop_instance(self.inst)
        except Exception as exc:  # noqa: BLE001
            errors.append(f"stop_instance: {exc!r}")
        try:
            if getattr(self, "standin", None) is not None:
                self.standin.close()
        except Exception as exc:  # noqa: BLE001
            errors.append(f"stand-in close: {exc!r}")
        forced = force_clean(self.inst)
        if forced:
            self.notes.append(f"cleanup had to force-remove {forced}")
            with contextlib.suppress(Exception):
                stop_instance(self.inst)
        for path in self.inst.daemon_files:
            with contextlib.suppress(OSError):
                path.unlink()
        with contextlib.suppress(OSError):
            self.inst.state_dir.rmdir()
        shutil.rmtree(spill_dir(self.inst), ignore_errors=True)  # copies of snapshots of the unmounted store
        if errors:
            self.notes.extend(errors)


# ---------------------------------------------------------------------------------------------
# a harness run


# Windows at once (DRUMS_FW_PARALLEL). A window waits between its bursts (daemons starting and
# dying, the kill, the sweep), so three keep this 2-CPU machine's CPUs busier than two: every
# window of the list in 69.6 s at three and 85.2 s at two, on an otherwise idle host (2026-12-07).
PARALLEL = 3


def parallel_windows() -> int:
    return max(1, int(os.environ.get("DRUMS_FW_PARALLEL") or PARALLEL))


class _Queue:
    """The windows still to run, handed out in order, except that two ``nat`` windows never run at
    once (each makes the same stand-in upstream: one interface name, one routed range)."""

    def __init__(self, windows: list[Window]) -> None:
        self.pending = list(windows)
        self.nat_busy = False
        self.stopped = False
        self.cond = threading.Condition()

    def take(self) -> Window | None:
        with self.cond:
            while True:
                if self.stopped or not self.pending:
                    return None
                for i, w in enumerate(self.pending):
                    if w.spec == "nat" and self.nat_busy:
                        continue
                    self.nat_busy |= w.spec == "nat"
                    return self.pending.pop(i)
                self.cond.wait()

    def done(self, w: Window) -> None:
        with self.cond:
            if w.spec == "nat":
                self.nat_busy = False
            self.cond.notify_all()

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify_all()


def run_windows(windows: list[Window] | None = None, *, results: Path | None = None, iteration: int = 1,
                harness_run: str | None = None, echo=print, parallel: int | None = None) -> list[dict]:
    """Run ``windows`` (default: all), ``parallel`` at a time (default :func:`parallel_windows`), each
    on its own instance and slots; append one JSON row each to ``results``; return the rows in the
    order of ``windows``. Interrupted (SIGINT), it starts no further window, lets the running ones
    finish and clean up, and raises ``KeyboardInterrupt``."""
    if os.geteuid() != 0:
        raise PermissionError("the fault-window harness needs root (namespaces, mounts, CRIU)")
    windows = list(WINDOWS) if windows is None else windows
    results = results or results_path()
    results.parent.mkdir(parents=True, exist_ok=True)
    harness_run = harness_run or uuid.uuid4().hex[:10]
    slot_lo = _slot_base()
    slot_hi = slot_lo + SLOTS_PER_WINDOW * len(WINDOWS)
    running = Running()
    queue = _Queue(windows)
    rows: dict[str, dict] = {}
    failures: list[BaseException] = []
    out_lock = threading.Lock()

    def lane() -> None:
        try:
            while (w := queue.take()) is not None:
                try:
                    row = WindowRun(w, WINDOW_NAMES.index(w.name), harness_run=harness_run, iteration=iteration,
                                    slot_lo=slot_lo, slot_hi=slot_hi, running=running).execute()
                finally:
                    queue.done(w)
                with out_lock:
                    rows[w.name] = row
                    with open(results, "a") as f:
                        f.write(json.dumps(row, sort_keys=False, default=str) + "\n")
                    if echo:
                        echo(_row_line(iteration, w, row))
        except BaseException as exc:  # noqa: BLE001 - re-raised by the caller's thread below
            failures.append(exc)
            queue.stop()

    lanes = [threading.Thread(target=lane, name=f"fault-lane-{i}") for i in range(parallel or parallel_windows())]
    for t in lanes:
        t.start()
    try:
        for t in lanes:
            while t.is_alive():
                t.join(0.5)
    except KeyboardInterrupt:
        queue.stop()
        for t in lanes:
            t.join()
        raise
    if failures:
        raise failures[0]
    return [rows[w.name] for w in windows if w.name in rows]


def _row_line(iteration: int, w: Window, row: dict) -> str:
    failed = [c for c, v in row.get("criteria", {}).items() if not v["pass"]]
    extra = {k: v["pass"] for k, v in row.get("extra", {}).items()}
    return (f"[{iteration}] {w.name:28s} {row['status']:7s} {row['seconds']:6.2f}s"
            + (f" failed={failed}" if failed else "") + (f" extra={extra}" if extra else "")
            + (f" invalid={row['invalid'][:3]}" if row.get("invalid") else ""))


def summarize(rows: list[dict]) -> dict:
    out = {"windows": len(rows), "pass": sum(r["status"] == "PASS" for r in rows),
           "fail": sum(r["status"] == "FAIL" for r in rows), "invalid": sum(r["status"] == "INVALID" for r in rows),
           "seconds": round(sum(r.get("seconds", 0) for r in rows), 1)}
    out["failing"] = {r["window"]: [c for c, v in r.get("criteria", {}).items() if not v["pass"]] or r.get("invalid")
                      for r in rows if r["status"] != "PASS"}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.faults.harness", description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=1, help="consecutive runs of the whole set")
    ap.add_argument("--windows", default=None, help="comma-separated window names (default: all)")
    ap.add_argument("--results", default=None, help=f"JSONL results file (default {DEFAULT_RESULTS})")
    ap.add_argument("--parallel", type=int, default=None, help=f"windows at once (default {PARALLEL})")
    ap.add_argument("--list", action="store_true", help="list the windows and exit")
    args = ap.parse_args(argv)
    if args.list:
        for w in WINDOWS:
            extra = f" daemon={w.daemon_window}" if w.daemon_window else ""
            print(f"{w.name:28s} op={w.op:12s} spec={w.spec}{extra}")
        return 0
    windows = selected_windows(args.windows)
    results = Path(args.results) if args.results else results_path()
    harness_run = uuid.uuid4().hex[:10]
    summaries = []
    for i in range(1, args.runs + 1):
        t0 = time.monotonic()
        rows = run_windows(windows, results=results, iteration=i, harness_run=harness_run, parallel=args.parallel)
        s = summarize(rows)
        s["wall_seconds"] = round(time.monotonic() - t0, 1)
        summaries.append(s)
        print(json.dumps({"iteration": i, **s}))
    print(f"results appended to {results} (harness_run {harness_run})")
    return 0 if all(s["pass"] == s["windows"] for s in summaries) else 1


if __name__ == "__main__":
    sys.exit(main())
