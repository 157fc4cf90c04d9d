"""Snapshot records and their store: stage -> publish (atomic rename) -> commit (the record).

On disk, under the state directory::

    snapshots/.staging/<id>/dump/                      CRIU writes its images here
    snapshots/.staging/<id>/DUMPED                     the dump finished: the record, the upper's path
    snapshots/.staging/<id>/{images/, layer/}          images moved, upper frozen into the layer
    snapshots/<id>/{images/, layer/, manifest.json}    published: files complete, manifest last
    snapshots/<id>/COMMITTED                          committed: served to restores
    snapshots/<id>/LAST_USED                          its mtime: the last restore (for the store budget)
    snapshots/<id> -> <spill>/<id>                    spilled: the same files on disk, through a symlink
    snapshots/.rm-<id>                                retired (evicted or deleted): never served, purged

A snapshot is usable only on the boot it was made on (``boot_id``): CRIU images name kernel
objects that do not survive a reboot. The byte budget, eviction and spilling are policy, in
:mod:`drums_core.store.budget`; this module does the moves, each one crash-safe on its own.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import FailedPrecondition, Internal, InvalidArgument, NotFound
from ..reasons import Reason
from ..host.procs import boot_id
from . import usage

COMMITTED = "COMMITTED"
DUMPED = "DUMPED"
BROKEN = "BROKEN"
MANIFEST = "manifest.json"
LAST_USED = "LAST_USED"
RETENTIONS = ("pinned", "cache")


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)
    dfd = os.open(path.parent, os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


@dataclass
class Snapshot:
    id: str
    name: str | None
    scope: str
    session: str
    image: str
    layers: list[str]
    parent: str | None
    created: float
    boot_id: str
    size: int
    params: dict
    processes: list[list] = field(default_factory=list)
    windows: list[str] = field(default_factory=list)
    spec: dict = field(default_factory=dict)
    files: dict[str, int] = field(default_factory=dict)
    dump_seconds: float = 0.0
    window_ids: list[int] = field(default_factory=list)  # X ids of ``windows``: a restore waits for them
    state: str = "published"
    image_hash: str | None = None  # content hash of the image the session ran on (None: made over the host's /)
    id_base: int | None = None     # host id of the session's uid 0 (files in its layers are owned from there)
    retention: str = "pinned"      # "cache": the store may evict it when nothing uses it (see store.budget)
    usage: dict = field(default_factory=dict)  # what ``size`` counts: blocks, inodes (see store.usage)

    def to_dict(self) -> dict:
        return asdict(self)


def _freeze_upper(upper: Path, layer: Path) -> None:
    """Make the session's upper the snapshot's layer: a rename when both share a filesystem, else a
    copy that keeps overlay's whiteouts and xattrs (``cp -a``) into ``layer.tmp``, then a rename.
    Re-entrant: a copy torn by a crash is started again."""
    try:
        os.rename(upper, layer)
        return
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
    tmp = layer.with_name(layer.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    out = subprocess.run(["cp", "-a", "--no-dereference", str(upper), str(tmp)], capture_output=True, text=True,
                         check=False)
    if out.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise OSError(errno.EIO, f"copying the writable layer failed: {out.stderr.strip()[-500:]}")
    os.rename(tmp, layer)


def copy_layer(src: Path, dst: Path) -> None:
    """``cp -a`` without following any symlink: overlay's whiteouts, xattrs and owners kept (a
    writable layer, or a snapshot's files, copied as they are)."""
    out = subprocess.run(["cp", "-a", "--no-dereference", "--", str(src), str(dst)], capture_output=True, text=True,
                         check=False)
    if out.returncode != 0:
        raise OSError(errno.EIO, f"copying {src} failed: {out.stderr.strip()[-500:]}")


