"""``restore-costs``: CRIU's fixed costs, one lever per arm, measured side by side (issue 32).

One in-process :class:`~drums_core.session.supervisor.Supervisor` (the ``profile`` instance's
slots); for each image (``default`` and ``osworld``) a Writer desktop after its task's setup is
checkpointed; then rounds, the arms taking turns going first, each arm a state of the host's CRIU:

- ``kdat probed``: no ``/run/criu.kdat`` (the file is moved aside for the call): CRIU probes the
  kernel's features on every run, as it did on this host before :mod:`drums_core.host.criu_cache`;
- ``kdat cached``: the cache the daemon makes once per boot (:func:`criu_cache.ensure`);
- ``filesize validation``: the cache, and CRIU checking a restored task's mapped files by their
  size instead of their ELF build-id (``--file-validation filesize``,
  :data:`drums_core.session.criu.FILE_VALIDATION`); the two arms before it use CRIU's default
  (build-id).

Per arm and image: the restore call to agent-ready, CRIU's step of it, and the CPU the restore
cost (CRIU and the helpers it ran, from this process's reaped-children counters, plus the restored
tasks' own: their counters start at zero on restore); and a ``leave_running`` checkpoint of a
held sibling (the call, and CRIU's dump). The figure of each lever: what it saves per restore and
per checkpoint, in wall and in CPU milliseconds. Safety: the cache is what ``criu check`` found on
this boot, kernel and CRIU; a cache of another is made again (``criu_cache``), and a dump still
freezes the whole tree before it reads anything, as before.

The host's cache is as it was at the end (made again if the run is interrupted). Nothing else
should run CRIU on the host meanwhile: the file is the host's.
"""
from __future__ import annotations

import contextlib
import os
import time

from . import common, inprocess
from ..progress import progress
from .common import rotated, summary
from .floor import _children_cpu, _tasks_cpu

ARMS = ("kdat probed", "kdat cached", "filesize validation")
# each lever against the arm before it
LEVERS = {"kdat cache": ("kdat probed", "kdat cached"), "filesize validation": ("kdat cached", "filesize validation")}
IMAGES = ("default", "osworld")


@contextlib.contextmanager
def _arm(arm: str):
    from drums_core.host import criu_cache
    from drums_core.session import criu

    aside = criu_cache.RUN / f".criu.kdat.bench-{os.getpid()}"
    saved = criu.FILE_VALIDATION
    criu.FILE_VALIDATION = "filesize" if arm == "filesize validation" else None
    try:
        if arm == "kdat probed":
            if criu_cache.KDAT.exists():
                os.replace(criu_cache.KDAT, aside)
            try:
                yield
            finally:
                if aside.exists():
                    os.replace(aside, criu_cache.KDAT)
        else:
            got = criu_cache.ensure()
            if got["state"] not in ("made", "kept", "tmpfs"):
                raise common.BenchError(f"the kdat cache could not be made: {got}")
            yield
    finally:
        criu.FILE_VALIDATION = saved


def _restore(sup, snap) -> dict:
    cpu0 = _children_cpu()
    t0 = time.perf_counter()
    [r] = sup.restore(snap.id)
    call = time.perf_counter() - t0
    criu_cpu = _children_cpu() - cpu0
    row = {"call": call, "criu": r.timings.get("steps", {}).get("criu", 0.0),
           "cpu": criu_cpu + _tasks_cpu(r.init_pid)}
    sup.destroy(r.id)
    return row


def _checkpoint(sup, held, i: int) -> dict:
    from drums_core.session import criu

    with inprocess.dump_seconds(criu) as seen:
        t0 = time.perf_counter()
        snap = sup.checkpoint(held.id, name=f"costs-lr{i}", leave_running=True)
        call = time.perf_counter() - t0
    sup.keeper.delete(snap.id)
    return {"call": call, "criu": seen[-1] if seen else None}


