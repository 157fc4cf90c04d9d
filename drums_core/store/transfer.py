"""Moving a snapshot to another daemon's store (another host): its chain as one tar stream with a sha256.

A snapshot restores from its own layer and every ancestor's (``Snapshot.layers``, absolute paths
in the store that made it), its CRIU images and its manifest. Shipping one therefore means:

    pack (sender)                         import_snapshot (receiver)
    -------------                         --------------------------
    chain = the snapshot + ancestors      sha256 of the whole file == the sender's, else nothing
    minus those the receiver has            is touched (Unavailable CHECKSUM_MISMATCH)
    tar (POSIX, xattrs kept: overlay's    every member under the bundle's ids, no '..', no '/'
      trusted.overlay.* marks whiteouts,  extract into snapshots/.staging/import-<hex>/
      opaque and redirected directories)  per snapshot, parents first: rewrite ``layers`` to this
    sha256 over the stream                  store's paths, take this boot's id (the source's is
                                            kept in IMPORTED), publish (rename), commit (verify)

Bundle layout (one tar file)::

    drums-transfer.json      {"format", "top", "chain" (ids, oldest first), "sent", "boot_id", ...}
    <id>/manifest.json       the sender's manifest (its layer paths, its boot)
    <id>/images/...          CRIU images
    <id>/layer/...           the frozen upper, with its overlay xattrs and whiteouts

The receiver follows the store's own protocol (staging -> publish -> commit), so an import killed
anywhere leaves a staging leftover the daemon drops at its next start, or a published snapshot
it commits then if its files verify. An id already committed here is not replaced (same id, same
content: ids are the checkpoint's). A snapshot restored on another host needs the same base there
(the host root and the Drums image layer): the cluster's hosts are provisioned alike.

From the daemon (``op`` ``export_snapshot`` / ``import_snapshot``, see :func:`dispatch`) or in the
process of a node agent that runs as root on the daemon's host.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..config import check_name
from ..errors import DrumsError, FailedPrecondition, Internal, InvalidArgument, NotFound, Unavailable
from ..reasons import Reason
from ..host.procs import boot_id
from .usage import snapshot_usage
from .snapshots import BROKEN, COMMITTED, DUMPED, LAST_USED, MANIFEST, Snapshot, SnapshotStore, write_atomic

log = logging.getLogger("drums.transfer")

FORMAT = 1
BUNDLE_MANIFEST = "drums-transfer.json"
IMPORTED = "IMPORTED"
SPOOL_ROOT = Path(os.environ.get("DRUMS_TRANSFER_DIR", "/var/tmp/drums-transfer"))
CHUNK = 1 << 20
TAR = os.environ.get("DRUMS_TAR", "tar")
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")
# GNU tar: POSIX format, every xattr (overlay keeps whiteouts/opaque/redirect marks in trusted.*),
# numeric owners (the session user is uid 1000 whatever the names are on the other host).
_TAR_COMMON = ["--format=posix", "--xattrs", "--xattrs-include=*", "--numeric-owner"]

__all__ = ["BUNDLE_MANIFEST", "Bundle", "IMPORTED", "SPOOL_ROOT", "dispatch", "import_snapshot", "pack",
           "sha256_file", "snapshot_chain"]


@dataclass
class Bundle:
    """A packed chain: ``path`` (a tar file), its ``sha256`` and size, what it holds."""

    top: str
    chain: list[str]
    sent: list[str]
    path: str
    sha256: str
    bytes: int
    seconds: float
    files: int = 0
    source_boot_id: str = field(default_factory=boot_id)

    def to_dict(self) -> dict:
        return asdict(self)


def sha256_file(path: str | os.PathLike[str]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _layer_owner(store_root: Path | None, layer: str) -> str:
    """The snapshot id a layer path belongs to (``<store>/<id>/layer``)."""
    p = Path(layer)
    if p.name != "layer" or (store_root is not None and p.parent.parent != store_root):
        raise Internal(f"layer {layer} is not a snapshot layer of the store {store_root}",
                       reason=Reason.LAYER_OUTSIDE_STORE)
    return check_name(p.parent.name, "snapshot id")


def snapshot_chain(store: SnapshotStore, sid: str) -> list[Snapshot]:
    """``sid`` and its ancestors (every snapshot whose layer it stacks on), oldest first."""
    top = store.get(sid)
    ids = [_layer_owner(store.root, layer) for layer in top.layers]
    if not ids or ids[0] != top.id:
        raise Internal(f"snapshot {sid}: its own layer is not first in {top.layers}", reason=Reason.MANIFEST_CORRUPT)
    chain = []
    for i in reversed(ids):
        snap = top if i == top.id else store.get(i)
        reason = store.broken_reason(i)
        if reason or snap.state == "broken":
            raise FailedPrecondition(f"snapshot {i} is broken: {reason}", reason=Reason.SNAPSHOT_BROKEN, detail=reason)
        chain.append(snap)
    return chain


def pack(store: SnapshotStore, sid: str, dest: str | os.PathLike[str], *, skip: Iterable[str] = ()) -> Bundle:
    """Write the chain of ``sid`` (minus the ids in ``skip``, which the receiver has) to ``dest``.

    The files are checked against their recorded sizes first (a corrupt snapshot is not shipped:
    Internal IMAGES_CORRUPT). Unavailable when tar fails (nothing is left at ``dest``).
    """
    t0 = time.monotonic()
    check_name(sid, "snapshot id")
    dest = Path(dest)
    chain = snapshot_chain(store, sid)
    for snap in chain:
        store.verify(snap)
    skip = set(skip)
    sent = [s.id for s in chain if s.id not in skip]
    manifest = {"format": FORMAT, "top": sid, "chain": [s.id for s in chain], "sent": sent, "boot_id": boot_id(),
                "created": time.time(), "files": {s.id: s.files for s in chain if s.id in sent}}
    dest.parent.mkdir(parents=True, mode=0o700, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.part")
    with tempfile.TemporaryDirectory(prefix="drums-bundle-") as meta:
        (Path(meta) / BUNDLE_MANIFEST).write_text(json.dumps(manifest, indent=1))
        excludes = [f"--exclude={i}/{marker}" for i in sent
                    for marker in (COMMITTED, BROKEN, IMPORTED, DUMPED, LAST_USED)]
        members: list[str] = []
        for i in sent:  # a spilled snapshot is read where it lives on disk (under the same name)
            where = store.path(i).resolve().parent if store.is_spilled(i) else store.root
            members += ["-C", str(where), check_name(i, "snapshot id")]
        # --sparse: a layer's sparse file (a session can `truncate -s 20T`) travels as its data and a
        # map of its holes, not as terabytes of zeros; hard links travel as links (tar's default)
        argv = [TAR, "--create", "--file=-", *_TAR_COMMON, "--sparse", "--anchored", *excludes, "-C", meta,
                BUNDLE_MANIFEST, *members]
        h = hashlib.sha256()
        size = 0
        try:
            # the images hold the session's memory: readable by root alone
            with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as out:
                proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/")
                assert proc.stdout is not None and proc.stderr is not None
                while chunk := proc.stdout.read(CHUNK):
                    h.update(chunk)
                    out.write(chunk)
                    size += len(chunk)
                err = proc.stderr.read().decode(errors="replace")
                rc = proc.wait()
            if rc != 0:
                raise Unavailable(f"packing snapshot {sid} failed (tar exit {rc}): {err.strip()[-1500:]}",
                                  reason=Reason.PACK_FAILED, detail={"stderr": err[-4000:]})
            os.rename(tmp, dest)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    files = sum(len(s.files) for s in chain if s.id in sent)
    b = Bundle(top=sid, chain=[s.id for s in chain], sent=sent, path=str(dest), sha256=h.hexdigest(), bytes=size,
               seconds=time.monotonic() - t0, files=files)
    log.info("packed %s (%d of %d snapshots of its chain): %d MiB, sha256 %s, %.2fs", sid, len(sent), len(chain),
             size >> 20, b.sha256[:16], b.seconds)
    return b


def _read_bundle_manifest(tar_path: Path) -> dict:
    out = subprocess.run([TAR, "--extract", "--to-stdout", "--file", str(tar_path), BUNDLE_MANIFEST],
                         capture_output=True, timeout=60, cwd="/")
    if out.returncode != 0:
        raise Internal(f"bundle {tar_path} has no readable {BUNDLE_MANIFEST}: "
                       f"{out.stderr.decode(errors='replace').strip()[-500:]}", reason=Reason.BUNDLE_CORRUPT)
    try:
        m = json.loads(out.stdout)
        if m.get("format") != FORMAT:
            raise ValueError(f"format {m.get('format')!r}, expected {FORMAT}")
        top = check_name(m["top"], "snapshot id")
        chain = [check_name(i, "snapshot id") for i in m["chain"]]
        sent = [check_name(i, "snapshot id") for i in m["sent"]]
        if not chain or chain[-1] != top or not set(sent) <= set(chain):
            raise ValueError(f"inconsistent chain {chain} / sent {sent} / top {top}")
    except (ValueError, KeyError, TypeError) as exc:
        raise Internal(f"bundle manifest of {tar_path} is malformed: {exc}", reason=Reason.BUNDLE_CORRUPT) from exc
    return m


def _check_members(tar_path: Path, sent: list[str]) -> int:
    """Every member sits under one of the bundle's ids (or is its manifest); returns the count."""
    out = subprocess.run([TAR, "--list", "--file", str(tar_path)], capture_output=True, timeout=120, cwd="/")
    if out.returncode != 0:
        raise Internal(f"cannot list bundle {tar_path}: {out.stderr.decode(errors='replace')[-500:]}",
                       reason=Reason.BUNDLE_CORRUPT)
    allowed = set(sent)
    names = out.stdout.decode("utf-8", "surrogateescape").splitlines()
    for name in names:
        parts = [p for p in name.split("/") if p not in ("", ".")]
        if name.startswith("/") or ".." in parts or not parts:
            raise Internal(f"bundle member {name!r} escapes the bundle", reason=Reason.BUNDLE_CORRUPT)
        if parts == [BUNDLE_MANIFEST]:
            continue
        if parts[0] not in allowed:
            raise Internal(f"bundle member {name!r} is not under a snapshot it declares", reason=Reason.BUNDLE_CORRUPT)
    return len(names)


