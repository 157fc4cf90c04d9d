"""Who owns which Drums session or private snapshot, and reclaiming them when the owner dies.

Sessions do not die with the process that asked for them (the daemon owns them). A
``DesktopEnv`` killed with SIGKILL never calls ``close()``, so every session and private snapshot
a provider holds is *leased* to its process: a small JSON file under
``<instance state dir>/osworld/leases/`` naming the owner (pid and start time) and the resource.

* A **watchdog** (``python -m drums_osworld.provider.leases``, one per owning process, in a
  session of its own) waits on a pidfd of its owner. When the owner dies it destroys the owner's
  leased sessions, deletes its private snapshots and removes the leases, then exits. A clean
  ``close()`` of the last provider of a process tells it to exit (``bye``).
* :func:`reap_orphans` does the same for every lease whose owner is dead, whoever left it (a
  watchdog that was itself killed). Providers run it once per process on first use;
  ``python -m drums_osworld.provider.leases --reap`` runs it by hand.

A lease is written right after the daemon returns the session, so a process killed while its
restore is in flight can leave that one session unleased (see the report on daemon-side leases).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

from drums_core.client import Client
from drums_core.config import Instance
from drums_core.errors import DrumsError, FailedPrecondition, NotFound

log = logging.getLogger("drums.osworld.leases")

_lock = threading.RLock()
_watchdog: dict = {"pid": None, "proc": None}


def proc_starttime(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def owner_alive(data: dict) -> bool | None:
    """Whether a lease's owner lives; None when it is not ours to judge (another pid namespace)."""
    if data.get("pidns", "") != pid_namespace():
        return None
    return proc_starttime(int(data.get("owner_pid", 0))) == data.get("owner_start")


def lease_dir(client: Client) -> Path:
    d = client.instance.state_dir / "osworld" / "leases"
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    return d


def _lease_path(client: Client, kind: str, key: str, holder: str) -> Path:
    return lease_dir(client) / f"{os.getpid()}-{kind}-{key}-{holder}.json"


def hold(client: Client, kind: str, key: str, holder: str) -> Path:
    """Lease ``key`` (a session or snapshot id) to this process; starts the watchdog if needed."""
    me = os.getpid()
    data = {"owner_pid": me, "owner_start": proc_starttime(me), "pidns": pid_namespace(), "kind": kind,
            "key": key, "holder": holder, "created": time.time()}
    path = _lease_path(client, kind, key, holder)
    tmp = path.with_name("." + path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)
    ensure_watchdog(client)
    return path


def release(client: Client, kind: str, key: str, holder: str) -> None:
    _lease_path(client, kind, key, holder).unlink(missing_ok=True)


def held_by_me(client: Client) -> list[Path]:
    prefix = f"{os.getpid()}-"
    return [p for p in lease_dir(client).iterdir() if p.name.startswith(prefix) and p.suffix == ".json"]


def other_holders(client: Client, kind: str, key: str, holder: str) -> list[Path]:
    mine = _lease_path(client, kind, key, holder).name
    return [p for p in lease_dir(client).iterdir()
            if p.name != mine and p.suffix == ".json" and f"-{kind}-{key}-" in p.name]


# ------------------------------------------------------------------------------------ watchdog
def ensure_watchdog(client: Client) -> None:
    """Start this process's watchdog unless it runs (a forked child gets its own)."""
    with _lock:
        proc = _watchdog["proc"]
        if _watchdog["pid"] == os.getpid() and proc is not None and proc.poll() is None:
            return
        inst = client.instance
        pkg_parent = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = pkg_parent + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        log_path = lease_dir(client).parent / "watchdog.log"
        with open(log_path, "ab") as errlog:
            proc = subprocess.Popen(
                [sys.executable, "-m", "drums_osworld.provider.leases", "--watch", str(os.getpid()),
                 "--instance", inst.name, "--slot-base", str(inst.slot_base), "--slot-count", str(inst.slot_count),
                 "--state-root", str(inst.state_root)],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=errlog, env=env, cwd="/",
                start_new_session=True, close_fds=True)
        _watchdog.update(pid=os.getpid(), proc=proc)


def stop_watchdog_if_idle(client: Client) -> None:
    """Tell this process's watchdog to exit when this process holds no lease any more."""
    with _lock:
        proc = _watchdog["proc"]
        if _watchdog["pid"] != os.getpid() or proc is None:
            return
        if held_by_me(client):
            return
        try:
            proc.stdin.write(b"bye\n")
            proc.stdin.close()
        except (BrokenPipeError, ValueError):
            pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        _watchdog.update(pid=None, proc=None)


