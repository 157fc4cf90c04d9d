"""``drums``: the command line over the client library. Every command takes ``--json``."""
from __future__ import annotations

import argparse
import json
import sys

from .client import Client
from .errors import DrumsError


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
        print(json.dumps(data, indent=1, default=str))
    else:
        print(human)


def _session_row(s: dict) -> dict:
    return {"id": s["id"], "state": s["state"], "address": s["address"], "display": f":{s['display']}",
            "snapshot": (s.get("snapshot") or "-")[:12], "liveness": s.get("liveness"),
            "ready_s": f"{s.get('timings', {}).get('ready', 0):.3f}"}


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
    up = sub.add_parser("up", help="boot a cold desktop session")
    up.add_argument("--program", action="append", default=[], help="a program to start (shell words)")
    up.add_argument("--expect-window", default=None)
    up.add_argument("--screen", default="1920x1080")
    sub.add_parser("ls", help="list sessions")
    cp = sub.add_parser("checkpoint", help="checkpoint a session")
    cp.add_argument("session")
    cp.add_argument("--name")
    cp.add_argument("--snapshot-id")
    cp.add_argument("--leave-running", action="store_true")
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
    sub.add_parser("snapshots", help="list snapshots with sizes")
    dsn = sub.add_parser("delete-snapshot", help="delete a snapshot nobody uses")
    dsn.add_argument("snapshot")
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
        s = client.create({"programs": programs, "expect_window": args.expect_window, "screen": [w, h]})
        _out(args, s, f"{s['id']} {s['address']} (ready in {s['timings']['ready']:.2f}s)")
    elif args.cmd == "ls":
        rows = client.list()
        _out(args, rows, _table([_session_row(s) for s in rows],
                                ["id", "state", "address", "display", "snapshot", "liveness", "ready_s"]))
    elif args.cmd == "checkpoint":
        snap = client.checkpoint(args.session, name=args.name, snapshot_id=args.snapshot_id,
                                 leave_running=args.leave_running)
        _out(args, snap, snap["id"])
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
            print(json.dumps(res, indent=1))
        else:
            sys.stdout.write(res["stdout"])
            sys.stderr.write(res["stderr"])
        return int(res["returncode"])
    elif args.cmd == "snapshots":
        rows = client.snapshots()
        table = [{"id": s["id"], "name": s.get("name") or "-", "scope": s["scope"], "state": s["state"],
                  "size_mib": f"{s['size'] / 2**20:.1f}", "layers": len(s["layers"]),
                  "dump_s": f"{s.get('dump_seconds', 0):.3f}"} for s in rows]
        _out(args, rows, _table(table, ["id", "name", "scope", "state", "size_mib", "layers", "dump_s"]))
    elif args.cmd == "delete-snapshot":
        _out(args, client.delete_snapshot(args.snapshot), f"deleted {args.snapshot}")
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
