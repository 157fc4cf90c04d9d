"""``fanout`` and ``soak``: many siblings of one checkpoint at once.

fanout
    1, 4, 8 and 16 siblings restored at once (one ``restore(count=n)`` call, the branch API) from
    the Writer task's post-setup checkpoint, the sizes interleaved round by round. The call asks
    the daemon to apply the agent-ready test to every sibling before it returns (a mapped window
    titled LibreOffice Writer, more than 10% of the pixels non-blank, counted exactly; plus the
    guest port answering), so the call's wall time is the time until all are agent-ready. The bench
    then checks every sibling itself: a sibling it does not find agent-ready on its first look
    voids the daemon's verdict for that round, and the round counts the bench's own time instead.
    The bench's re-check of 16 desktops at once costs seconds of python-xlib on 2 cores; when it
    finished is reported as ``recheck``. Then every sibling's liveness verdict (its checkpointed
    processes still there ``liveness_delay`` seconds later) and, at the moment of readiness,
    whether each sibling's process set is complete. Failed restores are counted with their errors.

soak
    16-way fan-outs of that checkpoint until at least 1,000 restores: every failure with CRIU's own
    error lines, liveness failures, the daemon's fds/threads/RSS before and after, sessions, links
    and mounts of the instance between fan-outs, and everything of the instance left on the host
    after it is stopped (must be nothing).
"""
from __future__ import annotations

import os
import statistics
import time
from drums_core.errors import DrumsError

from . import common
from ..progress import progress
from .common import BenchInstance, rotated, summary

TCLONE_16 = {"wall_s": 10.0, "memory_gb": 9.0}


def _alive_at_ready(client, sessions: list[dict], expected: list) -> list[dict]:
    want = {(int(p[0]), p[1]) for p in expected}
    missing = []
    for s in sessions:
        have = {(p["nspid"], p["comm"]) for p in client.processes(s["id"])}
        gone = sorted(want - have)
        if gone:
            missing.append({"session": s["id"], "missing": [f"{c} ({n})" for n, c in gone]})
    return missing


def _check_overhead(client, snap_id: str, n: int = 5) -> dict:
    """What the bench's agent-ready check costs on a desktop that is already ready."""
    r = common.restore_ready(client, snap_id)
    d = common.route(r["sessions"][0])
    costs = []
    for _ in range(n):
        t0 = time.monotonic()
        common.wait_agent_ready(d, t0)
        costs.append(time.monotonic() - t0)
    common.destroy_all(client, r["sessions"])
    return summary(costs)