def _leases_of(ldir: Path, pid: int | None) -> list[tuple[Path, dict]]:
    out = []
    for p in sorted(ldir.iterdir()) if ldir.exists() else []:
        if p.suffix != ".json" or p.name.startswith("."):
            continue
        try:
            data = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if pid is None or data.get("owner_pid") == pid:
            out.append((p, data))
    return out


def reclaim(client: Client, leases: list[tuple[Path, dict]]) -> dict:
    """Destroy the leased sessions, then delete the leased snapshots (newest first)."""
    report = {"sessions": [], "snapshots": [], "kept": []}
    for path, data in leases:
        if data.get("kind") != "session":
            continue
        try:
            client.destroy(data["key"])
            report["sessions"].append(data["key"])
        except NotFound:
            pass
        except DrumsError as exc:
            log.warning("could not destroy leased session %s: %s", data["key"], exc)
            report["kept"].append(path.name)
            continue
        path.unlink(missing_ok=True)
    snaps = sorted((x for x in leases if x[1].get("kind") == "snapshot"), key=lambda x: -x[1].get("created", 0))
    for path, data in snaps:
        if any(p != path and d.get("key") == data["key"] for p, d in _leases_of(path.parent, None)):
            path.unlink(missing_ok=True)  # another holder has it, and deletes it last
            continue
        try:
            client.delete_snapshot(data["key"])
            report["snapshots"].append(data["key"])
        except NotFound:
            pass
        except FailedPrecondition:  # still in use by a live session or a child snapshot
            report["kept"].append(path.name)
            continue
        except DrumsError as exc:
            log.warning("could not delete leased snapshot %s: %s", data["key"], exc)
            report["kept"].append(path.name)
            continue
        path.unlink(missing_ok=True)
    return report


def reap_orphans(client: Client | None = None) -> dict:
    """Reclaim everything leased to processes that are dead (their watchdog did not, or died too)."""
    from .images import connect

    client = connect(client)
    ldir = lease_dir(client)
    dead = [(p, d) for p, d in _leases_of(ldir, None) if owner_alive(d) is False]
    if not dead:
        return {"sessions": [], "snapshots": [], "kept": []}
    return reclaim(client, dead)


def _watch(owner: int, client: Client) -> int:
    start = proc_starttime(owner)
    ldir = lease_dir(client)
    try:
        pidfd = os.pidfd_open(owner)
    except ProcessLookupError:
        pidfd = None
    if pidfd is not None and start is not None:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        poller.register(sys.stdin.fileno(), select.POLLIN | select.POLLHUP)
        buf = b""
        while True:
            events = dict(poller.poll())
            if pidfd in events:
                break  # the owner died
            if sys.stdin.fileno() in events:
                chunk = os.read(sys.stdin.fileno(), 4096)
                buf += chunk
                if b"bye" in buf:
                    return 0
                if not chunk:  # EOF without bye: the owner is exiting (or gone)
                    poller.unregister(sys.stdin.fileno())
                    if not poller.poll(5000):
                        return 0  # the owner closed its pipe and lives on: nothing to do
                    break
    leases = [(p, d) for p, d in _leases_of(ldir, owner) if d.get("owner_start") in (start, None) or start is None]
    report = reclaim(client, leases)
    log.info("owner %d died: reclaimed %s", owner, report)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="drums_osworld.provider.leases")
    parser.add_argument("--watch", type=int, help="the owner pid to watch")
    parser.add_argument("--reap", action="store_true", help="reclaim the leases of dead owners and exit")
    parser.add_argument("--instance")
    parser.add_argument("--slot-base", type=int)
    parser.add_argument("--slot-count", type=int)
    parser.add_argument("--state-root")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s")
    if args.instance:
        kw = {"name": args.instance, "slot_base": args.slot_base, "slot_count": args.slot_count}
        if args.state_root:
            kw["state_root"] = Path(args.state_root)
        client = Client(Instance(**kw), autostart=False)
    else:
        client = Client(autostart=False)
    if args.reap:
        print(json.dumps(reap_orphans(client)))
        return 0
    if args.watch:
        return _watch(args.watch, client)
    parser.error("one of --watch or --reap is needed")
    return 2


if __name__ == "__main__":
    sys.exit(main())
