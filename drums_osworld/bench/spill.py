"""``spill``: what restoring a snapshot costs once the store has spilled it to disk.

Two post-setup checkpoints of the Writer task's desktop: ``memory`` stays in the state tmpfs,
``disk`` is spilled (``drums spill``) to the instance's spill directory. Round by round, each arm in
turn (rotated), one restore to agent-ready:

- ``tmpfs``: ``memory``, as every restore is without spilling;
- ``disk warm``: ``disk``, its files in the page cache (as after a recent restore);
- ``disk cold``: ``disk``, its images and layer dropped from the page cache first
  (``posix_fadvise(DONTNEED)`` on each of its files, after ``fdatasync``): read from the disk.

Also measured once: the spill itself (copy to disk and swap), and the sizes.
"""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from drums_core.errors import DrumsError

from . import common
from ..progress import progress
from .common import BenchInstance, ratio, rotated, summary

ARMS = ["tmpfs", "disk warm", "disk cold"]


def _drop_page_cache(root: Path) -> int:
    """Drop ``root``'s files from the page cache (no symlink followed); returns how many."""
    n = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            p = os.path.join(dirpath, name)
            try:
                fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:
                continue  # a whiteout, a socket: nothing cached
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                n += 1
            except OSError:
                pass
            finally:
                os.close(fd)
    return n


def run_spill(opts) -> dict:
    n = opts.rounds or (2 if opts.quick else 10)
    samples: dict[str, list[float]] = {a: [] for a in ARMS}
    criu: dict[str, list[float]] = {a: [] for a in ARMS}
    failures: list[dict] = []
    inst = common.instances(opts)["main"]
    spill_root = Path("/var/lib/drums/spill") / inst.name
    with BenchInstance(inst) as bi:
        c = bi.client
        host = common.host_facts([inst.name])
        bar = progress(3 + n * len(ARMS), "spill", opts.no_progress)
        mem = common.writer_checkpoint(c, name="spill-bench-memory")
        bar.update()
        disk = common.writer_checkpoint(c, name="spill-bench-disk")
        bar.update()
        t0 = time.monotonic()
        spilled = c.spill_snapshot(disk["id"])
        spill_s = time.monotonic() - t0
        where = {s["id"]: s["location"] for s in c.snapshots()}
        if spilled["action"] != "spilled" or where.get(disk["id"]) != "disk" or where.get(mem["id"]) != "memory":
            raise common.BenchError(f"the spill did not happen as planned: {spilled}, locations {where}")
        bar.update()
        dropped = 0
        for i in range(n):
            for arm in rotated(ARMS, i):
                snap = mem if arm == "tmpfs" else disk
                if arm == "disk cold":
                    dropped = _drop_page_cache(spill_root / disk["id"])
                try:
                    r = common.restore_ready(c, snap["id"])
                    samples[arm].append(r["ready"])
                    criu[arm].append(float(r["sessions"][0].get("timings", {}).get("criu") or 0.0))
                    errors = common.destroy_all(c, r["sessions"])
                    if errors:
                        failures.append({"arm": arm, "i": i, "destroy": errors})
                except (DrumsError, common.BenchError) as exc:
                    failures.append({"arm": arm, "i": i, **common.error_record(exc)})
                bar.update()
        bar.close()
        for s in (disk, mem):
            try:
                c.delete_snapshot(s["id"])
            except DrumsError as exc:
                failures.append({"delete": s["id"], **common.error_record(exc)})
        left_on_disk = sorted(p.name for p in spill_root.iterdir()) if spill_root.exists() else []
        cleanup = bi.stop()
    shutil.rmtree(spill_root, ignore_errors=True)
    stats = {a: summary(samples[a]) for a in ARMS}
    criu_stats = {a: summary(criu[a]) for a in ARMS}
    base = stats["tmpfs"]["p50"]
    table = [{"arm": a, "n": stats[a]["n"], "ready p50 s": stats[a]["p50"], "ready p95 s": stats[a]["p95"],
              "criu p50 s": criu_stats[a]["p50"], "ratio to tmpfs (p50)": ratio(stats[a]["p50"], base)}
             for a in ARMS]
    return {
        "suite": "spill", "quick": opts.quick, "host": host,
        "params": {"rounds": n, "arms": ARMS, "snapshot": "Writer task post-setup (pinned), spilled with drums spill",
                   "spill_dir": str(spill_root), "spill_fs": common._fs_type(str(spill_root.parent))},
        "stats": stats, "criu": criu_stats, "failures": failures, "cleanup": cleanup,
        "summary": {"snapshot MiB": round(disk["size"] / 2**20, 1), "spill s": round(spill_s, 3),
                    "tmpfs ready p50 s": base, "disk warm ready p50 s": stats["disk warm"]["p50"],
                    "disk cold ready p50 s": stats["disk cold"]["p50"],
                    "disk warm / tmpfs": ratio(stats["disk warm"]["p50"], base),
                    "disk cold / tmpfs": ratio(stats["disk cold"]["p50"], base),
                    "files dropped from the page cache per cold round": dropped,
                    "failures": len(failures), "left on disk": left_on_disk,
                    "leaked resources after": cleanup.get("leaked")},
        "table": table,
        "plot": {"title": "Restore to agent-ready: from the state tmpfs vs spilled to disk", "ylabel": "seconds",
                 "series": {a: samples[a] for a in ARMS}},
    }
