"""``drums bench cluster --quick`` end to end: a local two-node Ray cluster, rollouts with 1, 2 and
4 workers, local and cross-node branches; every rollout scored 1, checksums verified, nothing of
either node's instance left on the host. (A smoke test: the figures themselves are not asserted.)"""
from __future__ import annotations

import argparse
import json

import pytest

from tests.support.raylib import require_ray

pytestmark = pytest.mark.timeout(900)


def test_cluster_bench_quick_runs_clean(tmp_path):
    from drums_osworld.bench import report
    from drums_osworld.bench.cluster import run_cluster
    from tests.support.suite import INSTANCE, SPARE_SLOTS, require_root

    require_root()
    require_ray()
    opts = argparse.Namespace(quick=True, rounds=None, no_progress=True, instance=f"{INSTANCE.name}-bc",
                              slot_base=SPARE_SLOTS[8])
    res = run_cluster(opts)
    report.write(res, tmp_path)
    print(report.markdown(res))
    s = res["summary"]
    assert res["failures"] == [], json.dumps(res["failures"])[:3000]
    assert s["leaked"] == 0, res["cleanup"]
    assert s["checksums verified"] is True
    for w in ("1", "2", "4"):
        rows = res["rows"]["rollouts"][w]
        assert rows and all(r["scored_1"] == r["n"] for r in rows), rows
    assert all(res["rows"]["branches"][arm] for arm in res["rows"]["branches"])
    assert (tmp_path / "cluster-quick.json").exists() and (tmp_path / "cluster-quick.md").exists()