class SnapshotStore:
    def __init__(self, root: Path, spill_root: Path | None = None) -> None:
        self.root = root
        self.staging_root = root / ".staging"
        self.staging_root.mkdir(parents=True, exist_ok=True)
        self.spill_root = spill_root  # where spilled snapshots live on disk (None: no spilling)

    def staging(self, sid: str) -> Path:
        return self.staging_root / sid

    def path(self, sid: str) -> Path:
        return self.root / sid

    def mark_dumped(self, snap: Snapshot, upper: str, root: str) -> None:
        """Record that CRIU finished: from here on the snapshot can always be finished, even after a crash.
        What the session's writable filesystem holds now is kept with it: the charge of a layer whose
        walk is cut short (see :func:`drums_core.store.usage.snapshot_usage`)."""
        staged = self.staging(snap.id)
        try:
            held = usage.fs_usage(upper).to_dict()
        except OSError:
            held = None
        write_atomic(staged / DUMPED, json.dumps({"snapshot": snap.to_dict(), "upper": upper, "root": root,
                                                  "upper_usage": held}))

    def finish(self, sid: str) -> Snapshot:
        """Finish a dumped snapshot: move the images, freeze the upper into the layer, publish, commit.

        Every step checks whether it is already done, so a finish interrupted anywhere (the daemon
        killed) is completed by calling this again, from the same daemon or its successor.
        """
        from ..session import faults, rootfs

        staged = self.staging(sid)
        if not staged.exists():
            if (self.path(sid) / MANIFEST).exists():
                return self.commit(sid)
            raise NotFound(f"no staged snapshot {sid}", reason=Reason.SNAPSHOT_NOT_FOUND)
        marker = json.loads((staged / DUMPED).read_text())
        snap = Snapshot(**marker["snapshot"])
        (staged / "images").mkdir(exist_ok=True)
        dump = staged / "dump"
        if dump.exists():
            for i, p in enumerate(sorted(dump.iterdir())):
                os.rename(p, staged / "images" / p.name)
                if i == 0:
                    faults.hit("checkpoint-mid-staging")
            os.rmdir(dump)
        if not (staged / "layer").exists():
            root = Path(marker["root"])
            if root.exists() and rootfs.is_mountpoint(root):
                rootfs.unmount_tree(root)
            faults.hit("checkpoint-mid-freeze")
            _freeze_upper(Path(marker["upper"]), staged / "layer")
        for leftover in (staged / "criu.log",):
            if leftover.exists() or leftover.is_symlink():
                leftover.unlink()
        held = marker.get("upper_usage")
        fallback = usage.Usage(**{k: v for k, v in held.items() if k != "charge"}) if held else None
        snap.usage = usage.snapshot_usage(staged, upper_fallback=fallback)
        snap.size = snap.usage["size"]
        snap.files = {p.name: p.stat().st_size for p in sorted((staged / "images").iterdir()) if p.is_file()}
        write_atomic(staged / MANIFEST, json.dumps(snap.to_dict(), indent=1))
        faults.hit("checkpoint-staged")
        os.rename(staged, self.path(sid))
        faults.hit("checkpoint-published")
        return self.commit(sid)

    def commit(self, sid: str) -> Snapshot:
        final = self.path(sid)
        snap = self._load(final)
        self.verify(snap)
        write_atomic(final / COMMITTED, json.dumps({"committed": time.time()}))
        snap.state = "committed"
        return snap

    def verify(self, snap: Snapshot) -> None:
        """Every image file is present at its recorded size; else Internal (the images are corrupt)."""
        images = self.path(snap.id) / "images"
        for name, size in snap.files.items():
            p = images / name
            try:
                actual = p.stat().st_size
            except FileNotFoundError:
                raise Internal(f"snapshot {snap.id}: image file {name} is missing",
                               reason=Reason.IMAGES_CORRUPT) from None
            if actual != size:
                raise Internal(f"snapshot {snap.id}: image file {name} is {actual} bytes, recorded {size}",
                               reason=Reason.IMAGES_CORRUPT)
        for layer in snap.layers:
            if not Path(layer).is_dir():
                raise Internal(f"snapshot {snap.id}: layer {layer} is missing", reason=Reason.IMAGES_CORRUPT)

    def mark_broken(self, sid: str, reason: str) -> None:
        write_atomic(self.path(sid) / BROKEN, json.dumps({"reason": reason, "time": time.time()}))

    def broken_reason(self, sid: str) -> str | None:
        try:
            return json.loads((self.path(sid) / BROKEN).read_text())["reason"]
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError) as exc:
            return f"unreadable broken marker: {exc}"

    def _load(self, d: Path) -> Snapshot:
        try:
            data = json.loads((d / MANIFEST).read_text())
        except (OSError, ValueError) as exc:
            raise Internal(f"snapshot manifest in {d} unreadable: {exc}", reason=Reason.MANIFEST_CORRUPT) from exc
        snap = Snapshot(**data)
        snap.state = ("broken" if (d / BROKEN).exists() else "committed" if (d / COMMITTED).exists()
                      else "published")
        return snap

    def get(self, sid: str, *, committed_only: bool = True) -> Snapshot:
        d = self.path(sid)
        if not (d / MANIFEST).exists():
            raise NotFound(f"no snapshot {sid!r}", reason=Reason.SNAPSHOT_NOT_FOUND)
        snap = self._load(d)
        if committed_only and snap.state not in ("committed", "broken"):
            raise NotFound(f"snapshot {sid!r} is not committed", reason=Reason.SNAPSHOT_NOT_FOUND)
        return snap

    def list(self) -> list[Snapshot]:
        out = []
        for d in sorted(self.root.iterdir()):
            if d.name.startswith(".") or not (d / MANIFEST).exists():
                continue
            try:
                out.append(self._load(d))
            except Internal:
                continue
        return sorted(out, key=lambda s: s.created)

    def resolve(self, ref: str, scope: str | None = None, any_boot: bool = False) -> Snapshot:
        """A snapshot by id, or the newest committed one with that name (in ``scope`` when given)."""
        if not isinstance(ref, str) or not ref or "/" in ref or ".." in ref or "\x00" in ref:
            raise InvalidArgument(f"invalid snapshot reference {ref!r}", reason=Reason.INVALID_NAME)
        if (self.path(ref) / MANIFEST).exists():
            snap = self.get(ref)
        else:
            named = [s for s in self.list() if s.name == ref and s.state in ("committed", "broken")
                     and (scope is None or s.scope == scope)]
            if not named:
                raise NotFound(f"no snapshot named {ref!r}" + (f" in scope {scope!r}" if scope else ""),
                               reason=Reason.SNAPSHOT_NOT_FOUND)
            snap = named[-1]
        if snap.boot_id != boot_id() and not any_boot:
            raise FailedPrecondition(f"snapshot {snap.id} was made on another boot ({snap.boot_id})",
                                     reason=Reason.SNAPSHOT_OTHER_BOOT)
        return snap

    def users_of(self, sid: str) -> list[str]:
        layer = str(self.path(sid) / "layer")
        return [s.id for s in self.list() if s.id != sid and layer in s.layers]

    def delete(self, sid: str, in_use_by_sessions: list[str]) -> None:
        snap = self.get(sid, committed_only=False)
        children = self.users_of(sid)
        if children or in_use_by_sessions:
            raise FailedPrecondition(f"snapshot {sid} is in use by snapshots {children} and sessions "
                                     f"{in_use_by_sessions}", reason=Reason.SNAPSHOT_IN_USE)
        self.purge(self.retire(snap.id))

    # ------------------------------------------------------------ last use, retire, spill
    def touch(self, sid: str) -> None:
        """Record a use now (the LAST_USED file's mtime): one small write, on restore."""
        p = self.path(sid) / LAST_USED
        try:
            os.utime(p)
        except FileNotFoundError:
            p.touch()

    def last_used(self, snap: Snapshot) -> float:
        try:
            return max(snap.created, (self.path(snap.id) / LAST_USED).stat().st_mtime)
        except OSError:
            return snap.created

    def is_spilled(self, sid: str) -> bool:
        return self.path(sid).is_symlink()

    def retire(self, sid: str) -> Path:
        """Take a snapshot out of service in one rename (``.rm-<id>``): from here no lookup finds it,
        so a crash can leave it half-deleted only where nothing reads. :meth:`purge` finishes."""
        retired = self.root / f".rm-{sid}"
        os.rename(self.path(sid), retired)
        return retired

    def _spill_target(self, link: Path) -> Path | None:
        """Where a store symlink points, if it is a spilled snapshot of ours (else None: left alone)."""
        try:
            target = Path(os.readlink(link))
        except OSError:
            return None
        if self.spill_root is None or target.parent != self.spill_root or target.name.startswith("."):
            return None
        return target

    def purge(self, retired: Path) -> None:
        """Delete a retired snapshot: its images first, then the rest (a spilled one: its disk copy,
        then the link). Re-entrant: a purge cut short is finished by the next one (or by recover)."""
        from ..session import faults

        if retired.is_symlink():
            target = self._spill_target(retired)
            if target is not None:
                shutil.rmtree(target, ignore_errors=True)
            retired.unlink()
            return
        if (retired / "images").exists():
            shutil.rmtree(retired / "images", ignore_errors=True)
        faults.hit("purge-mid-delete")
        shutil.rmtree(retired, ignore_errors=True)

    def spill(self, sid: str, still_unused) -> bool:
        """Move a snapshot's files to ``<spill root>/<id>`` and swap ``snapshots/<id>`` for a symlink to
        them in one atomic exchange, taken only while ``still_unused()`` (called under the caller's lock
        at the swap) says yes. Returns whether it moved. Each step is undone or finished by :meth:`recover`
        after a crash: a copy not swapped in is dropped, an old directory swapped out is purged."""
        from ..session import faults
        from ..host import linux

        if self.spill_root is None:
            raise FailedPrecondition("no spill directory is configured", reason=Reason.SPILL_DISABLED)
        src = self.path(sid)
        if src.is_symlink():
            return False
        snap = self._load(src)
        self.spill_root.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp, final, link = self.spill_root / f".tmp-{sid}", self.spill_root / sid, self.root / f".spill-{sid}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(mode=0o700)
        try:
            copy_layer(src / "images", tmp / "images")
            faults.hit("spill-mid-copy")
            copy_layer(src / "layer", tmp / "layer")
            for p in sorted(src.iterdir()):
                if p.name not in ("images", "layer"):
                    copy_layer(p, tmp / p.name)
            for name, size in snap.files.items():
                if (tmp / "images" / name).stat().st_size != size:
                    raise OSError(errno.EIO, f"spilled copy of {sid}: {name} is not {size} bytes")
            os.rename(tmp, final)
            os.symlink(final, link)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.rmtree(final, ignore_errors=True)
            if link.is_symlink():
                link.unlink()
            raise
        faults.hit("spill-copied")
        if not still_unused(lambda: linux.rename_exchange(link, src)):
            link.unlink()
            shutil.rmtree(final, ignore_errors=True)
            return False
        faults.hit("spill-swapped")
        self.purge(link)  # now the old directory
        return True

    def recover(self) -> dict:
        """At daemon start: drop staging leftovers, commit published snapshots whose files verify."""
        self.staging_root.mkdir(parents=True, exist_ok=True)
        report = {"staging_removed": 0, "finished": 0, "committed": 0, "broken": 0}
        for d in list(self.staging_root.iterdir()):
            if (d / DUMPED).exists():
                try:
                    self.finish(d.name)
                    report["finished"] += 1
                    continue
                except (OSError, ValueError, Internal) as exc:
                    report.setdefault("errors", []).append(f"{d.name}: {exc}")
            shutil.rmtree(d, ignore_errors=True)
            report["staging_removed"] += 1
        for d in list(self.root.iterdir()):
            if d.name.startswith(".spill-"):  # a symlink: the swap did not happen; a directory: it did
                if d.is_symlink():
                    target = self._spill_target(d)
                    d.unlink()
                    if target is not None:
                        shutil.rmtree(target, ignore_errors=True)
                else:
                    self.purge(d)
                report["spill_undone"] = report.get("spill_undone", 0) + 1
        for d in list(self.root.iterdir()):
            if not d.name.startswith(".") and d.is_symlink() and not (d / MANIFEST).exists():
                target = self._spill_target(d)
                if target is not None and target.parent.is_dir():
                    d.unlink()  # a spilled snapshot whose copy is gone from a spill directory that is there
                    report["dangling"] = report.get("dangling", 0) + 1
                continue  # else (the spill directory is not there now) left for a later start
            if d.name.startswith(".rm-"):
                self.purge(d)
                report["purged"] = report.get("purged", 0) + 1
                continue
            if d.name.startswith(".") or not (d / MANIFEST).exists() or (d / COMMITTED).exists():
                continue
            try:
                self.commit(d.name)
                report["committed"] += 1
            except Internal:
                report["broken"] += 1
        report["spill_orphans"] = self._drop_spill_orphans()
        return report

    def _drop_spill_orphans(self) -> int:
        """Spilled copies no store link names (a copy never swapped in, or one from an earlier boot,
        whose tmpfs store is gone): deleted. Only entries of this store's own spill directory."""
        if self.spill_root is None or not self.spill_root.is_dir():
            return 0
        named = {t.name for t in (self._spill_target(p) for p in self.root.iterdir() if p.is_symlink()) if t}
        dropped = 0
        for p in list(self.spill_root.iterdir()):
            if p.name in named:
                continue
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink()
            dropped += 1
        return dropped