def run_fanout(opts) -> dict:
    rounds = opts.rounds or (1 if opts.quick else 5)
    sizes = [1, 4] if opts.quick else [1, 4, 8, 16]
    rows: dict[int, list[dict]] = {n: [] for n in sizes}
    failures: list[dict] = []
    with BenchInstance(common.instances(opts)["main"]) as bi:
        c = bi.client
        host = common.host_facts([bi.instance.name])
        bar = progress(1 + rounds * len(sizes), "fanout", opts.no_progress)
        snap = common.writer_checkpoint(c)
        expected = snap.get("processes") or []
        overhead = _check_overhead(c, snap["id"], 3 if opts.quick else 10)
        bar.update()
        for i in range(rounds):
            for n in rotated(sizes, i):
                sessions: list[dict] = []
                try:
                    r = common.restore_ready(c, snap["id"], count=n, daemon_checks=True)
                    sessions = r["sessions"]
                    missing = _alive_at_ready(c, sessions, expected)
                    live_bad = common.liveness(c, sessions)
                    ready = r["daemon_ready"] if r["daemon_ready"] is not None else r["ready"]
                    rows[n].append({"call": round(r["call"], 4), "ready": round(ready, 4),
                                    "recheck": round(r["ready"], 4), "confirmed": r["confirmed"],
                                    "daemon_verdict_voided": r["daemon_ready"] is None,
                                    "each_ready": [round(x, 4) for x in r["each_ready"]],
                                    "daemon_ready": [round(s["timings"].get("ready", 0), 4) for s in sessions],
                                    "daemon_criu": [round(s["timings"].get("criu", 0), 4) for s in sessions],
                                    "incomplete_at_ready": missing, "liveness_failures": live_bad})
                except (DrumsError, common.BenchError) as exc:
                    failures.append({"count": n, "round": i, **common.error_record(exc)})
                finally:
                    errs = common.destroy_all(c, sessions)
                    if errs:
                        failures.append({"count": n, "round": i, "destroy_errors": errs})
                bar.update()
                bar.set_postfix_str(" ".join(f"{k}:{statistics.median(x['ready'] for x in v):.2f}s"
                                             for k, v in rows.items() if v))
        bar.close()
        cleanup = bi.stop()
    table = []
    stats = {}
    for n in sizes:
        st = {"call": summary([x["call"] for x in rows[n]]), "ready": summary([x["ready"] for x in rows[n]]),
              "recheck": summary([x["recheck"] for x in rows[n]]),
              "per_sibling_daemon_ready": summary([y for x in rows[n] for y in x["daemon_ready"]]),
              "per_sibling_criu": summary([y for x in rows[n] for y in x["daemon_criu"]])}
        stats[n] = st
        alive_bad = sum(len(x["incomplete_at_ready"]) + len(x["liveness_failures"]) for x in rows[n])
        table.append({"siblings": n, "rounds ok": len(rows[n]), "call p50 s": st["call"]["p50"],
                      "all agent-ready p50 s": st["ready"]["p50"], "all agent-ready p95 s": st["ready"]["p95"],
                      "daemon verdicts voided": sum(1 for x in rows[n] if x["daemon_verdict_voided"]),
                      "bench re-check done p50 s": st["recheck"]["p50"],
                      "per-sibling criu p50 s": st["per_sibling_criu"]["p50"],
                      "failed restores": sum(1 for f in failures if f.get("count") == n),
                      "not alive": alive_bad})
    table.append({"siblings": "TClone 16 clones", "all agent-ready p50 s": TCLONE_16["wall_s"]})
    big = max(sizes)
    big_p50 = stats[big]["ready"]["p50"]
    return {
        "suite": "fanout", "quick": opts.quick, "host": host,
        "params": {"rounds": rounds, "sizes": sizes, "snapshot": snap["id"],
                   "snapshot_size_mib": round(snap["size"] / 2**20, 1), "liveness_delay": bi.liveness_delay},
        "check_overhead": overhead,
        "rows": {str(n): rows[n] for n in sizes}, "stats": {str(n): stats[n] for n in sizes},
        "summary": {f"{big} siblings all agent-ready p50 s": big_p50,
                    f"{big} siblings all agent-ready p95 s": stats[big]["ready"]["p95"],
                    "target 16 siblings < 3 s": bool(big == 16 and big_p50 is not None and big_p50 < 3.0),
                    "failed restores": len(failures),
                    "not alive": sum(r["not alive"] for r in table if isinstance(r.get("not alive"), int)),
                    "bench check overhead p50 s": overhead["p50"],
                    "daemon verdicts voided by the bench's check": sum(
                        1 for v in rows.values() for x in v if x["daemon_verdict_voided"]),
                    "leaked resources after": cleanup.get("leaked")},
        "failures": failures, "cleanup": cleanup, "references": {"tclone_16": TCLONE_16},
        "table": table,
        "plot": {"title": "Siblings restored at once: wall until all are agent-ready", "ylabel": "seconds",
                 "series": {f"{n} siblings": [x["ready"] for x in rows[n]] for n in sizes}},
    }


def _instance_state(bi: BenchInstance) -> dict:
    inst = bi.instance
    mounts = 0
    with open("/proc/self/mountinfo") as f:
        for line in f:
            if line.split()[4].startswith(f"{inst.sessions_dir}/"):
                mounts += 1
    leaks = common.instance_leaks(inst)
    # between fan-outs no session exists, so any live process tagged with the instance's run is a
    # leaked tree (e.g. a failed restore whose pivoted tasks the rollback did not find)
    return {"sessions": len(bi.client.list()), "session_mounts": mounts, "links": len(leaks["links"]),
            "tagged_processes": len(leaks["processes"]),
            "x11links": len(leaks["x11links"]), "session_dirs": len(os.listdir(inst.sessions_dir))
            if inst.sessions_dir.exists() else 0}