_OK_XATTRS = ("trusted.overlay.", "user.", "security.capability")
_SESSION_NODES = {(1, 3), (1, 5), (1, 7), (1, 8), (1, 9), (5, 0)}  # the launcher's /dev (drums_core.session.launch)


def check_layer(layer: Path) -> None:
    """A layer from another node holds only what a session could have made: files owned by session ids
    (``ID_BASE`` + 0..65535), no device nodes but overlay's whiteouts (char 0:0) and the launcher's
    /dev nodes, no other kinds of xattrs. The walk follows no symlink. Internal (``BUNDLE_UNSAFE``)
    names the first offence."""
    import stat

    from ..config import ID_BASE, ID_COUNT

    def bad(path: str, why: str) -> Internal:
        return Internal(f"bundle layer {layer}: {os.path.relpath(path, layer)}: {why}", reason=Reason.BUNDLE_UNSAFE)

    for dirpath, dirs, files in os.walk(layer):
        for name in [*dirs, *files]:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            whiteout = stat.S_ISCHR(st.st_mode) and st.st_rdev == 0
            node = (os.major(st.st_rdev), os.minor(st.st_rdev))
            if stat.S_ISBLK(st.st_mode) or (stat.S_ISCHR(st.st_mode) and not whiteout
                                            and node not in _SESSION_NODES):
                raise bad(path, f"device node {os.major(st.st_rdev)}:{os.minor(st.st_rdev)}")
            if not whiteout and not (ID_BASE <= st.st_uid < ID_BASE + ID_COUNT
                                     and ID_BASE <= st.st_gid < ID_BASE + ID_COUNT):
                raise bad(path, f"owned by host ids {st.st_uid}:{st.st_gid}, outside the sessions' range")
            if stat.S_ISLNK(st.st_mode):
                continue
            for attr in os.listxattr(path, follow_symlinks=False):
                if not attr.startswith(_OK_XATTRS):
                    raise bad(path, f"extended attribute {attr}")


