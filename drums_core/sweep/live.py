"""Who is alive when a sweep starts, and what they claim: the live runs of this ledger root and of
every other Drums instance on the host (their tags, recorded processes, paths, links and nft
tables), which the sweep never touches."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from .ledger import Entry, Ledger, LedgerCorrupt
from .parts import claims_of, int_or_none


@dataclass
class Live:
    runs: dict[str, dict] = field(default_factory=dict)
    tags: set[str] = field(default_factory=set)
    proc_keys: set[tuple[int, int]] = field(default_factory=set)
    paths: set[str] = field(default_factory=set)
    links: set[str] = field(default_factory=set)
    tables: set[tuple[str, str]] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)


def sweeps_own(e: Entry) -> bool:
    """Entries a sweep wrote itself (derived CRIU dirs, survivors, unmounted-mount memory)."""
    return ((e.kind == "op" and e.key.startswith("sweep/")) or (e.kind == "dir" and "derived_from" in e.data)
            or (e.kind == "process" and e.key.startswith("survivor/")))


def with_claims(live: Live, entries: Iterable[Entry]) -> Live:
    """``live`` plus what ``entries`` claim (the entries a selective sweep must leave alone)."""
    out = Live(runs=dict(live.runs), tags=set(live.tags), proc_keys=set(live.proc_keys), paths=set(live.paths),
                links=set(live.links), tables=set(live.tables), errors=list(live.errors))
    add_claims(out, entries)
    return out


def add_claims(live: Live, entries: Iterable[Entry]) -> None:
    for e in entries:
        d = e.data
        if e.kind == "process" and int_or_none(d.get("pid")) and int_or_none(d.get("starttime")):
            live.proc_keys.add((d["pid"], d["starttime"]))
        if e.kind == "session" and int_or_none(d.get("init_pid")) and int_or_none(d.get("starttime")):
            live.proc_keys.add((d["init_pid"], d["starttime"]))
        paths, links, tables = claims_of(e)
        live.paths |= paths
        live.links |= links
        live.tables |= tables


def other_instances(root: Path) -> list[tuple[Path, str]]:
    """(ledger root, run) of every other Drums instance on this host.

    A restored process keeps the tag of the run that made its checkpoint, which may belong to
    another instance (a snapshot shipped between daemons): a live run anywhere on the host must be
    protected from this sweep, not only the runs under ``root``.
    """
    from ..config import STATE_ROOT

    out: list[tuple[Path, str]] = []
    try:
        states = [p for p in STATE_ROOT.iterdir() if p.is_dir()]
    except OSError:
        return out
    for state in states:
        other = state / "ledger"
        try:
            if other.resolve() == root.resolve() or not other.is_dir():
                continue
            out.extend((other, r) for r in Ledger.runs(other))
        except OSError:
            continue
    return out


def live_context(root: Path, runs: Iterable[str]) -> Live:
    live = Live()
    own = [(root, r, True) for r in runs]
    # Another instance's live run is protected by what it recorded (pids, paths, links), not by its
    # tag: a session this run restored from that instance's snapshot carries that tag yet is ours.
    others = [(r_root, r, False) for r_root, r in other_instances(root)]
    for run_root, run, same_root in own + others:
        led = Ledger(run_root, run)
        try:
            rec = led.owner()
            alive = led.owner_status() == "alive"
        except LedgerCorrupt as exc:
            # Unknown owner: protect its tag as if it were alive; its entries cannot be read.
            if same_root:
                live.tags.add(led.tag)
            live.errors.append(f"run {run}: {exc.message}")
            continue
        if not alive:
            continue
        live.runs[run] = rec or {}
        if same_root:
            live.tags.add(led.tag)
        live.proc_keys.add((rec["pid"], rec["starttime"]))
        try:
            entries = led.entries()
        except LedgerCorrupt as exc:
            live.errors.append(f"live run {run}: {exc.message}")
            continue
        add_claims(live, entries)
    return live
