"""Restore time of a ``nat`` snapshot against a ``none`` one, side by side in one run (not a test).

    python -m tests.bench.nat_restore [--rounds 10] [--json]     (from the checkout)

On its own daemon instance and a stand-in upstream (tests/support/netstandin.py), it checkpoints a bare
``none`` session and a bare ``nat`` one, then restores each ``--rounds`` times, alternating, and
prints the median of the restore's ``ready`` time and of its network wiring (veth, addresses, and
for ``nat`` the route, the session's chain and forwarding: ``timings["network"] - timings["criu"]``,
which runs after CRIU while the display is awaited) for both and their ratios, plus
the time a first HTTP fetch from the restored ``nat`` sibling takes. Everything it made is removed.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from drums_core.client import Client
from drums_core.config import Instance

FETCH = "import urllib.request; urllib.request.urlopen('http://web.standin.test/', timeout=5).read()"


def main(argv: list[str] | None = None) -> int:
    from tests.support.suite import stop_instance
    from tests.support.netstandin import StandIn
    from tests.support.slots import my_block

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    inst = Instance(name=f"natbench-{os.getpid()}", slot_base=my_block().spare.start, slot_count=4)
    up = StandIn(f"dsb{os.getpid() % 100000}", 7, {"web.standin.test": "203.0.113.80",
                                                    "dns.standin.test": "203.0.113.53"}, name="bench").start()
    c = Client(inst, timeout=180)
    out: dict = {"rounds": args.rounds, "none": {"ready": [], "wire": []}, "nat": {"ready": [], "wire": []},
                 "first_fetch_s": []}
    try:
        snaps = {}
        for kind, spec in (("none", {}), ("nat", {"network": {"policy": "nat", "upstream": up.ifname,
                                                              "dns": ["203.0.113.53"]}})):
            s = c.create(spec)
            snaps[kind] = c.checkpoint(s["id"])["id"]
        for _ in range(args.rounds):
            for kind in ("none", "nat"):
                (r,) = c.restore(snaps[kind])
                out[kind]["ready"].append(r["timings"]["ready"])
                out[kind]["wire"].append(r["timings"]["network"] - r["timings"]["criu"])
                if kind == "nat":
                    t = time.monotonic()
                    res = c.exec(r["id"], ["python3", "-c", FETCH])
                    assert res["returncode"] == 0, res
                    out["first_fetch_s"].append(time.monotonic() - t)
                c.destroy(r["id"])
        for snap in snaps.values():
            c.delete_snapshot(snap)
    finally:
        stop_instance(inst)
        up.close()
    med = {k: {p: statistics.median(out[k][p]) for p in ("ready", "wire")} for k in ("none", "nat")}
    out["median"] = med
    out["ratio_ready_nat_over_none"] = med["nat"]["ready"] / med["none"]["ready"]
    out["ratio_wire_nat_over_none"] = med["nat"]["wire"] / med["none"]["wire"]
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print(f"restore ready, median of {args.rounds}: none {med['none']['ready']:.3f}s, "
              f"nat {med['nat']['ready']:.3f}s (nat/none {out['ratio_ready_nat_over_none']:.2f}); network wiring "
              f"none {med['none']['wire'] * 1000:.1f} ms, nat {med['nat']['wire'] * 1000:.1f} ms "
              f"(nat/none {out['ratio_wire_nat_over_none']:.2f}); first fetch from a restored nat sibling "
              f"(exec included) {statistics.median(out['first_fetch_s']):.3f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
