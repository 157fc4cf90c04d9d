"""``drums``: the command line over the client library. Every command takes ``--json``."""
from __future__ import annotations

import argparse
import json
import sys

from .client import Client
from .errors import DrumsError
from .records import json_default


def _table(rows: list[dict], cols: list[str]) -> str:
    if not rows:
        return "(none)"
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in cols}
    lines = ["  ".join(c.upper().ljust(widths[c]) for c in cols)]
    for r in rows:
        lines.append("  ".join(str(r.get(c, "")).ljust(widths[c]) for c in cols))
    return "\n".join(lines)


def _out(args, data, human: str) -> None:
    if args.json:
        print(json.dumps(data, indent=1, default=json_default))
    else:
        print(human)


def _session_row(s: dict) -> dict:
    return {"id": s["id"], "state": s["state"], "address": s["address"], "display": f":{s['display']}",
            "snapshot": (s.get("snapshot") or "-")[:12], "liveness": s.get("liveness"),
            "ready_s": f"{s.get('timings', {}).get('ready', 0):.3f}"}


def _ago(t: float | None) -> str:
    import time

    if not t:
        return "-"
    s = max(0.0, time.time() - t)
    return f"{s:.0f}s" if s < 120 else f"{s / 60:.0f}m" if s < 7200 else f"{s / 3600:.1f}h"


def _moved(a: dict) -> str:
    return (f"{a['action']} {a['id'][:12]} {a.get('name') or '-'} ({a.get('retention')}, "
            f"{a['size'] / 2**20:.1f} MiB, last used {_ago(a.get('last_used'))} ago, {a.get('why')})")


def _snapshots_text(rows: list[dict], store: dict) -> str:
    mib = 2**20
    table = [{"id": s["id"][:12], "name": s.get("name") or "-", "scope": s["scope"], "state": s["state"],
              "keep": s.get("retention", "pinned"), "where": s.get("location", "memory"),
              "size_mib": f"{s['size'] / mib:.1f}", "layers": len(s["layers"]),
              "last_used": _ago(s.get("last_used")), "held_by": s.get("in_use") or (
                  f"{len(s['children'])} child(ren)" if s.get("children") else "-")} for s in rows]
    head = (f"store: {store['used'] / mib:.0f} MiB of {store['budget'] / mib:.0f} MiB budget in memory "
            f"({store['budget_source']}), {store['on_disk'] / mib:.0f} MiB spilled to disk "
            f"({store.get('spill_dir') or 'spilling off'}); {store['snapshots']} snapshots "
            f"({store['cache']} cache, {store['pinned']} pinned, {store['spilled']} on disk); "
            f"{store['evicted']} evicted, {store['spilled_total']} spilled, {store['store_full']} refused "
            f"(STORE_FULL) so far")
    lines = [head, _table(table, ["id", "name", "scope", "state", "keep", "where", "size_mib", "layers",
                                  "last_used", "held_by"])]
    if store.get("recent"):
        lines.append("recent evictions and spills:")
        lines += [f"  {_ago(a.get('time'))} ago: {_moved(a)} for {str(a.get('for') or '-')[:12]}"
                  for a in store["recent"]]
    return "\n".join(lines)


