"""The ownership ledger: write-ahead records of every host resource a daemon run creates.

One directory per daemon run, ``<root>/<run>/``::

    owner.json                      pid, start time and boot id of the daemon that owns the run
    <kind>.<encoded key>.json       one entry: {"v", "kind", "key", "created", "updated", "data"}
    .tmp.*                          a write in progress (or torn by a crash): never read as an entry

Contract (what the sweep relies on):

- :meth:`Ledger.record` is called *before* the resource is created; :meth:`Ledger.forget` only
  *after* it is gone. So a crash at any point leaves at most entries for resources that may not
  exist, never a resource without an entry.
- Every write is atomic: temp file, fsync, rename, fsync of the directory. A reader sees the old
  entry or the new one, never a torn one. Temp files are ignored by readers.
- A file that is not a valid entry (bad JSON, key or kind not matching its name, an unknown file)
  raises :class:`LedgerCorrupt`; the sweep then fails closed for that run and deletes nothing of it.
- Keys are free strings (mount paths with ``/``, names with ``..``): file names encode them
  (urlsafe base64, or ``h`` + sha256 when long) and the key itself is stored inside the entry.

Kinds and their data (what the sweep does with each; see :mod:`drums_core.sweep.run`):

==========  ==================================================  =================================
kind        key / data                                          swept as
==========  ==================================================  =================================
process     any key; ``pid``, ``starttime``, ``tag``?           SIGKILL if pid+starttime match
session     session id; ``root``, ``dir``, ``slot``,            its init (pid+starttime), its root
            ``ifname``, ``init_pid``, ``starttime``, ``state``  mount, its dir, its link
mount       mount point (or ``path``)                           unmount it and everything under it
link        host ifname (or ``ifname``), ``ifindex``?           delete (names must start ``dvh``)
nft         any key; ``family`` (default inet), ``name``        ``nft delete table`` (``drums*``)
x11link     symlink path (or ``path``), ``target``?             unlink if still a symlink (to it)
dir         directory (or ``path``)                             unmount under it, then retire it
op          operation id; free data                             forgotten once the run is clean
snapshot    snapshot id; ``dir``                                retired unless committed
cgroup      ``drums/<run>/<session>`` (run = this run);         SIGKILL its members (frozen),
            ``paths`` (every controller dir, absolute),         rmdir each dir, then an empty
            ``driver`` (``v1``/``v2``), ``session``             ``drums/<run>``
hostnet     ``forwarding/<ifname>``; ``ifname``, ``ifindex``,   the run leaves the shared record's
            ``path`` (sysctl file), ``record`` (shared record)  holders; the last one puts the
                                                                prior value back (drums_core.host.hostnet)
==========  ==================================================  =================================
"""
from __future__ import annotations

import base64
import binascii
import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..host import procs
from ..errors import Busy, FailedPrecondition, Internal, InvalidArgument, NotFound
from ..reasons import Reason

OWNER = "owner.json"
TMP_PREFIX = ".tmp."
RUN_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
_ENTRY_RE = re.compile(r"^(?P<kind>[a-z0-9]+)\.(?P<enc>[bh][A-Za-z0-9_-]*)\.json$")
_MAX_B64 = 200
FORMAT = 1


class LedgerCorrupt(Internal):
    """A ledger file could not be read as an entry. The run must not be swept (fail closed).

    ``path`` names the offending file. Nothing was changed.
    """

    default_reason = Reason.LEDGER_CORRUPT

    def __init__(self, message: str, *, path: str | os.PathLike | None = None) -> None:
        super().__init__(message, reason=Reason.LEDGER_CORRUPT, detail=str(path) if path else None)
        self.path = str(path) if path else None


@dataclass
class Entry:
    kind: str
    key: str
    data: dict = field(default_factory=dict)
    created: float = 0.0


def check_run(run: str) -> str:
    if not isinstance(run, str) or not RUN_RE.match(run) or ".." in run:
        raise InvalidArgument(f"invalid run id {run!r}: letters, digits, '_', '.', ':', '-'",
                              reason=Reason.INVALID_NAME)
    return run


def encode_key(key: str) -> str:
    """File-name-safe, reversible (or hashed, when long) form of ``key``."""
    raw = key.encode("utf-8")
    b64 = base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")
    if len(b64) <= _MAX_B64:
        return "b" + b64
    return "h" + hashlib.sha256(raw).hexdigest()


