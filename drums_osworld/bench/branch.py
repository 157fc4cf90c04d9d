"""``branch`` and ``checkpoint``: what a reset costs, cold against restored, and what a checkpoint costs.

branch
    Arms, interleaved round by round (each round runs every arm once, in rotated order):

    - ``cold+setup``: a cold desktop (Xvfb, openbox, guest server) plus the Writer task's real
      setup (``tasks/libreoffice_writer/drums-writer-type-and-save.json``: its ``execute``,
      ``launch ["libreoffice","--writer"]`` and wait steps), to agent-ready;
    - ``cold+launch``: a cold desktop plus ``launch ["libreoffice","--writer"]`` alone, to
      agent-ready (the setup the prototype's 3.12 s figure covers);
    - ``restore``: restore of the post-setup checkpoint of that task, to agent-ready.

    Agent-ready is a mapped window titled ``LibreOffice Writer`` and a screenshot differing from
    blank in more than 10% of its pixels (:func:`common.wait_agent_ready`), timed from the first
    call. Every restored desktop's liveness verdict is collected afterwards (not timed).

checkpoint
    Arms: ``dump`` (the desktop is consumed), ``dump+restore`` (what leave-running was until the
    desktop could go on untouched: a dump that ends it, then a restore) and ``dump+leave-running``
    (it goes on, with the same id and address), each on a fresh cold Writer desktop after the
    task's setup: CRIU dump time, the call's wall time (with the restore, for ``dump+restore``),
    image size, and for the last two the time until a desktop is agent-ready again.
"""
from __future__ import annotations

import contextlib
import statistics
import time

from drums_core.errors import DrumsError

from . import common
from ..progress import progress
from .common import BenchInstance, pct, ratio, rotated, summary

PROTOTYPE = {"cold_setup_p50": 3.12, "restore_p50": 0.87, "ratio": 3.6, "dump_s": 0.35, "dump_mib": 236}
TASK_NAME = f"tasks/{common.WRITER_TASK.relative_to(common.TASKS_DIR)}"
TCLONE = {"branch_s": 3.7, "stock_criu_s": 12.8, "kvm_snapshot_s": 18.2}