def report_error(exc: DrumsError, as_json: bool, prog: str) -> int:
    """Print a Drums error as a JSON document or one line on stderr; the exit status of a failure."""
    if as_json:
        print(json.dumps({"error": exc.to_wire()}, indent=1))
    else:
        print(f"{prog}: {exc.code}: {exc}", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="drums", description="Drums: desktops you can save, restore and branch")
    parser.add_argument("--json", action="store_true", help="print a JSON document")
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="boot a cold desktop session (an OSWorld desktop with its guest server)")
    up.add_argument("--image", default=None,
                    help="the desktop image (default: osworld; with --bare: default)")
    up.add_argument("--bare", action="store_true",
                    help="the engine's bare session: X, the window manager and --program only, no guest server")
    up.add_argument("--program", action="append", default=[], help="a program to start (shell words)")
    up.add_argument("--expect-window", default=None)
    up.add_argument("--screen", default="1920x1080")
    up.add_argument("--network", default=None,
                    help="none (default), nat:<upstream>[:<dns>,...] or a JSON object (README: Network)")
    up.add_argument("--upstream", default=None, help="nat: the host interface sessions reach the outside through")
    up.add_argument("--dns", action="append", default=None, help="nat: a DNS server for the session (repeatable)")
    up.add_argument("--allow", action="append", default=None,
                    help="nat: a private network the session may reach, e.g. 192.168.7.0/24 (repeatable)")
    sub.add_parser("ls", help="list sessions")
    cp = sub.add_parser("checkpoint", help="checkpoint a session")
    cp.add_argument("session")
    cp.add_argument("--name")
    cp.add_argument("--snapshot-id")
    cp.add_argument("--leave-running", action="store_true")
    cp.add_argument("--cache", action="store_true", help="the store may evict it when nothing uses it")
    rs = sub.add_parser("restore", help="restore (branch) a snapshot")
    rs.add_argument("snapshot")
    rs.add_argument("--count", type=int, default=1)
    rs.add_argument("--wait-live", action="store_true")
    rs.add_argument("--expect-window")
    ds = sub.add_parser("destroy", help="destroy a session")
    ds.add_argument("session")
    sc = sub.add_parser("screenshot", help="save a PNG of a session's screen")
    sc.add_argument("session")
    sc.add_argument("-o", "--output", required=True)
    ex = sub.add_parser("exec", help="run a command in a session")
    ex.add_argument("session")
    ex.add_argument("--user", default=None)
    ex.add_argument("--timeout", type=float, default=120.0)
    ex.add_argument("argv", nargs="*", help="the command, after --")
    sub.add_parser("snapshots", help="list snapshots with sizes, the store's budget and its evictions")
    dsn = sub.add_parser("delete-snapshot", help="delete a snapshot nobody uses")
    dsn.add_argument("snapshot")
    sps = sub.add_parser("spill", help="move a snapshot nobody uses to disk now")
    sps.add_argument("snapshot")
    au = sub.add_parser("audit", help="what two sessions share")
    au.add_argument("a")
    au.add_argument("b")
    sub.add_parser("doctor", help="check this host's prerequisites")
    sub.add_parser("image", add_help=False,
                   help="desktop images: drums image build [NAME] [--spec FILE] [--force] | ls | rm NAME")
    sub.add_parser("bench", help="benchmarks: drums bench <suite> [--json] [--out DIR] [--quick]", add_help=False)
    sub.add_parser("rollouts", add_help=False, help="run scripted branches of a saved state and score them")
    sd = sub.add_parser("shutdown", help="stop the daemon (sessions survive unless --destroy)")
    sd.add_argument("--destroy", action="store_true")
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in argv and "exec" in argv[: argv.index("--")]:  # after --: the command of `drums exec`
        cut = argv.index("--")
        argv, command = argv[:cut], argv[cut + 1:]
    args, rest = parser.parse_known_args(argv)
    if args.cmd == "exec":
        args.argv = list(args.argv) + command
    if args.cmd == "doctor":
        from .doctor import main as doctor_main

        return doctor_main((["--json"] if args.json else []) + rest)
    if args.cmd == "image":  # no daemon: images are built here, as root
        from .images import main as image_main

        return image_main((["--json"] if args.json else []) + rest)
    if args.cmd == "bench":  # lazily: drums_core never imports drums_osworld at module level
        from drums_osworld.bench import main as bench_main

        return bench_main((["--json"] if args.json else []) + rest)
    if args.cmd == "rollouts":
        from drums_osworld.rollouts import main as rollouts_main  # on use only: drums_core stays OSWorld-free

        return rollouts_main((["--json"] if args.json else []) + rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    client = Client()
    try:
        return _run(args, client)
    except DrumsError as exc:
        return report_error(exc, args.json, "drums")


def _run(args, client: Client) -> int:
    import shlex

    if args.cmd == "up":
        w, h = (int(x) for x in args.screen.lower().split("x"))
        programs = [{"name": f"p{i}", "argv": shlex.split(p)} for i, p in enumerate(args.program)]
        from .netpolicy import from_options

        network = from_options(args.network, args.upstream, args.dns, args.allow).to_spec()
        if args.bare:
            spec = {"image": args.image or "default", "programs": programs}
        else:  # on use only: drums_core stays OSWorld-free
            from drums_osworld.desktop import OSWORLD_IMAGE, desktop_spec

            spec = desktop_spec((w, h), args.image or OSWORLD_IMAGE, extra_programs=programs)
        spec.update({"expect_window": args.expect_window, "screen": [w, h], "network": network})
        s = client.create(spec)
        _out(args, s, f"{s['id']} {s['address']} (ready in {s['timings']['ready']:.2f}s)")
    elif args.cmd == "ls":
        rows = client.list()
        _out(args, rows, _table([_session_row(s) for s in rows],
                                ["id", "state", "address", "display", "snapshot", "liveness", "ready_s"]))
    elif args.cmd == "checkpoint":
        snap = client.checkpoint(args.session, name=args.name, snapshot_id=args.snapshot_id,
                                 leave_running=args.leave_running, cache=args.cache)
        moved = (snap.get("store") or {}).get("actions") or []
        _out(args, snap, "\n".join([snap["id"], *(f"  {_moved(a)}" for a in moved)]))
    elif args.cmd == "restore":
        sess = client.restore(args.snapshot, count=args.count, wait_live=args.wait_live,
                              expect_window=args.expect_window)
        _out(args, sess, _table([_session_row(s) for s in sess], ["id", "state", "address", "display", "ready_s"]))
    elif args.cmd == "destroy":
        res = client.destroy(args.session)
        _out(args, res, f"destroyed {args.session}")
    elif args.cmd == "screenshot":
        png = client.screenshot(args.session)
        with open(args.output, "wb") as f:
            f.write(png)
        _out(args, {"path": args.output, "bytes": len(png)}, f"wrote {args.output} ({len(png)} bytes)")
    elif args.cmd == "exec":
        res = client.exec(args.session, args.argv, user=args.user, timeout=args.timeout)
        if args.json:
            print(json.dumps(res.to_dict(), indent=1))
        else:
            sys.stdout.write(res["stdout"])
            sys.stderr.write(res["stderr"])
        return int(res["returncode"])
    elif args.cmd == "snapshots":
        rows = client.snapshots()
        store = client.store()
        _out(args, {"store": store, "snapshots": rows}, _snapshots_text(rows, store))
    elif args.cmd == "delete-snapshot":
        _out(args, client.delete_snapshot(args.snapshot), f"deleted {args.snapshot}")
    elif args.cmd == "spill":
        res = client.spill_snapshot(args.snapshot)
        _out(args, res, f"{res['action']}: {res['id']} ({res['size'] / 2**20:.1f} MiB)")
    elif args.cmd == "audit":
        res = client.audit(args.a, args.b)
        human = "\n".join(f"{s['kind']:8} {s['target']} {'(harmless)' if s['harmless'] else 'SHARED'}"
                          for s in res["shared"]) or "nothing shared"
        _out(args, res, human)
    elif args.cmd == "shutdown":
        client.shutdown(destroy_sessions=args.destroy)
        _out(args, {"stopped": True}, "drumsd stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