def decode_key(enc: str) -> str | None:
    """The key of a ``b`` encoding; None for hashed ones (their key is only inside the file)."""
    if not enc.startswith("b"):
        return None
    body = enc[1:]
    try:
        return base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None


def entry_filename(kind: str, key: str) -> str:
    return f"{kind}.{encode_key(key)}.json"


def _json_default(obj: Any) -> Any:
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    raise TypeError(f"ledger data must be JSON: {type(obj).__name__} is not")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(directory: Path, name: str, payload: bytes) -> None:
    """Write ``directory/name`` so that readers see the old file or the whole new one."""
    tmp = directory / f"{TMP_PREFIX}{name}.{os.getpid()}.{threading.get_ident()}.{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        try:
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, directory / name)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(directory)


def _check_kind(kind: str) -> str:
    if kind not in Ledger.KINDS:
        raise InvalidArgument(f"unknown ledger kind {kind!r}", reason=Reason.INVALID_ARGUMENT)
    return kind


def _check_key(key: str | os.PathLike) -> str:
    if isinstance(key, os.PathLike):
        key = os.fspath(key)
    if not isinstance(key, str) or not key or "\0" in key:
        raise InvalidArgument(f"invalid ledger key {key!r}", reason=Reason.INVALID_ARGUMENT)
    try:
        key.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidArgument(f"ledger key {key!r} is not UTF-8", reason=Reason.INVALID_ARGUMENT) from exc
    return key