def run_branch(opts) -> dict:
    rounds = opts.rounds or (2 if opts.quick else 10)
    arms = ["cold+setup", "cold+launch", "restore"]
    samples: dict[str, list[float]] = {a: [] for a in arms}
    by_round: dict[str, dict[int, float]] = {a: {} for a in arms}
    detail: dict[str, list[dict]] = {a: [] for a in arms}
    failures: list[dict] = []
    live_failures: list[dict] = []
    with BenchInstance(common.instances(opts)["main"]) as bi:
        c = bi.client
        host = common.host_facts([bi.instance.name])
        bar = progress(1 + rounds * len(arms), "branch", opts.no_progress)
        snap = common.writer_checkpoint(c)
        bar.update()
        for i in range(rounds):
            for arm in rotated(arms, i):
                try:
                    if arm == "restore":
                        r = common.restore_ready(c, snap["id"])
                        s = r["sessions"][0]
                        samples[arm].append(r["ready"])
                        by_round[arm][i] = r["ready"]
                        detail[arm].append({"ready": round(r["ready"], 4), "call": round(r["call"], 4),
                                            "nonblank": r["nonblank"][0], "daemon": s.get("timings", {})})
                        live_failures += common.liveness(c, r["sessions"])
                        common.destroy_all(c, r["sessions"])
                    else:
                        r = common.boot_writer(c, launch_only=(arm == "cold+launch"))
                        samples[arm].append(r["ready"])
                        by_round[arm][i] = r["ready"]
                        detail[arm].append({"ready": round(r["ready"], 4), "boot": round(r["boot"], 4),
                                            "setup": round(r["setup"], 4), "nonblank": r["nonblank"],
                                            "daemon": r["session_timings"]})
                        r["desktop"].close()
                except (DrumsError, common.BenchError) as exc:
                    failures.append({"arm": arm, "round": i, **common.error_record(exc)})
                bar.update()
                bar.set_postfix_str(" ".join(f"{a}={statistics.median(v):.2f}s" for a, v in samples.items() if v))
        bar.close()
        with contextlib.suppress(DrumsError):
            c.delete_snapshot(snap["id"])
        cleanup = bi.stop()
    stats = {a: summary(v) for a, v in samples.items()}
    p50 = {a: stats[a]["p50"] for a in arms}
    def paired_ratios(arm: str) -> list[float]:
        rest = by_round["restore"]
        return [v / rest[i] for i, v in by_round[arm].items() if i in rest]

    paired = paired_ratios("cold+setup")
    paired_launch = paired_ratios("cold+launch")
    restore_p50 = p50["restore"]
    summ = {
        "cold+setup p50 s": p50["cold+setup"], "cold+launch p50 s": p50["cold+launch"],
        "restore p50 s": restore_p50, "restore p95 s": stats["restore"]["p95"],
        "speedup cold+setup/restore (p50s)": ratio(p50["cold+setup"], restore_p50, 2),
        "speedup cold+setup/restore (median of paired rounds)": round(pct(paired, 50), 2) if paired else None,
        "speedup cold+launch/restore (p50s)": ratio(p50["cold+launch"], restore_p50, 2),
        "speedup cold+launch/restore (median of paired rounds)": (round(pct(paired_launch, 50), 2)
                                                                  if paired_launch else None),
        "target restore <= cold+setup/8 and < 0.5 s": bool(
            restore_p50 is not None and p50["cold+setup"] is not None
            and restore_p50 <= p50["cold+setup"] / 8 and restore_p50 < 0.5),
        "failures": len(failures), "liveness failures": len(live_failures),
        "leaked resources after": cleanup.get("leaked"),
    }
    daemon_restore = {k: summary([d["daemon"].get(k) for d in detail["restore"] if d["daemon"].get(k) is not None])
                      for k in ("criu", "network", "ready")}
    table = [{"arm": a, **{k: stats[a][k] for k in ("n", "p50", "p95", "mean", "min", "max")},
              "vs restore (p50)": ratio(p50[a], restore_p50, 2)} for a in arms]
    table += [{"arm": "prototype cold+setup", "p50": PROTOTYPE["cold_setup_p50"],
               "vs restore (p50)": PROTOTYPE["ratio"]},
              {"arm": "prototype restore", "p50": PROTOTYPE["restore_p50"]},
              {"arm": "TClone branch", "p50": TCLONE["branch_s"]}]
    return {
        "suite": "branch", "quick": opts.quick, "host": host,
        "params": {"rounds": rounds, "arms": arms, "task": TASK_NAME,
                   "agent_ready": f"mapped window titled '{common.WRITER_TITLE}' and > "
                                  f"{common.READY_FRACTION:.0%} non-blank pixels", "snapshot": snap["id"],
                   "snapshot_size_mib": round(snap["size"] / 2**20, 1),
                   "snapshot_boot": snap.get("_boot")},
        "arms": {a: {"samples": [round(x, 4) for x in samples[a]], "stats": stats[a], "detail": detail[a]}
                 for a in arms},
        "daemon_restore_phases": daemon_restore,
        "summary": summ, "failures": failures, "liveness_failures": live_failures, "cleanup": cleanup,
        "references": {"prototype": PROTOTYPE, "tclone": TCLONE},
        "table": table,
        "plot": {"title": "Writer desktop to agent-ready: cold + setup vs restore", "ylabel": "seconds",
                 "series": samples, "log": True},
    }


