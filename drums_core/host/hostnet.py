"""Host settings that ``nat`` sessions need, shared by every Drums run on the host and put back by the last.

One setting so far: IPv4 forwarding on the upstream interface (``net.ipv4.conf.<upstream>.forwarding``),
without which the replies to a session's connections are not routed back to it. (The session
link's own flag, ``conf.dvh<slot>.forwarding``, goes away with the link; the host-wide
``ip_forward`` is never touched.) Several runs, of several instances, may use one upstream at once,
so the value to put back is kept once per host:

* ledger entry, in every run that holds the setting: kind ``hostnet``, key ``forwarding/<ifname>``,
  data ``ifname``, ``ifindex``, ``path`` (the sysctl file), ``record`` (the shared record);
* shared record ``<STATE_ROOT>/.hostnet/forwarding-<ifname>.json``: ``ifname``, ``ifindex``,
  ``prior`` (the value before Drums changed it), ``holders`` (``{run: ledger root}``);
* ``<STATE_ROOT>/.hostnet/lock`` (flock) serialises every acquire and release on the host.

:func:`acquire` (a run's first ``nat`` session on the upstream): under the lock, the ledger entry
first, then the record (``prior`` is the value found, unless a record for the same interface
exists: then its ``prior`` stands) naming this run as a holder, then ``on_change`` (the run puts its
guard in its nftables table), then the setting is written. :func:`release` (the run's last ``nat``
session on it went, or the sweep of a dead run): under the lock, the run leaves the holders, and
holders whose ledger no longer has their entry are dropped; when none is left, ``prior`` is
written back (if the interface is still the recorded one) and the record removed; the ledger
entry is forgotten last. A crash anywhere leaves an entry whose release finishes the job.

Fault windows (``DRUMS_FAULT_AT``): ``nat-hold-recorded``, ``nat-hold-applied``,
``nat-release-before-restore``, ``nat-release-restored``.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..session import faults
from ..errors import Internal
from ..reasons import Reason
from ..sweep.ledger import Ledger, write_atomic

log = logging.getLogger("drums.hostnet")

KIND = "hostnet"
ON = "1"


def hostnet_dir() -> Path:
    from ..config import STATE_ROOT

    return STATE_ROOT / ".hostnet"


def key_for(ifname: str) -> str:
    return f"forwarding/{ifname}"


def sysctl_path(ifname: str) -> str:
    from ..session.netpolicy import check_ifname

    return f"/proc/sys/net/ipv4/conf/{check_ifname(ifname)}/forwarding"


def record_path(ifname: str) -> Path:
    return hostnet_dir() / f"forwarding-{ifname}.json"


def ifindex(ifname: str) -> int | None:
    """The interface's index in this process's network namespace (by netlink: ``/sys`` shows the
    namespace it was mounted in), or None."""
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        idx = ipr.link_lookup(ifname=ifname)
    return idx[0] if idx else None


def read_setting(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _write_setting(path: str, value: str) -> None:
    try:
        with open(path, "w") as f:
            f.write(value)
    except OSError as exc:
        raise Internal(f"cannot write {path}: {exc}", reason=Reason.SYSCTL_FAILED, detail={"errno": exc.errno}) from exc


@contextlib.contextmanager
def host_lock() -> Iterator[None]:
    d = hostnet_dir()
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(d / "lock", os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def read_record(ifname: str) -> dict | None:
    try:
        rec = json.loads(record_path(ifname).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise Internal(f"shared record {record_path(ifname)} is unreadable: {exc}",
                       reason=Reason.HOSTNET_CORRUPT) from exc
    if not isinstance(rec, dict) or not isinstance(rec.get("holders"), dict):
        raise Internal(f"shared record {record_path(ifname)} is malformed", reason=Reason.HOSTNET_CORRUPT)
    return rec


def _write_record(ifname: str, rec: dict) -> None:
    write_atomic(hostnet_dir(), record_path(ifname).name, json.dumps(rec, sort_keys=True).encode())


@dataclass
class Hold:
    """What :func:`acquire` found: whether Drums (this run or another) turned the setting on."""

    ifname: str
    prior: str
    changed_by_drums: bool


def acquire(ledger: Ledger, ifname: str, on_change: Callable[[], None] | None = None) -> Hold:
    """Hold forwarding on ``ifname`` for ``ledger``'s run (see the module docstring). ``on_change`` runs
    before the setting is written when Drums is the one that turns it on (the run's guard)."""
    path, key = sysctl_path(ifname), key_for(ifname)
    with host_lock():
        idx = ifindex(ifname)
        ledger.record(KIND, key, ifname=ifname, ifindex=idx, path=path, record=str(record_path(ifname)))
        faults.hit("nat-hold-recorded")
        rec = read_record(ifname)
        now = read_setting(path)
        if now is None:
            raise Internal(f"cannot read {path}", reason=Reason.SYSCTL_FAILED)
        if rec is None or rec.get("ifindex") != idx:
            rec = {"ifname": ifname, "ifindex": idx, "prior": now, "holders": (rec or {}).get("holders", {}),
                   "created": time.time()}
        rec["holders"][ledger.run] = str(ledger.root)
        _write_record(ifname, rec)
        changed = rec["prior"] != ON
        if changed and on_change is not None:
            on_change()
        if now != ON:
            _write_setting(path, ON)
            log.info("forwarding on %s turned on for run %s (was %s)", ifname, ledger.run, now)
        faults.hit("nat-hold-applied")
        return Hold(ifname, rec["prior"], changed)


def _holds(run: str, root: str, key: str) -> bool:
    try:
        return Ledger(root, run).get(KIND, key) is not None
    except Exception:  # noqa: BLE001 - an unreadable ledger counts as holding: never put back under it
        return True


def release(ledger: Ledger, ifname: str, on_released: Callable[[], None] | None = None) -> str:
    """Let go of ``ledger``'s run's hold on ``ifname``; the last holder puts the prior value back.

    Returns what happened: ``restored``, ``kept`` (other runs hold it), ``unchanged`` (Drums had
    not changed it, or the interface is not the recorded one any more)."""
    path, key = sysctl_path(ifname), key_for(ifname)
    with host_lock():
        rec = read_record(ifname)
        outcome = "unchanged"
        if rec is not None:
            holders = {r: root for r, root in rec["holders"].items()
                       if r != ledger.run and _holds(r, root, key)}
            if holders:
                rec["holders"] = holders
                _write_record(ifname, rec)
                outcome = "kept"
            else:
                faults.hit("nat-release-before-restore")
                if ifindex(ifname) == rec.get("ifindex") and read_setting(path) != rec["prior"]:
                    _write_setting(path, str(rec["prior"]))
                    outcome = "restored"
                    log.info("forwarding on %s put back to %s by run %s", ifname, rec["prior"], ledger.run)
                with contextlib.suppress(FileNotFoundError):
                    record_path(ifname).unlink()
        if on_released is not None:
            on_released()
        faults.hit("nat-release-restored")
        ledger.forget(KIND, key)
        return outcome


def held_records() -> list[dict]:
    """Every shared record on this host (for leak checks): ``ifname``, ``prior``, ``holders``, ``now``."""
    out = []
    try:
        names = sorted(os.listdir(hostnet_dir()))
    except OSError:
        return out
    for n in names:
        if not (n.startswith("forwarding-") and n.endswith(".json")):
            continue
        try:
            rec = json.loads((hostnet_dir() / n).read_text())
        except (OSError, ValueError):
            out.append({"file": n, "unreadable": True})
            continue
        ifname = rec.get("ifname", "")
        rec["now"] = read_setting(f"/proc/sys/net/ipv4/conf/{ifname}/forwarding") if ifname else None
        out.append(rec)
    return out


# ------------------------------------------------------------------------------------ the sweep
def parse_entry(key: str, data: dict) -> str:
    """The interface a ``hostnet`` ledger entry holds; ValueError for data the sweep must not act on."""
    from ..errors import InvalidArgument
    from ..session.netpolicy import check_ifname

    ifname = data.get("ifname")
    try:
        check_ifname(ifname)
    except InvalidArgument as exc:
        raise ValueError(f"hostnet entry {key!r}: {exc.message}") from None
    if key != key_for(ifname) or data.get("path") not in (None, sysctl_path(ifname)):
        raise ValueError(f"hostnet entry {key!r} does not name forwarding on {ifname!r}")
    return ifname


def sweep_release(ledger: Ledger, ifname: str, report, *, dry_run: bool) -> bool:
    """Step 4b of :mod:`drums_core.sweep.run` for one entry of a dead run; True once it is released."""
    if dry_run:
        rec = read_record(ifname) if record_path(ifname).exists() else None
        report.notes.append(f"would release forwarding on {ifname}"
                            + (f" (prior {rec.get('prior')})" if rec else ""))
        return False
    try:
        outcome = release(ledger, ifname)
    except Internal as exc:
        report.errors.append(f"hostnet {ifname}: {exc.message}")
        return False
    report.hostnet_released += 1
    report.notes.append(f"forwarding on {ifname}: {outcome}")
    return True
