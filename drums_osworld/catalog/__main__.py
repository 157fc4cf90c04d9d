"""``python -m drums_osworld.catalog {build,check,show}``: see :mod:`drums_osworld.catalog`."""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from . import LIST_PATH, build, image_fit, load_list


def _write(doc: dict, out: Path) -> None:
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n")
    tmp.replace(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m drums_osworld.catalog", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="classify every task and write the list")
    b.add_argument("--tasks", required=True, type=Path, help="OSWorld's evaluation_examples directory")
    b.add_argument("--out", type=Path, default=LIST_PATH, help=f"where to write (default {LIST_PATH})")
    c = sub.add_parser("check", help="exit 1 when the committed list differs from a fresh build")
    c.add_argument("--tasks", required=True, type=Path)
    c.add_argument("--list", type=Path, default=LIST_PATH)
    s = sub.add_parser("show", help="print the list as a table")
    s.add_argument("--list", type=Path, default=LIST_PATH)
    s.add_argument("--offline", action="store_true", help="only the tasks that run offline")
    s.add_argument("--image", default=None, help="also say which applications this image lacks")
    s.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    try:
        if args.cmd == "build":
            doc = build(args.tasks)
            _write(doc, args.out)
            print(f"wrote {args.out}: {json.dumps(doc['counts'])}")
            return 0
        if args.cmd == "check":
            fresh = build(args.tasks)
            committed = json.loads(Path(args.list).read_text())
            if committed.get("tasks") != fresh["tasks"]:
                old = {(t["domain"], t["id"]): t for t in committed.get("tasks", [])}
                new = {(t["domain"], t["id"]): t for t in fresh["tasks"]}
                changed = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
                print(f"{args.list} is out of date for {len(changed)} tasks, e.g. "
                      f"{', '.join('/'.join(k) for k in changed[:5])}: run `python -m drums_osworld.catalog build`",
                      file=sys.stderr)
                return 1
            print(f"{args.list} is current ({fresh['counts']['offline']} of {fresh['counts']['tasks']} offline)")
            return 0
        entries = load_list(args.list)
        if args.offline:
            entries = [e for e in entries if e.offline]
        lacking = image_fit(entries, args.image) if args.image else {}
    except (OSError, ValueError) as exc:
        print(f"drums_osworld.catalog: {exc}", file=sys.stderr)
        return 2
    rows = [{"task": e.key, "offline": e.offline, "infeasible": e.infeasible, "vs_code": e.vs_code,
             "apps": e.apps.get("all", []), "image_lacks": lacking.get(e.key, {}),
             "excluded_for": [x["code"] + ": " + x["reason"] for x in e.exclusions]} for e in entries]
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    for r in rows:
        state = "offline" if r["offline"] else "EXCLUDED"
        extra = ("; ".join(r["excluded_for"]) if r["excluded_for"] else "apps: " + (", ".join(r["apps"]) or "-"))
        if r["image_lacks"]:
            extra += f"; {args.image} lacks " + ", ".join(r["image_lacks"])
        flags = "".join([" infeasible" if r["infeasible"] else "", " vs_code" if r["vs_code"] else ""])
        print(f"{r['task'][:60]:60} {state}{flags}  {extra}")
    print(f"{len(rows)} tasks; by domain: {dict(Counter(e.domain for e in entries))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
