"""The snapshot store's byte budget: what may be evicted or spilled to make room, and when.

Every snapshot sits in the instance's state tmpfs (memory) unless spilled. An instance has a
budget for those bytes (``DRUMS_STORE_BUDGET``: ``400m``, ``2g``, ``75%`` of the state tmpfs;
default 80% of it). A checkpoint first asks :meth:`StoreKeeper.make_room` for what it may need
(its session's anonymous and shared memory plus its writable layer, with 64 MiB to spare), then,
once committed, :meth:`StoreKeeper.settle` brings the store back under budget (the estimate can
be low). Room is made in this order, least recently used (last restore, else creation) first:

1. **evict** unused ``cache`` snapshots (``retention="cache"``: states the caller can make again,
   such as OSWorld's ``init_state`` and ``post_setup:<task>``); broken ones before the rest;
2. **spill** unused ``pinned`` snapshots (every other one: a state an env saved, a trajectory's
   states, ``drums checkpoint``) to disk (``DRUMS_SPILL_DIR``, default
   ``/var/lib/drums/spill/<instance>``; ``off`` disables): the same files, served through a symlink;
3. else refuse: ``Unavailable`` with reason ``STORE_FULL``; nothing was evicted or spilled (the
   plan is made before anything moves).

Before any of that, one checkpoint may add at most ``DRUMS_SNAPSHOT_MAX`` (``2g``, or ``25%`` of the
budget; default a quarter of the budget, at least 1 GiB): a bigger one is refused with
``Unavailable`` reason ``SNAPSHOT_TOO_LARGE`` before anything is written, evicted or spilled, so no
one session can push the others' states out of memory. Sizes are what a snapshot occupies (allocated
blocks, each inode once, and its inodes: :mod:`drums_core.store.usage`), never what its files claim.

*Unused* means: no live session stacks on its layer (restored from it or from a descendant), no
other snapshot stacks on its layer (chained checkpoints: a parent goes only after its children),
and no operation holds it (:meth:`StoreKeeper.hold`: a restore being set up, a checkpoint in
flight). Pinned snapshots are never deleted here. When memory runs short (``MemAvailable`` below
``DRUMS_STORE_MEM_FLOOR``, default 1g) a checkpoint also evicts and spills what helps, but a
shortage that the store cannot cure does not fail it.

Every eviction and spill is logged, appended to ``<state>/store-journal.jsonl``, returned with the
checkpoint that caused it (``store.actions``) and shown by ``drums snapshots``. An eviction is one
rename (``.rm-<id>``: no lookup finds it any more) followed by the delete, so a crash leaves
nothing half-deleted that a restore could use; the daemon's next start finishes it.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ..session import faults
from ..errors import FailedPrecondition, NotFound, Unavailable
from ..reasons import Reason
from .snapshots import MANIFEST, Snapshot, SnapshotStore

log = logging.getLogger("drums.store")

MiB = 1 << 20
MARGIN = 64 * MiB           # kept free on the tmpfs beyond a checkpoint's estimate
DEFAULT_BUDGET = "80%"
DEFAULT_MEM_FLOOR = "1g"
DEFAULT_SNAPSHOT_MAX_SHARE = 0.25   # of the budget, ...
MIN_SNAPSHOT_MAX = 1 << 30          # ... but at least this: the heaviest desktop measured dumps ~0.5 GiB
DEFAULT_SPILL_ROOT = Path("/var/lib/drums/spill")
JOURNAL_KEEP = 1000         # journal lines kept across restarts
SPILL_RETRY = 600.0         # seconds before a snapshot whose spill failed is tried again
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)


def parse_size(text: str, whole: int | None = None) -> int:
    """Bytes from ``123``, ``400m``, ``2G``, ``1.5GiB`` or (with ``whole``) ``75%``."""
    from ..errors import InvalidArgument

    t = str(text).strip()
    if t.endswith("%"):
        try:
            pct = float(t[:-1])
        except ValueError:
            pct = -1.0
        if whole is None or not 0 < pct <= 100:
            raise InvalidArgument(f"bad size {text!r}: a percentage in (0, 100]", reason=Reason.BAD_SIZE)
        return int(whole * pct / 100)
    m = _SIZE.match(t)
    if not m:
        raise InvalidArgument(f"bad size {text!r}: bytes, or a number with k, m, g or t", reason=Reason.BAD_SIZE)
    return int(float(m.group(1)) * (1 << (10 * " kmgt".index(m.group(2).lower() or " "))))


def _fs(path: Path) -> tuple[int, int]:
    """(size, free) bytes of the filesystem holding ``path`` (its nearest existing ancestor)."""
    while not path.exists():
        path = path.parent
    st = os.statvfs(path)
    return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize


def mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


@dataclass(frozen=True)
class BudgetConfig:
    """The budget of one instance's store, and where it spills."""

    budget: int
    source: str
    spill_root: Path | None
    mem_floor: int = 1 << 30
    disk_reserve: int = 2 << 30   # spilling stops short of this much free disk
    snapshot_max: int | None = None   # what one checkpoint may add (None: no cap)
    snapshot_max_source: str = "no cap"

    @classmethod
    def from_env(cls, state_dir: Path, instance: str, env: dict | None = None) -> BudgetConfig:
        env = os.environ if env is None else env
        size, _free = _fs(state_dir)
        raw = env.get("DRUMS_STORE_BUDGET") or DEFAULT_BUDGET
        budget = parse_size(raw, whole=size)
        source = (f"DRUMS_STORE_BUDGET={raw}" if env.get("DRUMS_STORE_BUDGET") else
                  f"{DEFAULT_BUDGET} of the {size / 2**30:.1f} GiB state tmpfs")
        spill = env.get("DRUMS_SPILL_DIR", "")
        if spill.lower() in ("off", "none", "no", "0"):
            spill_root = None
        else:
            spill_root = (Path(spill) if spill else DEFAULT_SPILL_ROOT / instance)
            if not spill_root.is_absolute():
                from ..errors import InvalidArgument

                raise InvalidArgument(f"DRUMS_SPILL_DIR must be absolute: {spill!r}", reason=Reason.BAD_SPILL_DIR)
        floor = parse_size(env.get("DRUMS_STORE_MEM_FLOOR") or DEFAULT_MEM_FLOOR)
        raw_max = env.get("DRUMS_SNAPSHOT_MAX")
        if raw_max:
            snapshot_max = parse_size(raw_max, whole=budget)
            max_source = f"DRUMS_SNAPSHOT_MAX={raw_max}"
        else:
            snapshot_max = max(MIN_SNAPSHOT_MAX, int(budget * DEFAULT_SNAPSHOT_MAX_SHARE))
            max_source = (f"a quarter of the budget, at least {MIN_SNAPSHOT_MAX >> 30} GiB; DRUMS_SNAPSHOT_MAX "
                          "sets it")
        return cls(budget=budget, source=source, spill_root=spill_root, mem_floor=floor,
                   snapshot_max=snapshot_max, snapshot_max_source=max_source)


