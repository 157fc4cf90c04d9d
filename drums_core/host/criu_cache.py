"""CRIU's kernel-feature cache (``/run/criu.kdat``) on a host whose ``/run`` is not a tmpfs.

Every CRIU run first probes the kernel's features (``kerndat``: pagemap, the hidden shmem device,
namespaces, sockets, a tmpfs it mounts under ``/tmp/.criu.*`` ...): 30 to 50 ms of each restore and
dump on this kind of host. CRIU keeps what it found in ``/run/criu.kdat`` and loads it on its next
run, but it *writes* the file only when ``/run`` is a tmpfs (so that a reboot, maybe into another
kernel, clears it); it *loads* the file wherever it is. On a host whose ``/run`` is a disk
directory (these machines), CRIU therefore probes on every run.

:func:`ensure` (every supervisor, before its first CRIU call) makes the cache there once per
boot: ``criu check`` runs in a mount namespace of its own whose ``/run`` is a fresh tmpfs, and the
file it wrote is installed as
``/run/criu.kdat`` (written to a temporary name, then renamed). What Drums installed is recorded
in :data:`RECORD` (boot id, kernel, CRIU version, the file's sha256); a cache of another boot,
kernel or CRIU is made again before Drums' first CRIU call, so no call of Drums loads what
another kernel said (a CRIU run by another tool before then could: the file persists on disk). A file Drums did not
write (no record, or another digest) is left alone and reported. On a host whose ``/run`` is a
tmpfs nothing is done: CRIU keeps its own cache there.

A named host change: :func:`remove` (``drums shutdown --purge`` of the host's last instance)
deletes the file and the record if the file is still the one Drums wrote.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
from pathlib import Path

from .. import config
from . import linux, procs

RUN = Path("/run")
KDAT = RUN / "criu.kdat"
RECORD = Path(os.environ.get("DRUMS_CRIU_KDAT_RECORD", "/var/lib/drums/criu-kdat.json"))
TMPFS_MAGIC = 0x01021994
MAX_KDAT = 1 << 20  # CRIU 4.2's is 912 bytes

# criu check in a mount namespace of its own whose /run is an empty tmpfs: CRIU saves its cache
# there; the file comes back on stdout. Nothing of it outlives the namespace.
_GENERATE = r"""
mount -t tmpfs -o size=1m,mode=0700 drums-kdat /run
"$1" check >/dev/null 2>&1 || true
cat /run/criu.kdat
"""


def _run_is_tmpfs() -> bool:
    try:
        return linux.statfs_type(RUN) == TMPFS_MAGIC
    except OSError:
        return False


def _identity(criu_bin: Path) -> dict:
    """What a cache is valid for: this boot, this kernel, this CRIU."""
    u = os.uname()
    out = subprocess.run([str(criu_bin), "--version"], capture_output=True, text=True, timeout=30, check=False)
    return {"boot_id": procs.boot_id(), "kernel": f"{u.release} {u.version}", "criu": out.stdout.strip()}


def _digest(path: Path) -> str | None:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_KDAT + 1)
    except OSError:
        return None
    return hashlib.sha256(data).hexdigest()


def _read_record() -> dict | None:
    try:
        rec = json.loads(RECORD.read_text())
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) else None


def _generate(criu_bin: Path) -> bytes:
    out = subprocess.run(["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", _GENERATE,
                          "drums-kdat", str(criu_bin)], capture_output=True, timeout=60, check=False, cwd="/")
    data = out.stdout
    if not data or len(data) > MAX_KDAT:
        raise OSError(f"criu check wrote no kdat cache (exit {out.returncode}, {len(data)} bytes): "
                      f"{out.stderr.decode(errors='replace')[-300:]}")
    return data


def ensure(criu_bin: Path = config.CRIU_BIN) -> dict:
    """Make sure CRIU finds a cache of this boot, kernel and CRIU. Returns what was done:
    ``{"state": "tmpfs" | "kept" | "made" | "foreign" | "failed", ...}``. Never raises: without the
    cache CRIU probes as before."""
    try:
        if _run_is_tmpfs():
            return {"state": "tmpfs", "detail": "/run is a tmpfs: CRIU keeps its own cache there"}
        RECORD.parent.mkdir(parents=True, exist_ok=True)
        lock = os.open(RECORD.parent / ".criu-kdat.lock", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            ident = _identity(criu_bin)
            rec = _read_record()
            have = _digest(KDAT) if KDAT.exists() or KDAT.is_symlink() else None
            if have is not None and (rec is None or rec.get("sha256") != have):
                return {"state": "foreign", "detail": f"{KDAT} was not written by Drums: left alone"}
            if have is not None and rec and all(rec.get(k) == v for k, v in ident.items()):
                return {"state": "kept", **ident}
            data = _generate(criu_bin)
            tmp = RUN / f".criu.kdat.drums-{os.getpid()}"
            tmp.unlink(missing_ok=True)  # a process of this pid that died here (under the lock: not a live one's)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            rec_tmp = RECORD.with_name(RECORD.name + ".tmp")
            rec_tmp.write_text(json.dumps({**ident, "sha256": hashlib.sha256(data).hexdigest(),
                                           "path": str(KDAT)}, indent=1))
            os.replace(rec_tmp, RECORD)  # the record first: a file without it would look foreign
            os.replace(tmp, KDAT)
            return {"state": "made", **ident}
        finally:
            os.close(lock)
    except (OSError, subprocess.SubprocessError) as exc:
        return {"state": "failed", "detail": str(exc)}


def status(criu_bin: Path = config.CRIU_BIN) -> dict:
    """What ``drums doctor`` says of the cache (read only)."""
    try:
        if _run_is_tmpfs():
            return {"state": "tmpfs"}
        rec = _read_record()
        have = _digest(KDAT) if KDAT.exists() else None
        if have is None:
            return {"state": "absent"}
        if rec is None or rec.get("sha256") != have:
            return {"state": "foreign"}
        ident = _identity(criu_bin)
        stale = [k for k, v in ident.items() if rec.get(k) != v]
        return {"state": "stale", "differs": stale} if stale else {"state": "kept"}
    except (OSError, subprocess.SubprocessError) as exc:
        return {"state": "failed", "detail": str(exc)}


def remove() -> bool:
    """Delete the cache and its record if the file is still the one Drums wrote (purge)."""
    rec = _read_record()
    if rec is None:
        return False
    if _digest(KDAT) == rec.get("sha256"):
        KDAT.unlink(missing_ok=True)
    RECORD.unlink(missing_ok=True)
    return True