def run_checkpoint(opts) -> dict:
    rounds = opts.rounds or (1 if opts.quick else 5)
    arms = ["dump", "dump+leave-running", "dump+restore"]
    rows: dict[str, list[dict]] = {a: [] for a in arms}
    failures: list[dict] = []
    with BenchInstance(common.instances(opts)["main"]) as bi:
        c = bi.client
        host = common.host_facts([bi.instance.name])
        bar = progress(rounds * len(arms), "checkpoint", opts.no_progress)
        for i in range(rounds):
            for arm in rotated(arms, i):
                desk = None
                try:
                    desk = common.boot_writer(c)["desktop"]
                    time.sleep(0.5)
                    leave = arm == "dump+leave-running"
                    t0 = time.monotonic()
                    snap = c.checkpoint(desk.id, name=f"ckpt-{i}-{arm.replace('+', '-')}", leave_running=leave)
                    sibling = None
                    if arm == "dump+restore":  # the former leave-running: a dump that ends it, then a restore
                        desk.closed = True
                        (sibling,) = c.restore(snap["id"])
                    wall = time.monotonic() - t0
                    row = {"dump": snap["dump_seconds"], "call": round(wall, 4),
                           "size_mib": round(snap["size"] / 2**20, 2),
                           "images_mib": round(common.snapshot_images_bytes(bi.instance, snap["id"]) / 2**20, 2),
                           "processes": len(snap.get("processes") or [])}
                    if leave:  # the desktop went on running
                        back = common.wait_agent_ready(common.route(c.get(desk.id)), t0)
                        row["agent_ready_again"] = round(back["seconds"], 4)
                        row["session_timings"] = c.get(desk.id).get("timings", {})
                        desk.close()
                    elif sibling is not None:
                        back = common.wait_agent_ready(common.route(sibling), t0)
                        row["agent_ready_again"] = round(back["seconds"], 4)
                        c.destroy(sibling["id"])
                    else:
                        desk.closed = True
                    desk = None
                    rows[arm].append(row)
                    c.delete_snapshot(snap["id"])
                except (DrumsError, common.BenchError) as exc:
                    failures.append({"arm": arm, "round": i, **common.error_record(exc)})
                finally:
                    if desk is not None:
                        with contextlib.suppress(DrumsError):
                            desk.close()
                bar.update()
        bar.close()
        cleanup = bi.stop()
    stats = {a: {k: summary([r[k] for r in rows[a] if r.get(k) is not None])
                 for k in ("dump", "call", "size_mib", "images_mib", "agent_ready_again")} for a in arms}
    table = []
    for a in arms:
        table.append({"arm": a, "n": stats[a]["dump"]["n"], "dump p50 s": stats[a]["dump"]["p50"],
                      "dump p95 s": stats[a]["dump"]["p95"], "call p50 s": stats[a]["call"]["p50"],
                      "images MiB p50": stats[a]["images_mib"]["p50"], "snapshot MiB p50": stats[a]["size_mib"]["p50"],
                      "agent-ready again p50 s": stats[a]["agent_ready_again"]["p50"]})
    table.append({"arm": "prototype", "dump p50 s": PROTOTYPE["dump_s"], "images MiB p50": PROTOTYPE["dump_mib"]})
    dump_p50 = stats["dump"]["dump"]["p50"]
    return {
        "suite": "checkpoint", "quick": opts.quick, "host": host,
        "params": {"rounds": rounds, "arms": arms, "task": TASK_NAME},
        "arms": {a: {"rows": rows[a], "stats": stats[a]} for a in arms},
        "summary": {"dump p50 s": dump_p50, "dump+leave-running call p50 s": stats["dump+leave-running"]["call"]["p50"],
                    "dump+restore (the former leave-running) call p50 s": stats["dump+restore"]["call"]["p50"],
                    "leave-running call / dump+restore call": common.ratio(stats["dump+leave-running"]["call"]["p50"],
                                                                           stats["dump+restore"]["call"]["p50"]),
                    "images MiB p50": stats["dump"]["images_mib"]["p50"],
                    "target dump <= 0.35 s": bool(dump_p50 is not None and dump_p50 <= PROTOTYPE["dump_s"]),
                    "failures": len(failures), "leaked resources after": cleanup.get("leaked")},
        "failures": failures, "cleanup": cleanup, "references": {"prototype": PROTOTYPE},
        "table": table,
        "plot": {"title": "Checkpoint of the Writer desktop: CRIU dump and whole call", "ylabel": "seconds",
                 "series": {f"{a} ({k})": [r[k] for r in rows[a]] for a in arms for k in ("dump", "call")}},
    }
