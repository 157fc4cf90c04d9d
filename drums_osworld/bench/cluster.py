"""``cluster``: the Ray rollout farm on this machine (issue 10's figures).

A local Ray cluster of two logical nodes (``ray.cluster_utils.Cluster`` on 127.0.0.1, no
dashboard, no usage stats), each with its own Drums daemon instance (``<instance>-ca`` on slots
base..base+3, ``<instance>-cb`` on base+4..base+7; each node takes 2 desktops at a time), and a
:class:`~drums_osworld.farm.pool.DrumsPool` over them. The task is fixed and scripted:
``tasks/os/drums-os-make-executable.json`` (its setup is checkpointed once on node a; a rollout
restores a sibling of that checkpoint, runs the task's ``drums_solution``, scores it with the
task's evaluator, waits for the sibling's liveness verdict and destroys it).

rollouts/hour
    ``R`` rollouts with 1, 2 and 4 workers (rollouts in flight at once, placed by the pool: node a
    first, node b when a is full, so 4 workers span both nodes), the arms interleaved round by
    round. Node b receives its copy of the checkpoint before the first round, so the arms measure
    steady-state rollouts, not the one-off transfer. Every rollout must score 1.0.
cross-node vs local branch
    One sibling on node a (which holds the checkpoint) against one sibling on node b after b's
    copy was deleted (ship: pack on a, pull through Ray, sha256 check and import on b; then
    restore), and one on b with its copy in place; the wall time of ``pool.branch`` until the
    sibling is ready, with the transfer's own phases.

Standalone: ``python -m drums_osworld.bench.cluster [--quick] [--json] [--out DIR]``; as a suite of
``drums bench`` once registered in :data:`drums_osworld.bench.SUITES`.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from drums_core.config import Instance, check_name
from drums_core.errors import DrumsError
from drums_core.records import json_default

from . import common
from ..progress import progress
from .common import BenchError, BenchInstance, rotated, summary

TASK = common.TASKS_DIR / "os" / "drums-os-make-executable.json"
WORKERS = [1, 2, 4]
NODE_CAPACITY = 2
NODE_SLOTS = 4  # per node daemon: the capacity plus room for the desktop being checkpointed

__all__ = ["main", "run_cluster"]


def _instances(opts) -> dict[str, Instance]:
    name = check_name(getattr(opts, "instance", None) or common.BENCH_NAME, "instance")
    base = getattr(opts, "slot_base", None)
    base = common.BENCH_SLOT_BASE if base is None else int(base)
    return {"a": Instance(name=f"{name}-ca", slot_base=base, slot_count=NODE_SLOTS),
            "b": Instance(name=f"{name}-cb", slot_base=base + NODE_SLOTS, slot_count=NODE_SLOTS)}


def _destroy(pool, siblings) -> list[str]:
    errors = []
    for s in siblings:
        try:
            pool.destroy(s)
        except DrumsError as exc:
            errors.append(f"{s.id}: {exc}")
    return errors


def _branch_once(pool, state, node: str) -> dict:
    t0 = time.monotonic()
    b = pool.branch(state, 1, nodes=[node])
    wall = time.monotonic() - t0
    try:
        if not b.ok:
            raise BenchError(f"branch on {node} failed: {[f.to_json() for f in b.failures]}")
        s = b.siblings[0]
        tr = b.transfers[0] if b.transfers else None
        return {"wall": round(wall, 4), "restore": b.timings[node].get("restore"),
                "criu": (s.session.get("timings") or {}).get("criu"),
                "transfer": tr["seconds"] if tr else None, "bytes": tr["bytes"] if tr else None,
                "verified": tr["verified"] if tr else None}
    finally:
        errs = _destroy(pool, b.siblings)
        if errs:
            raise BenchError(f"destroy failed: {errs}")


def run_cluster(opts) -> dict:
    try:
        import ray  # noqa: F401
    except ImportError as exc:
        raise BenchError(f"the cluster suite needs Ray: pip install 'drums[ray]' ({exc})") from exc
    from drums_osworld.farm.local import LocalCluster
    from drums_osworld.farm.pool import DrumsPool
    from drums_osworld.tasks import load_task

    task = load_task(TASK, require_drums_support=True)
    rounds = opts.rounds or (1 if opts.quick else 2)
    per_arm = 4 if opts.quick else 8  # --quick: still one rollout per worker of the widest arm (both nodes)
    branch_rounds = 1 if opts.quick else 6  # --quick: each branch arm once (the cross-node one ships once)
    insts = _instances(opts)
    benches = {k: BenchInstance(v) for k, v in insts.items()}
    for bi in benches.values():
        if bi.instance.slot_base + bi.instance.slot_count > 16384:
            raise BenchError("slot range out of bounds")
        bi._stop_leftover()
    host = common.host_facts([i.name for i in insts.values()])
    rows: dict[int, list[dict]] = {w: [] for w in WORKERS}
    branches: dict[str, list[dict]] = {"local (node a)": [], "cross-node (ship + restore on b)": [],
                                       "node b, copy in place": []}
    failures: list[dict] = []
    transfers_warm: dict | None = None
    bar = progress(rounds * len(WORKERS) + branch_rounds * 3 + (1 if opts.quick else 2), "cluster", opts.no_progress)
    cleanup: dict = {}
    lc = LocalCluster(nodes=2)
    pool = None
    t_start = time.monotonic()
    try:
        t = time.monotonic()
        lc.start()
        cluster_start = time.monotonic() - t
        t = time.monotonic()
        pool = DrumsPool(lc.node_configs([insts["a"], insts["b"]], capacities=[NODE_CAPACITY, NODE_CAPACITY],
                                         daemon_env={"DRUMS_LIVENESS_DELAY": "3"}))
        pool_start = time.monotonic() - t
        t = time.monotonic()
        state = pool.prepare(task, node="a")
        prepare_s = time.monotonic() - t
        transfers_warm = pool.ensure_copy(state, "b")
        bar.update()
        if not opts.quick:  # a smoke run measures nothing: it goes without the warm-up rollouts
            warm = pool.map_rollouts(task, task.solution, branches=2, state=state, concurrency=2)  # caches, imports
            if not warm.ok:
                raise BenchError(f"warm-up rollouts failed: {[r.to_json() for r in warm.results if r.error]}")
            bar.update()
        for i in range(rounds):
            for w in rotated(WORKERS, i):
                ro = pool.map_rollouts(task, task.solution, branches=per_arm, state=state, concurrency=w)
                bad = [r.to_json() for r in ro.results if r.error or r.score != 1.0]
                if bad:
                    failures.append({"workers": w, "round": i, "rollouts": bad})
                rs = ro.results
                rows[w].append({
                    "wall": ro.timings["rollouts"], "per_hour": round(ro.per_hour or 0.0, 1),
                    "scored_1": sum(1 for r in rs if r.score == 1.0), "n": len(rs),
                    "nodes": {n: sum(1 for r in rs if r.node == n) for n in pool.node_names},
                    "restore": [r.timings.get("restore") for r in rs],
                    "actions": [r.timings.get("actions") for r in rs],
                    "evaluate": [r.timings.get("evaluate") for r in rs],
                    "liveness_wait": [r.timings.get("liveness_wait") for r in rs],
                    "total": [r.timings.get("total") for r in rs], "transfers": len(ro.transfers)})
                bar.update()
                bar.set_postfix_str(" ".join(f"{k}w:{statistics.median(x['per_hour'] for x in v):.0f}/h"
                                             for k, v in rows.items() if v))
        arms = list(branches)
        for i in range(branch_rounds):
            for arm in rotated(arms, i):
                try:
                    if arm.startswith("cross"):
                        if "b" in state.copies:
                            pool.forget_copy(state, "b")
                        rec = _branch_once(pool, state, "b")
                        if rec["transfer"] is None:
                            raise BenchError("the cross-node branch did not ship the checkpoint")
                    elif arm.startswith("node b"):
                        pool.ensure_copy(state, "b")
                        rec = _branch_once(pool, state, "b")
                    else:
                        rec = _branch_once(pool, state, "a")
                    branches[arm].append(rec)
                except (DrumsError, BenchError) as exc:
                    failures.append({"arm": arm, "round": i, **common.error_record(exc)})
                bar.update()
        pool.delete_state(state)
    finally:
        bar.close()
        try:
            if pool is not None:
                pool.close(destroy_sessions=True)
        finally:
            lc.shutdown()
            for k, bi in benches.items():
                cleanup[k] = bi.stop()
    total_s = time.monotonic() - t_start
    stats = {w: {"per_hour": summary([r["per_hour"] for r in rows[w]], 1),
                 "rollout_s": summary([x for r in rows[w] for x in r["total"] if x is not None]),
                 "restore_s": summary([x for r in rows[w] for x in r["restore"] if x is not None]),
                 "liveness_wait_s": summary([x for r in rows[w] for x in r["liveness_wait"] if x is not None]),
                 "working_s": summary([t - (lw or 0.0) for r in rows[w]
                                       for t, lw in zip(r["total"], r["liveness_wait"], strict=True) if t is not None])}
             for w in WORKERS}
    base = stats[1]["per_hour"]["p50"]
    table = [{"arm": f"{w} worker{'s' if w > 1 else ''}", "rollouts/hour p50": stats[w]["per_hour"]["p50"],
              "speed-up vs 1": common.ratio(stats[w]["per_hour"]["p50"], base, 2),
              "rollout s p50": stats[w]["rollout_s"]["p50"], "restore s p50": stats[w]["restore_s"]["p50"],
              "liveness wait s p50": stats[w]["liveness_wait_s"]["p50"],
              "restore+act+score s p50": stats[w]["working_s"]["p50"],
              "rollouts": sum(r["n"] for r in rows[w]), "scored 1": sum(r["scored_1"] for r in rows[w]),
              "on a/b": "/".join(str(sum(r["nodes"].get(n, 0) for r in rows[w])) for n in ("a", "b"))}
             for w in WORKERS]
    bstats = {arm: summary([r["wall"] for r in recs]) for arm, recs in branches.items()}
    cross = branches["cross-node (ship + restore on b)"]
    phases = {ph: summary([r["transfer"][ph] for r in cross if r.get("transfer")])
              for ph in ("pack", "pull", "import", "total")}
    local_p50 = bstats["local (node a)"]["p50"]
    for arm, recs in branches.items():
        table.append({"arm": f"branch: {arm}", "wall s p50": bstats[arm]["p50"], "wall s p95": bstats[arm]["p95"],
                      "vs local": common.ratio(bstats[arm]["p50"], local_p50, 2),
                      "restore s p50": summary([r["restore"] for r in recs if r.get("restore") is not None])["p50"],
                      "transfer s p50": phases["total"]["p50"] if arm.startswith("cross") else None,
                      "n": len(recs)})
    snap_mib = round(cross[0]["bytes"] / 2**20, 1) if cross and cross[0].get("bytes") else None
    leaked = sum(c.get("leaked", 0) for c in cleanup.values())
    return {
        "suite": "cluster", "quick": opts.quick, "host": host,
        "params": {"task": task.id, "workers": WORKERS, "rounds": rounds, "rollouts_per_arm": per_arm,
                   "branch_rounds": branch_rounds, "node_capacity": NODE_CAPACITY, "liveness_delay": 3.0,
                   "instances": {k: {"name": v.name, "slot_base": v.slot_base, "slot_count": v.slot_count}
                                 for k, v in insts.items()},
                   "cluster_start_s": round(cluster_start, 2), "pool_start_s": round(pool_start, 2),
                   "prepare_s": round(prepare_s, 2), "bundle_mib": snap_mib},
        "rows": {"rollouts": {str(w): rows[w] for w in WORKERS}, "branches": branches,
                 "warm_transfer": transfers_warm},
        "stats": {"rollouts": {str(w): stats[w] for w in WORKERS}, "branches": bstats, "transfer_phases": phases},
        "table": table,
        "plot": {"title": "pool.branch(state, 1) until the sibling is ready", "ylabel": "seconds",
                 "series": {arm: [r["wall"] for r in recs] for arm, recs in branches.items()}},
        "summary": {
            **{f"rollouts/hour, {w} worker{'s' if w > 1 else ''}": stats[w]["per_hour"]["p50"] for w in WORKERS},
            "speed-up 4 workers vs 1": common.ratio(stats[4]["per_hour"]["p50"], base, 2),
            "local branch p50 s": local_p50,
            "cross-node branch p50 s": bstats["cross-node (ship + restore on b)"]["p50"],
            "cross-node / local": common.ratio(bstats["cross-node (ship + restore on b)"]["p50"], local_p50, 2),
            "transfer p50 s (pack / pull / import)": [phases[p]["p50"] for p in ("pack", "pull", "import")],
            "bundle MiB": snap_mib,
            "checksums verified": all(r.get("verified") for r in cross) if cross else None,
            "failures": len(failures), "leaked": leaked, "suite wall s": round(total_s, 1)},
        "failures": failures, "cleanup": cleanup,
        "notes": ["A rollout includes waiting for the sibling's liveness verdict (the daemon checks the "
                  "checkpointed process set 3 s after the restore): that wait overlaps across workers.",
                  "Both nodes share this machine's 2 cores: the figures show the farm's overheads and its "
                  "placement, not the scaling of a real multi-host cluster."],
    }


def main(argv: list[str] | None = None) -> int:
    from . import report

    p = argparse.ArgumentParser(prog="python -m drums_osworld.bench.cluster", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    p.add_argument("--out", type=Path, default=None, help="directory for cluster.json/.md/.png "
                                                          f"(default {common.DEFAULT_OUT})")
    p.add_argument("--quick", action="store_true", help="small counts: a smoke test, not a measurement")
    p.add_argument("--rounds", type=int, default=None, help="rounds of the rollouts/hour arms")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--instance", default=common.BENCH_NAME, help="instance name prefix (nodes: <name>-ca, <name>-cb)")
    p.add_argument("--slot-base", type=int, default=common.BENCH_SLOT_BASE, help="first of the 8 slots used")
    opts = p.parse_args(argv)
    try:
        res = run_cluster(opts)
    except BenchError as exc:
        print(f"drums bench cluster: {exc}", file=sys.stderr)
        return 1
    report.write(res, opts.out or common.DEFAULT_OUT)
    if opts.json:
        print(json.dumps(res, indent=1, default=json_default))
    else:
        print(report.markdown(res))
        print(f"(written: {', '.join(res['files'].values())})")
    return 0 if not res["failures"] and not res["summary"]["leaked"] else 1


if __name__ == "__main__":
    sys.exit(main())