@dataclass
class _Item:
    snap: Snapshot
    size: int
    last_used: float
    spilled: bool
    children: set[str] = field(default_factory=set)


class StoreKeeper:
    """Keeps one store within its budget (see the module docstring).

    ``in_use`` returns what live sessions stack on: (layer paths, snapshot ids). ``journal`` is the
    file evictions and spills are appended to."""

    def __init__(self, store: SnapshotStore, config: BudgetConfig, in_use: Callable[[], tuple[set, set]],
                 journal: Path) -> None:
        self.store = store
        self.config = config
        self.in_use = in_use
        self.journal = journal
        self._lock = threading.Lock()     # holds, and every check-then-move of a snapshot
        self._room = threading.Lock()     # one planner at a time (copies to disk happen under it)
        self._holds: dict[str, int] = {}
        self._reserved: dict[str, int] = {}
        self._actions: dict[str, list[dict]] = {}
        self._gone: dict[str, dict] = {}  # id -> journal entry, for a clear NotFound
        # id -> (when, why) its spill failed (a file the spill filesystem cannot hold: ext4 refuses a
        # 20 TiB sparse file, EFBIG): not tried again for SPILL_RETRY s, so plans move on to what can move
        self._unspillable: dict[str, tuple[float, str]] = {}
        self.counts = {"evicted": 0, "spilled": 0, "store_full": 0, "too_large": 0}
        self._load_journal()
        log.info("snapshot store budget %.0f MiB (%s), spill directory %s, memory floor %.0f MiB, one checkpoint "
                 "at most %s (%s)", config.budget / MiB, config.source, config.spill_root or "off",
                 config.mem_floor / MiB,
                 "any size" if config.snapshot_max is None else f"{config.snapshot_max / MiB:.0f} MiB",
                 config.snapshot_max_source)

    # ------------------------------------------------------------------ holds
    @contextlib.contextmanager
    def hold(self, sid: str, must_exist: bool = True) -> Iterator[None]:
        """Keep ``sid`` from eviction and spilling meanwhile. NotFound when it is gone already (saying
        so when it was evicted)."""
        with self._lock:
            if must_exist and not (self.store.path(sid) / MANIFEST).exists():
                raise self.evicted_error(sid) or NotFound(f"no snapshot {sid!r}", reason=Reason.SNAPSHOT_NOT_FOUND)
            self._holds[sid] = self._holds.get(sid, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                left = self._holds.get(sid, 1) - 1
                if left <= 0:
                    self._holds.pop(sid, None)
                else:
                    self._holds[sid] = left

    def evicted_error(self, sid: str) -> NotFound | None:
        """NotFound saying that (and when) ``sid`` was evicted, if it was; else None."""
        gone = self._gone.get(sid)
        if gone is None:
            return None
        return NotFound(f"snapshot {sid} ({gone.get('name') or 'unnamed'}) was evicted from the store "
                        f"{time.time() - gone.get('time', 0):.0f} s ago to make room: it was a cache state "
                        "nothing used", reason=Reason.SNAPSHOT_NOT_FOUND, detail={"evicted": gone})

    # ------------------------------------------------------------------ what the store holds
    def _items(self) -> dict[str, _Item]:
        items: dict[str, _Item] = {}
        for snap in self.store.list():
            items[snap.id] = _Item(snap, snap.size, self.store.last_used(snap), self.store.is_spilled(snap.id))
        layer_owner = {str(self.store.path(i) / "layer"): i for i in items}
        for it in items.values():
            for layer in it.snap.layers[1:]:
                parent = layer_owner.get(layer)
                if parent is not None:
                    items[parent].children.add(it.snap.id)
        return items

    def _blocked(self, it: _Item, layers: set, ids: set) -> str | None:
        """Why ``it`` may not move now (None: it may)."""
        sid = it.snap.id
        if self._holds.get(sid):
            return "held by an operation"
        if sid in ids or str(self.store.path(sid) / "layer") in layers:
            return "in use by a session"
        return None

    def _memory_used(self, items: dict[str, _Item]) -> int:
        return sum(it.size for it in items.values() if not it.spilled)

    # ------------------------------------------------------------------ planning
    def _plan(self, need: int, protect: set[str], hard: bool,
              session: str | None = None) -> tuple[list[tuple[str, _Item]], dict]:
        """The moves that make room for ``need`` bytes, LRU first, and the numbers behind them. Pinned
        snapshots ``session`` made itself are spilled before any other session's."""
        items = self._items()
        layers, ids = self.in_use()
        cfg = self.config
        used = self._memory_used(items) + sum(v for k, v in self._reserved.items() if k not in protect)
        _size, free = _fs(self.store.root)
        avail = mem_available() if cfg.mem_floor else 0
        short_budget = used + need - cfg.budget
        short_fs = need + MARGIN - free
        short_mem = min(cfg.mem_floor - avail, used) if cfg.mem_floor else 0
        facts = {"budget": cfg.budget, "used": used, "need": need, "tmpfs_free": free, "mem_available": avail}
        hard_short = max(short_budget, short_fs)
        target = max(hard_short, short_mem)
        plan: list[tuple[str, _Item]] = []
        if target <= 0:
            return plan, facts
        gone: set[str] = set()
        freed = 0
        disk_free = _fs(cfg.spill_root)[1] if cfg.spill_root is not None else 0
        while freed < target:
            evictable = [it for it in items.values() if it.snap.id not in gone and it.snap.id not in protect
                         and it.snap.retention == "cache" and not it.spilled and not (it.children - gone)
                         and it.snap.state in ("committed", "broken") and self._blocked(it, layers, ids) is None]
            if evictable:
                victim = min(evictable, key=lambda it: (it.snap.state != "broken", it.last_used))
                plan.append(("evict", victim))
            else:
                spillable = [it for it in items.values() if it.snap.id not in gone and it.snap.id not in protect
                             and not self._spill_failed(it.snap.id)
                             and it.snap.retention != "cache" and not it.spilled and it.snap.state == "committed"
                             and self._blocked(it, layers, ids) is None
                             and disk_free - it.size >= cfg.disk_reserve]
                if not spillable:
                    break
                victim = min(spillable, key=lambda it: (session is None or it.snap.session != session,
                                                        it.last_used))
                disk_free -= victim.size
                plan.append(("spill", victim))
            gone.add(victim.snap.id)
            freed += victim.size
        facts["freeable"] = freed
        if hard and freed < hard_short:
            blocked = {}
            for it in items.values():
                if it.spilled:
                    continue
                why = self._blocked(it, layers, ids)
                if why is None and it.children:
                    why = f"{len(it.children)} snapshot(s) stack on it"
                if why is None and self._spill_failed(it.snap.id):
                    why = f"pinned, and its spill failed: {self._spill_failed(it.snap.id)}"
                if why is None and it.snap.retention != "cache":
                    why = ("pinned, and spilling is off" if cfg.spill_root is None else
                           "pinned, and the spill disk has no room" if it.snap.state == "committed"
                           else f"pinned ({it.snap.state})")
                blocked[it.snap.id] = {"name": it.snap.name, "size": it.size, "why": why}
            facts["kept"] = blocked
            self.counts["store_full"] += 1
            raise Unavailable(
                f"the snapshot store is full: {used / MiB:.0f} MiB of its {cfg.budget / MiB:.0f} MiB budget "
                f"({cfg.source}) is in use and a checkpoint may need {need / MiB:.0f} MiB more "
                f"({free / MiB:.0f} MiB free on the tmpfs); evicting and spilling what nothing uses would free "
                f"{freed / MiB:.0f} MiB. Delete snapshots (drums snapshots lists what holds each) or raise "
                "DRUMS_STORE_BUDGET", reason=Reason.STORE_FULL, detail=facts)
        return plan, facts

    # ------------------------------------------------------------------ moves
    def check_size(self, need: int, for_id: str, parts: dict | None = None) -> None:
        """Refuse a checkpoint that may add more than one checkpoint may (``DRUMS_SNAPSHOT_MAX``):
        Unavailable ``SNAPSHOT_TOO_LARGE``. Called before anything is written, evicted or spilled."""
        cap = self.config.snapshot_max
        if cap is None or need <= cap:
            return
        with self._lock:
            self.counts["too_large"] += 1
        detail = {"need": need, "snapshot_max": cap, "source": self.config.snapshot_max_source,
                  "parts": parts or {}, "snapshot": for_id}
        log.warning("refused checkpoint %s: it may add %.0f MiB, one checkpoint may add %.0f MiB (%s); %s",
                    for_id, need / MiB, cap / MiB, self.config.snapshot_max_source, parts or "")
        raise Unavailable(
            f"this checkpoint may add {need / MiB:.0f} MiB to the snapshot store (what the session's files and "
            f"memory occupy), and one checkpoint may add at most {cap / MiB:.0f} MiB "
            f"({self.config.snapshot_max_source}). Nothing was written, evicted or spilled and the session runs "
            "on: free space in the session, or raise DRUMS_SNAPSHOT_MAX", reason=Reason.SNAPSHOT_TOO_LARGE,
            detail=detail)

    def make_room(self, need: int, for_id: str, parts: dict | None = None, session: str | None = None) -> list[dict]:
        """Room for a checkpoint ``for_id`` of about ``need`` bytes: evict, spill, or raise STORE_FULL
        (Unavailable; nothing moved), or SNAPSHOT_TOO_LARGE above the per-checkpoint cap (see
        :meth:`check_size`). The room stays reserved until :meth:`release`. ``session``: the session
        checkpointed, whose own pinned snapshots are spilled before others'."""
        self.check_size(need, for_id, parts)
        with self._room:
            plan, facts = self._plan(need, protect={for_id}, hard=True, session=session)
            actions = self._apply(plan, facts, for_id)
            with self._lock:
                self._reserved[for_id] = need
                self._actions.setdefault(for_id, []).extend(actions)
        return actions

    def settle(self, protect: set[str] | str = (), session: str | None = None) -> list[dict]:
        """After a checkpoint committed: back under budget, as far as unused snapshots allow (``session``'s
        own pinned snapshots spilled first, as in :meth:`make_room`)."""
        protect = {protect} if isinstance(protect, str) else set(protect)
        with self._room:
            plan, facts = self._plan(0, protect=protect, hard=False, session=session)
            actions = self._apply(plan, facts, next(iter(protect), None))
            if facts["used"] - sum(it.size for _, it in plan) > self.config.budget:
                log.warning("the snapshot store stays over its budget: %.0f of %.0f MiB, and nothing more can "
                            "be evicted or spilled", facts["used"] / MiB, self.config.budget / MiB)
        return actions

    def release(self, for_id: str) -> list[dict]:
        """The checkpoint ``for_id`` is over: drop its reservation; returns what was moved for it."""
        with self._lock:
            self._reserved.pop(for_id, None)
            return self._actions.pop(for_id, [])

    def _apply(self, plan: list[tuple[str, _Item]], facts: dict, for_id: str | None) -> list[dict]:
        why = ("tmpfs" if facts["need"] + MARGIN > facts["tmpfs_free"] else
               "budget" if facts["used"] + facts["need"] > facts["budget"] else "memory")
        done = []
        for action, it in plan:
            entry = {"time": time.time(), "action": "evicted" if action == "evict" else "spilled",
                     "id": it.snap.id, "name": it.snap.name, "scope": it.snap.scope,
                     "retention": it.snap.retention, "size": it.size, "last_used": it.last_used,
                     "why": why, "for": for_id}
            if (self._evict if action == "evict" else self._spill)(it.snap, entry):
                done.append(entry)
        return done

    def _evict(self, snap: Snapshot, entry: dict) -> bool:
        """Retire (one rename, under the lock, only while unused), record, then delete the files."""
        faults.hit("evict-before-retire")
        with self._lock:
            layers, ids = self.in_use()
            if self._holds.get(snap.id) or snap.id in ids or str(self.store.path(snap.id) / "layer") in layers \
                    or self.store.users_of(snap.id) or not (self.store.path(snap.id) / MANIFEST).exists():
                return False  # taken meanwhile: the plan's other moves may still do
            retired = self.store.retire(snap.id)
            self._gone[snap.id] = entry
            self._record(entry)
        faults.hit("evict-retired")
        self.store.purge(retired)
        return True

    def _spill(self, snap: Snapshot, entry: dict) -> bool:
        def swap_if_unused(swap: Callable[[], None]) -> bool:
            with self._lock:
                layers, ids = self.in_use()
                if self._holds.get(snap.id) or snap.id in ids or str(self.store.path(snap.id) / "layer") in layers:
                    return False
                swap()
                self._record(entry)
                return True

        try:
            return self.store.spill(snap.id, swap_if_unused)
        except OSError as exc:
            log.error("spilling snapshot %s to %s failed (it stays in memory, and is not tried again): %s", snap.id,
                      self.config.spill_root, exc)
            with self._lock:
                self._unspillable[snap.id] = (time.monotonic(), str(exc)[-300:])
            return False

    def _spill_failed(self, sid: str) -> str | None:
        """Why spilling ``sid`` failed less than SPILL_RETRY s ago (None: it may be tried)."""
        failed = self._unspillable.get(sid)
        if failed is None or time.monotonic() - failed[0] > SPILL_RETRY:
            return None
        return failed[1]

    # ------------------------------------------------------------------ by hand
    def spill_now(self, sid: str) -> dict:
        """Spill one snapshot to disk now (an operator's choice). FailedPrecondition when spilling is off,
        when it is in use or not committed; returns the journal entry (``action`` ``spilled``, or
        ``already on disk``)."""
        with self._room:
            items = self._items()
            it = items.get(sid)
            if it is None:
                raise self.evicted_error(sid) or NotFound(f"no snapshot {sid!r}", reason=Reason.SNAPSHOT_NOT_FOUND)
            entry = {"time": time.time(), "action": "spilled", "id": sid, "name": it.snap.name,
                     "scope": it.snap.scope, "retention": it.snap.retention, "size": it.size,
                     "last_used": it.last_used, "why": "by hand", "for": None}
            if it.spilled:
                return {**entry, "action": "already on disk"}
            if self.config.spill_root is None:
                raise FailedPrecondition("spilling is off (DRUMS_SPILL_DIR=off)", reason=Reason.SPILL_DISABLED)
            layers, ids = self.in_use()
            why = self._blocked(it, layers, ids) or (None if it.snap.state == "committed" else it.snap.state)
            if why is not None:
                raise FailedPrecondition(f"snapshot {sid} cannot be spilled now: {why}", reason=Reason.SNAPSHOT_IN_USE)
            if not self._spill(it.snap, entry):
                raise FailedPrecondition(f"snapshot {sid} could not be spilled (in use meanwhile, or the copy "
                                         "failed: see the daemon's log)", reason=Reason.SPILL_FAILED)
            return entry

    # ------------------------------------------------------------------ deletes by hand
    def delete(self, sid: str) -> None:
        """Delete a snapshot nothing uses (FailedPrecondition SNAPSHOT_IN_USE otherwise)."""
        with self._lock:
            layers, ids = self.in_use()
            sessions = ["(a session)"] if sid in ids or str(self.store.path(sid) / "layer") in layers else []
            if self._holds.get(sid):
                raise FailedPrecondition(f"snapshot {sid} is being restored or checkpointed",
                                         reason=Reason.SNAPSHOT_IN_USE)
            snap = self.store.get(sid, committed_only=False)
            children = self.store.users_of(sid)
            if children or sessions:
                raise FailedPrecondition(f"snapshot {sid} is in use by snapshots {children} and sessions",
                                         reason=Reason.SNAPSHOT_IN_USE)
            retired = self.store.retire(snap.id)
        self.store.purge(retired)

    # ------------------------------------------------------------------ reports
    def _record(self, entry: dict) -> None:
        self.counts[entry["action"]] += 1
        log.warning("%s snapshot %s (%s, %s, %.0f MiB, last used %.0f s ago) to make room (%s) for %s",
                    entry["action"], entry["id"], entry["name"] or "unnamed", entry["retention"],
                    entry["size"] / MiB, entry["time"] - entry["last_used"], entry["why"], entry["for"] or "-")
        try:
            with open(self.journal, "a") as f:
                f.write(json.dumps(entry) + "\n")
        except OSError as exc:
            log.error("could not append to the store journal %s: %s", self.journal, exc)

    def _load_journal(self) -> None:
        try:
            lines = self.journal.read_text().splitlines()
        except FileNotFoundError:
            return
        if len(lines) > JOURNAL_KEEP:
            lines = lines[-JOURNAL_KEEP:]
            tmp = self.journal.with_name(self.journal.name + ".tmp")
            tmp.write_text("".join(line + "\n" for line in lines))
            os.replace(tmp, self.journal)
        for line in lines:
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if entry.get("action") == "evicted":
                self._gone[entry["id"]] = entry

    def recent(self, n: int = 20) -> list[dict]:
        try:
            lines = self.journal.read_text().splitlines()[-n:]
        except FileNotFoundError:
            return []
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def describe(self) -> list[dict]:
        """The store's listing with what the budget knows of each: location, last use, who holds it."""
        items = self._items()
        layers, ids = self.in_use()
        out = []
        for it in sorted(items.values(), key=lambda it: it.snap.created):
            d = it.snap.to_dict()
            d.update(location="disk" if it.spilled else "memory", last_used=it.last_used,
                     children=sorted(it.children), in_use=self._blocked(it, layers, ids))
            out.append(d)
        return out

    def status(self) -> dict:
        items = self._items()
        size, free = _fs(self.store.root)
        cfg = self.config
        journal = self.recent(JOURNAL_KEEP)
        return {
            "budget": cfg.budget, "budget_source": cfg.source,
            "used": self._memory_used(items), "reserved": sum(self._reserved.values()),
            "on_disk": sum(it.size for it in items.values() if it.spilled),
            "snapshots": len(items), "spilled": sum(it.spilled for it in items.values()),
            "cache": sum(it.snap.retention == "cache" for it in items.values()),
            "pinned": sum(it.snap.retention != "cache" for it in items.values()),
            "tmpfs_size": size, "tmpfs_free": free, "mem_available": mem_available(),
            "mem_floor": cfg.mem_floor, "spill_dir": str(cfg.spill_root) if cfg.spill_root else None,
            "evicted": sum(e.get("action") == "evicted" for e in journal),
            "spilled_total": sum(e.get("action") == "spilled" for e in journal),
            "store_full": self.counts["store_full"], "too_large": self.counts["too_large"],
            "snapshot_max": cfg.snapshot_max, "snapshot_max_source": cfg.snapshot_max_source,
            "recent": journal[-10:],
        }