def _verify_sizes(d: Path, snap: Snapshot) -> None:
    for name, size in snap.files.items():
        p = d / "images" / name
        try:
            actual = p.stat().st_size
        except FileNotFoundError:
            raise Internal(f"imported snapshot {snap.id}: image file {name} is missing",
                           reason=Reason.IMAGES_CORRUPT) from None
        if actual != size:
            raise Internal(f"imported snapshot {snap.id}: image file {name} is {actual} bytes, recorded {size}",
                           reason=Reason.IMAGES_CORRUPT)
    if not (d / "layer").is_dir():
        raise Internal(f"imported snapshot {snap.id} has no layer", reason=Reason.IMAGES_CORRUPT)


def import_snapshot(store: SnapshotStore, tar_path: str | os.PathLike[str], expected_sha: str) -> dict:
    """Verify ``tar_path`` against ``expected_sha``, then place its snapshots into ``store`` and commit them.

    Returns ``{"top", "snapshot" (the committed record), "imported", "present", "sha256", "verified",
    "bytes", "seconds"}``. Errors: InvalidArgument (bad checksum string), NotFound (no file),
    Unavailable CHECKSUM_MISMATCH (nothing was touched: send it again), FailedPrecondition
    PARENT_MISSING (an ancestor was skipped that this store lacks), Internal BUNDLE_CORRUPT /
    IMAGES_CORRUPT (the bundle verified but is inconsistent; nothing of it was committed).
    """
    t0 = time.monotonic()
    if not isinstance(expected_sha, str) or not _SHA_RE.match(expected_sha):
        raise InvalidArgument(f"expected sha256 must be 64 lowercase hex digits, not {expected_sha!r}",
                              reason=Reason.BAD_CHECKSUM)
    tar_path = Path(tar_path)
    if not tar_path.is_absolute():
        raise InvalidArgument(f"bundle path must be absolute: {tar_path}", reason=Reason.BAD_PATH)
    try:
        size = tar_path.stat().st_size
        actual = sha256_file(tar_path)
    except FileNotFoundError:
        raise NotFound(f"no bundle at {tar_path}", reason=Reason.BUNDLE_NOT_FOUND) from None
    t_verify = time.monotonic() - t0
    if actual != expected_sha:
        raise Unavailable(f"bundle {tar_path.name} is corrupt: sha256 {actual}, the sender's {expected_sha}",
                          reason=Reason.CHECKSUM_MISMATCH, detail={"expected": expected_sha, "actual": actual})
    m = _read_bundle_manifest(tar_path)
    members = _check_members(tar_path, m["sent"])
    staging = store.staging(f"import-{uuid.uuid4().hex[:16]}")
    here_boot = boot_id()
    imported: list[str] = []
    present: list[str] = []
    try:
        staging.mkdir(parents=True)
        t1 = time.monotonic()
        out = subprocess.run([TAR, "--extract", "--file", str(tar_path), *_TAR_COMMON, "--same-permissions",
                              "--same-owner", "-C", str(staging)], capture_output=True, timeout=600, cwd="/")
        if out.returncode != 0:
            raise Internal(f"extracting bundle {tar_path.name} failed: "
                           f"{out.stderr.decode(errors='replace').strip()[-1500:]}", reason=Reason.BUNDLE_CORRUPT)
        t_extract = time.monotonic() - t1
        t2 = time.monotonic()
        chain_ids = list(m["chain"])
        for sid in chain_ids:
            target = store.path(sid)
            if (target / MANIFEST).exists():
                have = store.get(sid, committed_only=False)
                if have.state == "broken":
                    raise FailedPrecondition(f"snapshot {sid} is here already and broken: "
                                             f"{store.broken_reason(sid)}", reason=Reason.SNAPSHOT_BROKEN)
                if have.state == "published":
                    store.commit(sid)
                present.append(sid)
                continue
            if sid not in m["sent"]:
                raise FailedPrecondition(f"snapshot {sid} (an ancestor of {m['top']}) is neither in the bundle nor "
                                         f"in this store", reason=Reason.PARENT_MISSING)
            d = staging / sid
            try:
                snap = Snapshot(**json.loads((d / MANIFEST).read_text()))
            except (OSError, ValueError, TypeError) as exc:
                raise Internal(f"manifest of {sid} in the bundle is unreadable: {exc}",
                               reason=Reason.BUNDLE_CORRUPT) from exc
            if snap.id != sid:
                raise Internal(f"bundle directory {sid} holds the manifest of {snap.id}", reason=Reason.BUNDLE_CORRUPT)
            owners = [_layer_owner(None, layer) for layer in snap.layers]
            if not owners or owners[0] != sid or not set(owners) <= set(chain_ids):
                raise Internal(f"snapshot {sid} stacks on layers outside its chain: {snap.layers}",
                               reason=Reason.BUNDLE_CORRUPT)
            _verify_sizes(d, snap)
            check_layer(d / "layer")
            measured = snapshot_usage(d)  # what it occupies here, never the size the sender claims
            if not measured["layer"]["complete"]:
                raise Internal(f"snapshot {sid}: its layer could not be measured ({measured['basis']})",
                               reason=Reason.BUNDLE_UNSAFE)
            snap.usage, snap.size = measured, measured["size"]
            provenance = {"sha256": actual, "bundle_top": m["top"], "source_boot_id": snap.boot_id,
                          "source_layers": list(snap.layers), "imported": time.time()}
            snap.layers = [str(store.path(o) / "layer") for o in owners]
            snap.boot_id = here_boot  # restorable here: the receiving host vouches with its own base
            snap.state = "published"
            for marker in (COMMITTED, BROKEN):
                (d / marker).unlink(missing_ok=True)
            write_atomic(d / IMPORTED, json.dumps(provenance, indent=1))
            write_atomic(d / MANIFEST, json.dumps(snap.to_dict(), indent=1))
            try:
                os.rename(d, target)
            except OSError:
                if not (target / MANIFEST).exists():
                    raise
                present.append(sid)  # imported by a concurrent call meanwhile
                if store.get(sid, committed_only=False).state == "published":
                    store.commit(sid)
                continue
            store.commit(sid)
            imported.append(sid)
        t_commit = time.monotonic() - t2
    except DrumsError:
        raise
    except (OSError, subprocess.SubprocessError) as exc:
        raise Unavailable(f"import of {m['top']} failed: {exc}", reason=Reason.IMPORT_FAILED) from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    top = store.get(m["top"])
    log.info("imported %s (%s new, %s present), %d MiB verified sha256 %s", m["top"], imported, present,
             size >> 20, actual[:16])
    return {"top": m["top"], "snapshot": top.to_dict(), "imported": imported, "present": present, "sha256": actual,
            "expected_sha256": expected_sha, "verified": True, "bytes": size, "members": members,
            "seconds": {"verify": round(t_verify, 4), "extract": round(t_extract, 4), "commit": round(t_commit, 4),
                        "total": round(time.monotonic() - t0, 4)}}