def run_restore_costs(opts) -> dict:
    from drums_core.host import criu_cache

    n = opts.rounds or (2 if opts.quick else 15)
    images = IMAGES[-1:] if opts.quick else IMAGES  # a smoke run: the osworld desktop alone
    inst = common.instances(opts)["profile"]
    host = {**common.host_facts([inst.name]), "run_is_tmpfs": criu_cache.status()["state"] == "tmpfs"}
    rows: dict = {img: {a: {"restore": [], "checkpoint": []} for a in ARMS} for img in images}
    failures: list[dict] = []
    cleanup: dict = {}
    bar = progress(len(images) * (1 + n * len(ARMS)), "restore-costs", opts.no_progress)
    try:
        with inprocess.supervisor(inst, cleanup) as sup:
            for img in images:
                snap = inprocess.writer_snapshot(sup, f"costs-{img}", image=img)
                [held] = sup.restore(snap.id)
                bar.update()
                for i in range(n):
                    for arm in rotated(list(ARMS), i):
                        bar.set_postfix_str(f"{img}: {arm}, round {i + 1}/{n}")
                        try:
                            with _arm(arm):
                                rows[img][arm]["restore"].append(_restore(sup, snap))
                                rows[img][arm]["checkpoint"].append(_checkpoint(sup, held, i))
                        except Exception as exc:  # noqa: BLE001 - a failed call is a figure of its arm
                            failures.append({"image": img, "arm": arm, "error": common.error_record(exc)})
                        bar.update()
                sup.destroy(held.id)
    finally:
        bar.close()
        criu_cache.ensure()  # the host's cache as a daemon start leaves it
    return _report(opts, host, inst.name, n, rows, failures, cleanup)


def _ms(x):
    return None if x is None else round(x * 1e3, 1)


def _report(opts, host, instance, n, rows, failures, cleanup) -> dict:
    table, stats, summ = [], {}, {}
    for img in rows:
        stats[img] = {}
        for arm in ARMS:
            rs, cs = rows[img][arm]["restore"], rows[img][arm]["checkpoint"]
            st = {"restore_call_s": summary([r["call"] for r in rs]),
                  "restore_criu_s": summary([r["criu"] for r in rs]),
                  "restore_cpu_s": summary([r["cpu"] for r in rs]),
                  "checkpoint_call_s": summary([c["call"] for c in cs]),
                  "dump_s": summary([c["criu"] for c in cs if c["criu"] is not None])}
            stats[img][arm] = st
            table.append({"image": img, "arm": arm, "n": st["restore_call_s"]["n"],
                          "restore call p50 ms": _ms(st["restore_call_s"]["p50"]),
                          "criu p50 ms": _ms(st["restore_criu_s"]["p50"]),
                          "restore CPU p50 ms": _ms(st["restore_cpu_s"]["p50"]),
                          "checkpoint call p50 ms": _ms(st["checkpoint_call_s"]["p50"]),
                          "dump p50 ms": _ms(st["dump_s"]["p50"])})
        for lever, (before, after) in LEVERS.items():
            a_st, b_st = stats[img][before], stats[img][after]

            def saved(key, a_st=a_st, b_st=b_st):
                a, b = a_st[key]["p50"], b_st[key]["p50"]
                return None if a is None or b is None else _ms(a - b)

            summ[f"{img}: {lever} saves per restore, wall ms (p50)"] = saved("restore_call_s")
            summ[f"{img}: {lever} saves per restore, CPU ms (p50)"] = saved("restore_cpu_s")
            summ[f"{img}: {lever} saves per checkpoint, wall ms (p50)"] = saved("checkpoint_call_s")
        last = stats[img][ARMS[-1]]
        summ[f"{img}: restore call p50 ms, every lever"] = _ms(last["restore_call_s"]["p50"])
        summ[f"{img}: restore CPU p50 ms, every lever"] = _ms(last["restore_cpu_s"]["p50"])
        summ[f"{img}: checkpoint call p50 ms, every lever"] = _ms(last["checkpoint_call_s"]["p50"])
    summ["failures"] = len(failures)
    summ["leaked resources after"] = cleanup.get("leaked")
    return {"suite": "restore-costs", "quick": opts.quick, "host": host,
            "params": {"rounds": n, "instance": instance, "arms": list(ARMS), "images": list(rows)},
            "rows": rows, "stats": stats, "failures": failures, "cleanup": cleanup, "summary": summ,
            "table": table,
            "plot": {"title": "Restore call by arm", "ylabel": "milliseconds",
                     "series": {f"{img} {arm}": [r["call"] * 1e3 for r in rows[img][arm]["restore"]]
                                for img in rows for arm in ARMS}}}