def run_soak(opts) -> dict:
    width = 4 if opts.quick else 16
    target = opts.rounds * width if opts.rounds else (8 if opts.quick else 1000)
    fanouts = -(-target // width)
    failures: list[dict] = []
    live_bad: list[dict] = []
    between: list[dict] = []
    walls: list[float] = []
    restores = 0
    with BenchInstance(common.instances(opts)["main"]) as bi:
        c = bi.client
        host = common.host_facts([bi.instance.name])
        bar = progress(fanouts, "soak", opts.no_progress)
        snap = common.writer_checkpoint(c)
        before = bi.daemon_stats()
        t_start = time.monotonic()
        for i in range(fanouts):
            sessions: list[dict] = []
            try:
                t0 = time.monotonic()
                sessions = c.restore(snap["id"], count=width)
                walls.append(time.monotonic() - t0)
                restores += len(sessions)
                # a cheap agent-ready confirmation of one sibling per fan-out (all were checked by the daemon)
                common.wait_agent_ready(common.route(sessions[i % len(sessions)]), time.monotonic(),
                                        timeout=30)
                live_bad += [{"fanout": i, **b} for b in common.liveness(c, sessions)]
            except (DrumsError, common.BenchError) as exc:
                restores += width  # the call is all-or-nothing: its siblings were attempted and rolled back
                failures.append({"fanout": i, **common.error_record(exc)})
            finally:
                errs = common.destroy_all(c, sessions)
                if errs:
                    failures.append({"fanout": i, "destroy_errors": errs})
            state = _instance_state(bi)
            if any(state.values()):
                between.append({"fanout": i, **state})
            bar.update()
            bar.set_postfix_str(f"restores={restores} failed={len(failures)} not-alive={len(live_bad)}")
        elapsed = time.monotonic() - t_start
        bar.close()
        after = bi.daemon_stats()
        stats = c.stats()
        c.delete_snapshot(snap["id"])
        cleanup = bi.stop()
    failed = len([f for f in failures if "destroy_errors" not in f])
    return {
        "suite": "soak", "quick": opts.quick, "host": host,
        "params": {"width": width, "fanouts": fanouts, "target_restores": target, "snapshot": snap["id"],
                   "liveness_delay": bi.liveness_delay},
        "summary": {"restores attempted": restores, "failed fan-outs": failed,
                    "liveness failures": len(live_bad), "destroy errors": len(failures) - failed,
                    "leaks between fan-outs": len(between), "leaked resources after": cleanup.get("leaked"),
                    "daemon fds before/after": [before.get("fds"), after.get("fds")],
                    "daemon threads before/after": [before.get("threads"), after.get("threads")],
                    "daemon RSS KiB before/after": [before.get("vmrss"), after.get("vmrss")],
                    "fan-out call p50 s": summary(walls)["p50"], "elapsed s": round(elapsed, 1),
                    "target 0 failed of >= 1000, 0 leaked": bool(restores >= 1000 and failed == 0
                                                                 and not live_bad and cleanup.get("leaked") == 0)},
        "daemon_counters": stats.get("counters"), "failures": failures, "liveness_failures": live_bad,
        "between_fanouts": between, "daemon_before": before, "daemon_after": after, "cleanup": cleanup,
        "fanout_walls": [round(w, 4) for w in walls],
        "table": [{"restores": restores, "fan-outs": fanouts, "width": width, "failed fan-outs": failed,
                   "liveness failures": len(live_bad), "leaked after": cleanup.get("leaked"),
                   "fan-out p50 s": summary(walls)["p50"], "fan-out p95 s": summary(walls)["p95"]},
                  {"restores": "prototype: 1700", "failed fan-outs": 0}],
        "plot": {"title": f"Soak: {width}-way fan-outs, wall of each restore call", "ylabel": "seconds",
                 "kind": "line", "xlabel": "fan-out", "series": {"restore call": walls}},
    }