def _spool_path(value, what: str) -> Path:
    if not isinstance(value, str) or not value.startswith("/") or "\x00" in value or ".." in value.split("/"):
        raise InvalidArgument(f"{what} must be an absolute path without '..': {value!r}", reason=Reason.BAD_PATH)
    return Path(value)


def dispatch(store: SnapshotStore, op: str, args: dict):
    """The daemon's ``export_snapshot`` / ``import_snapshot`` operations.

    ``export_snapshot``: ``snapshot`` (id), ``dest`` (absolute path of the tar file to write),
    ``skip`` (ids the receiver has) -> :class:`Bundle` as a dict.
    ``import_snapshot``: ``path`` (the tar file), ``sha256`` (the sender's) -> see :func:`import_snapshot`.
    """
    if op == "export_snapshot":
        skip = args.get("skip") or []
        if not isinstance(skip, list) or not all(isinstance(s, str) for s in skip):
            raise InvalidArgument("skip must be a list of snapshot ids", reason=Reason.BAD_REQUEST)
        return pack(store, args["snapshot"], _spool_path(args["dest"], "dest"), skip=skip).to_dict()
    if op == "import_snapshot":
        return import_snapshot(store, _spool_path(args["path"], "path"), args["sha256"])
    raise InvalidArgument(f"unknown transfer operation {op!r}", reason=Reason.UNKNOWN_OP)