class Ledger:
    """One daemon run's ledger directory, ``root/run``.

    ``Ledger(root, run)`` only names it; :meth:`create` makes and claims it, :meth:`open` opens
    an existing one without claiming it. Methods are thread-safe within a process. Errors:
    :class:`InvalidArgument` for a bad run, kind or key (nothing written), :class:`NotFound`
    when the run's directory is gone, :class:`LedgerCorrupt` when a file cannot be read as an
    entry, ``OSError`` when the filesystem refuses a write (the entry is then unchanged).
    """

    KINDS = ("session", "process", "mount", "link", "nft", "x11link", "dir", "op", "snapshot", "cgroup",
             "hostnet")

    def __init__(self, root: Path | str, run: str) -> None:
        self.root = Path(root)
        self.run = check_run(run)
        self.path = self.root / run
        self._lock = threading.RLock()
        self._flock_fd: int | None = None

    def __repr__(self) -> str:
        return f"Ledger({str(self.root)!r}, {self.run!r})"

    @property
    def tag(self) -> str:
        """The argv tag of this run's processes: ``drums:<run>``."""
        return procs.run_tag(self.run)

    # ------------------------------------------------------------------ lifecycle
    @classmethod
    def create(cls, root: Path | str, run: str, *, pid: int | None = None) -> Ledger:
        """Make ``root/run`` owned by ``pid`` (default: this process). FailedPrecondition if it exists.

        The directory appears whole (made under a temp name with its owner.json, then renamed),
        so a concurrent sweep never sees a run without an owner.
        """
        led = cls(root, run)
        led.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        if os.path.lexists(led.path):
            raise FailedPrecondition(f"ledger run {run!r} already exists in {led.root}", reason=Reason.RUN_EXISTS)
        tmp = led.root / f"{TMP_PREFIX}{run}.{secrets.token_hex(6)}"
        tmp.mkdir(mode=0o700)
        try:
            write_atomic(tmp, OWNER, json.dumps(_owner_record(run, pid), sort_keys=True).encode())
            if os.path.lexists(led.path):
                raise FailedPrecondition(f"ledger run {run!r} already exists in {led.root}", reason=Reason.RUN_EXISTS)
            os.rename(tmp, led.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp / OWNER)
            with contextlib.suppress(OSError):
                os.rmdir(tmp)
            raise
        _fsync_dir(led.root)
        return led

    @classmethod
    def open(cls, root: Path | str, run: str) -> Ledger:
        """Open an existing run's ledger without claiming it. NotFound if it does not exist."""
        led = cls(root, run)
        if not led.path.is_dir():
            raise NotFound(f"no ledger for run {run!r} in {led.root}", reason=Reason.LEDGER_NOT_FOUND)
        return led

    @staticmethod
    def runs(root: Path | str) -> list[str]:
        """Run ids with a ledger under ``root`` (none if ``root`` does not exist)."""
        try:
            names = os.listdir(root)
        except FileNotFoundError:
            return []
        return sorted(n for n in names if RUN_RE.match(n) and ".." not in n and os.path.isdir(os.path.join(root, n)))

    def exists(self) -> bool:
        return self.path.is_dir()

    # ------------------------------------------------------------------ owner
    def owner(self) -> dict | None:
        """The owner record, or None when there is none (a ledger being removed). LedgerCorrupt if unreadable."""
        p = self.path / OWNER
        try:
            raw = p.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise LedgerCorrupt(f"cannot read {p}: {exc}", path=p) from exc
        try:
            rec = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise LedgerCorrupt(f"owner record {p} is not JSON", path=p) from exc
        if not isinstance(rec, dict) or not all(isinstance(rec.get(k), int) for k in ("pid", "starttime")):
            raise LedgerCorrupt(f"owner record {p} lacks pid/starttime", path=p)
        return rec

    def owner_status(self) -> str:
        """``alive``, ``dead`` or ``missing``. Raises LedgerCorrupt when the owner record is unreadable."""
        rec = self.owner()
        if rec is None:
            return "missing"
        boot = rec.get("boot_id")
        if boot and boot != procs.boot_id():
            return "dead"
        return "alive" if procs.is_alive(rec["pid"], rec["starttime"]) else "dead"

    def owner_alive(self) -> bool:
        """The owner pid exists with the recorded start time (same boot) and is not a zombie.

        Raises LedgerCorrupt when owner.json exists but cannot be read: callers must then treat
        the run as not sweepable.
        """
        return self.owner_status() == "alive"

    def adopt(self, pid: int | None = None) -> None:
        """Make ``pid`` (default: this process) the owner of this run, e.g. a restarted daemon.

        Takes the run's lock, so it waits for a sweep of this run to finish; NotFound if the
        sweep removed the run meanwhile.
        """
        with self._lock, self.locked():
            if not self.exists():
                raise NotFound(f"no ledger for run {self.run!r}", reason=Reason.LEDGER_NOT_FOUND)
            prev = None
            with contextlib.suppress(LedgerCorrupt):
                prev = self.owner()
            rec = _owner_record(self.run, pid)
            rec["adopted_at"] = time.time()
            if prev:
                rec["previous"] = {k: prev.get(k) for k in ("pid", "starttime", "boot_id")}
            write_atomic(self.path, OWNER, json.dumps(rec, sort_keys=True).encode())

    @contextlib.contextmanager
    def locked(self, blocking: bool = True) -> Iterator[None]:
        """Hold the run's exclusive lock (flock on its directory) against other processes and other
        Ledger objects; re-entrant for this object in this thread. Busy when ``blocking`` is False
        and someone else holds it; NotFound when the run is gone."""
        with self._lock:
            if self._flock_fd is not None:
                yield
                return
            try:
                fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except FileNotFoundError as exc:
                raise NotFound(f"no ledger for run {self.run!r}", reason=Reason.LEDGER_NOT_FOUND) from exc
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
                except BlockingIOError as exc:
                    raise Busy(f"ledger of run {self.run!r} is locked by another sweep",
                               reason=Reason.LEDGER_BUSY) from exc
                self._flock_fd = fd
                try:
                    yield
                finally:
                    self._flock_fd = None
            finally:
                os.close(fd)

    # ------------------------------------------------------------------ entries
    def record(self, kind: str, key: str, /, **data: Any) -> Entry:
        """Write-ahead: record a resource *before* creating it. Replaces the data of an existing entry
        (keeping its ``created`` time). Durable when this returns."""
        kind, key = _check_kind(kind), _check_key(key)
        with self._lock:
            self._require_dir()
            old = self._read_entry_file(self.path / entry_filename(kind, key), missing_ok=True)
            now = time.time()
            entry = Entry(kind=kind, key=key, data=dict(data), created=old.created if old else now)
            self._write(entry, now)
            return entry

    def update(self, kind: str, key: str, /, **data: Any) -> Entry:
        """Merge ``data`` into an existing entry. NotFound if there is none."""
        kind, key = _check_kind(kind), _check_key(key)
        with self._lock:
            old = self._read_entry_file(self.path / entry_filename(kind, key), missing_ok=True)
            if old is None:
                raise NotFound(f"no ledger entry {kind} {key!r} in run {self.run}",
                               reason=Reason.LEDGER_ENTRY_NOT_FOUND)
            merged = dict(old.data)
            merged.update(data)
            entry = Entry(kind=kind, key=key, data=merged, created=old.created)
            self._write(entry, time.time())
            return entry

    def forget(self, kind: str, key: str) -> None:
        """Drop an entry, only *after* its resource is gone. No error if it is absent."""
        kind, key = _check_kind(kind), _check_key(key)
        with self._lock:
            try:
                os.unlink(self.path / entry_filename(kind, key))
            except FileNotFoundError:
                return
            _fsync_dir(self.path)

    def get(self, kind: str, key: str) -> Entry | None:
        kind, key = _check_kind(kind), _check_key(key)
        return self._read_entry_file(self.path / entry_filename(kind, key), missing_ok=True)

    def entries(self, kind: str | None = None) -> list[Entry]:
        """All entries (of ``kind``), oldest first. LedgerCorrupt on any unreadable or unknown file."""
        if kind is not None:
            _check_kind(kind)
        try:
            names = sorted(os.listdir(self.path))
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise LedgerCorrupt(f"cannot list ledger {self.path}: {exc}", path=self.path) from exc
        out: list[Entry] = []
        for name in names:
            if name.startswith(".") or name == OWNER:
                continue
            m = _ENTRY_RE.match(name)
            if m is None or m.group("kind") not in self.KINDS:
                raise LedgerCorrupt(f"unknown file {name!r} in ledger {self.path}", path=self.path / name)
            if kind is not None and m.group("kind") != kind:
                continue
            entry = self._read_entry_file(self.path / name, missing_ok=True)
            if entry is not None:
                out.append(entry)
        out.sort(key=lambda e: (e.created, e.kind, e.key))
        return out

    def remove_if_empty(self) -> bool:
        """Remove the run's directory when it holds no entries. True when the directory is gone."""
        with self._lock:
            try:
                names = os.listdir(self.path)
            except FileNotFoundError:
                return True
            if any(not n.startswith(".") and n != OWNER for n in names):
                return False
            for n in names:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path / n)
            try:
                os.rmdir(self.path)
            except FileNotFoundError:
                return True
            except OSError as exc:
                if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                    return False
                raise
            _fsync_dir(self.root)
            return True

    # ------------------------------------------------------------------ internals
    def _require_dir(self) -> None:
        if not self.path.is_dir():
            raise NotFound(f"no ledger for run {self.run!r} in {self.root}", reason=Reason.LEDGER_NOT_FOUND)

    def _write(self, entry: Entry, now: float) -> None:
        doc = {"v": FORMAT, "kind": entry.kind, "key": entry.key, "created": entry.created, "updated": now,
               "data": entry.data}
        try:
            payload = json.dumps(doc, sort_keys=True, default=_json_default).encode()
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"ledger data for {entry.kind} {entry.key!r} is not JSON: {exc}",
                                  reason=Reason.INVALID_ARGUMENT) from exc
        entry.data = json.loads(payload)["data"]
        try:
            write_atomic(self.path, entry_filename(entry.kind, entry.key), payload)
        except FileNotFoundError as exc:
            raise NotFound(f"no ledger for run {self.run!r} in {self.root}", reason=Reason.LEDGER_NOT_FOUND) from exc

    def _read_entry_file(self, path: Path, missing_ok: bool) -> Entry | None:
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            if missing_ok:
                return None
            raise
        except OSError as exc:
            raise LedgerCorrupt(f"cannot read ledger entry {path}: {exc}", path=path) from exc
        m = _ENTRY_RE.match(path.name)
        try:
            doc = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise LedgerCorrupt(f"ledger entry {path} is not JSON (torn or corrupt)", path=path) from exc
        if (m is None or not isinstance(doc, dict) or doc.get("kind") != m.group("kind")
                or not isinstance(doc.get("key"), str) or not isinstance(doc.get("data"), dict)
                or not isinstance(doc.get("created"), (int, float)) or doc["kind"] not in self.KINDS
                or encode_key(doc["key"]) != m.group("enc")):
            raise LedgerCorrupt(f"ledger entry {path} does not match its name or lacks fields", path=path)
        return Entry(kind=doc["kind"], key=doc["key"], data=doc["data"], created=float(doc["created"]))


def _owner_record(run: str, pid: int | None) -> dict:
    pid = os.getpid() if pid is None else pid
    start = procs.starttime(pid)
    if start is None:
        raise InvalidArgument(f"cannot own a ledger by pid {pid}: no such process", reason=Reason.INVALID_ARGUMENT)
    return {"v": FORMAT, "run": run, "pid": pid, "starttime": start, "boot_id": procs.boot_id(),
            "created": time.time()}
