"""``drums``: the command line over the client library.

One convention for every command: the global options (``--json``, ``--instance``, ``--slot-base``,
``--slot-count``) go before or after the command's name; every option has help; a usage error is one
line on stderr and exit status 2; a Drums failure is exit status 1 (``drums exec``: 125, so that the
command's own status passes through; 126 and 127 as ``env`` and ``docker run``). ``EPILOG`` lists them.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys

from . import cli_registry, protocol
from .client import Client
from .errors import DrumsError
from .reasons import Reason
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


EXIT_OK = 0
EXIT_FAILED = 1        # Drums refused or failed the operation (its error on stderr, or {"error"} with --json)
EXIT_USAGE = 2         # a usage error: bad option or value, missing argument (one line on stderr)
EXIT_SURVIVORS = 3     # drums sweep: processes survived SIGKILL (their ledger entries are kept)
EXIT_EXEC_DRUMS = 125  # drums exec: Drums itself failed (daemon, session, timeout); the command did not run
EXIT_EXEC_CANNOT_RUN = 126  # drums exec: the command was found but could not be run (not executable)
EXIT_EXEC_NOT_FOUND = 127   # drums exec: the command was not found in the session

EPILOG = """\
global options (--json, --instance, --slot-base, --slot-count) go before or after the command:
`drums ls --json` and `drums --json ls` are the same. `drums COMMAND --help` shows a command's options.

exit status:
  0    success
  1    Drums refused or failed the operation: `drums COMMAND: CODE: message [REASON]` on stderr, or with
       --json an {"error": {"code", "reason", "message", "detail"}} document on stdout
       (drums doctor: a required check failed)
  2    usage error (unknown option, bad value, missing argument): one line on stderr, nothing done
  3    drums sweep: some processes survived SIGKILL (their ledger entries are kept)
  130  interrupted (Ctrl-C)
drums exec passes the command's own exit status through; Drums' own failures use the codes of
`docker run` and `env`, which a command should not use itself:
  125  Drums failed (no daemon, unknown or broken session, timeout): the command did not run
  126  the command was found but could not be run (e.g. not executable)
  127  the command was not found in the session
"""


class UsageParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line on stderr, exit status 2."""

    def error(self, message: str):  # type: ignore[override]
        one = " ".join(str(message).split())
        self.exit(EXIT_USAGE, f"{self.prog}: error: {one} (see {self.prog} --help)\n")


def report_error(exc: DrumsError, as_json: bool, prog: str, status: int = EXIT_FAILED) -> int:
    """Print a Drums error as a JSON document or one line on stderr; return ``status``."""
    if as_json:
        print(json.dumps({"error": exc.to_wire()}, indent=1, default=str))
    else:
        print(f"{prog}: {exc.code}: {exc}", file=sys.stderr)
    return status


# ------------------------------------------------------------------ option values, checked at parse time
def _screen(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"\s*(\d{1,5})\s*[xX]\s*(\d{1,5})\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not WIDTHxHEIGHT (e.g. 1920x1080)")
    w, h = int(m.group(1)), int(m.group(2))
    if not (64 <= w <= 8192 and 64 <= h <= 8192):
        raise argparse.ArgumentTypeError(f"{text!r}: width and height must be between 64 and 8192")
    return w, h


def _int_at_least(low: int, high: int | None = None):
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if v < low or (high is not None and v > high):
            raise argparse.ArgumentTypeError(f"{v} is out of range ({low}..{high if high is not None else ''})")
        return v

    parse.__name__ = "number"
    return parse


def _seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < v < 86400 * 7:
        raise argparse.ArgumentTypeError(f"{text!r}: seconds must be more than 0")
    return v


def _instance_name(text: str) -> str:
    from .config import check_name

    try:
        return check_name(text, "instance")
    except DrumsError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None


def _shell_words(text: str) -> str:
    import shlex

    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None
    if not words:
        raise argparse.ArgumentTypeError("an empty command")
    return text


def _output_file(text: str) -> str:
    parent = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(parent):
        raise argparse.ArgumentTypeError(f"{text!r}: directory {parent} does not exist")
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a directory")
    return text


# ------------------------------------------------------------------ the parser
# The engine's commands whose options are parsed by their own module (imported on use):
# name -> (module, function building its parser, function to run).
PASSTHROUGH = {
    "doctor": ("drums_core.host.doctor", "build_parser", "main"),
    "image": ("drums_core.host.images", "build_parser", "main"),
}
# Commands a package above the engine provides (drums_core.cli_registry; drums_core imports none of
# them): `drums` lists them, and says which is missing when no installed package provides it.
PROVIDED = ("bench", "rollouts")


def passthrough(name: str) -> tuple[str, str, str] | None:
    """(module, function building its parser, function to run) of a command that parses its own
    options; None for the others and for a provided command nobody provides."""
    if name in PASSTHROUGH:
        return PASSTHROUGH[name]
    c = cli_registry.command(name) if name in PROVIDED else None
    return (c.module, c.build_parser, c.main) if c else None


def _passed_globals(name: str) -> tuple[str, ...]:
    """The global options a passthrough command takes from `drums` (the others it ignores)."""
    c = cli_registry.command(name) if name in PROVIDED else None
    return c.globals if c else ()


def _global_options() -> argparse.ArgumentParser:
    """The options every command takes, before or after its name (defaults applied after parsing, so
    a subcommand's absent option never hides one given before it)."""
    g = argparse.ArgumentParser(add_help=False)
    sup = argparse.SUPPRESS
    g.add_argument("--json", action="store_true", default=sup,
                   help="print a JSON document on stdout (errors too: {\"error\": ...})")
    g.add_argument("--instance", type=_instance_name, default=sup, metavar="NAME",
                   help="the daemon instance to talk to (default: $DRUMS_INSTANCE or 'default')")
    g.add_argument("--slot-base", type=_int_at_least(0, 16383), default=sup, metavar="N",
                   help="first session slot of the instance, when this starts its daemon "
                        "(default: $DRUMS_SLOT_BASE or 0)")
    g.add_argument("--slot-count", type=_int_at_least(1, 16384), default=sup, metavar="N",
                   help="number of session slots of the instance (default: $DRUMS_SLOT_COUNT or 64)")
    return g


GLOBAL_DEFAULTS = {"json": False, "instance": None, "slot_base": None, "slot_count": None}


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The ``drums`` parser and its subcommands' parsers, by name."""
    g = _global_options()
    parser = UsageParser(prog="drums", description="Drums: desktops you can save, restore and branch",
                     parents=[g], epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    cmds: dict[str, argparse.ArgumentParser] = {}

    def add(name: str, help: str, **kw) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help, parents=[g], **kw)
        cmds[name] = p
        return p

    up = add("up", "boot a cold desktop session (an OSWorld desktop with its guest server; --bare: none) "
                   "and print its id, address and guest URL")
    up.add_argument("--image", default=None, metavar="NAME",
                    help="the desktop image (default: osworld; with --bare: default)")
    up.add_argument("--bare", action="store_true",
                    help="the engine's bare session: X, the window manager and --program only, no guest server")
    up.add_argument("--desktop", default=None, metavar="NAME",
                    help="what the desktop shows, as its provider names it (OSWorld's: openbox, the default, "
                         "or gnome: GNOME Shell with its top bar and dock, on an image that has it); not with --bare")
    up.add_argument("--program", action="append", default=[], metavar="COMMAND", type=_shell_words,
                    help="a program to start in the session, as shell words (repeatable)")
    up.add_argument("--expect-window", default=None, metavar="TITLE",
                    help="ready only once a window with this title (or class) is mapped")
    up.add_argument("--screen", type=_screen, default=(1920, 1080), metavar="WxH",
                    help="screen size (default 1920x1080)")
    up.add_argument("--network", default=None, metavar="POLICY",
                    help="none (default), nat:<upstream>[:<dns>,...] or a JSON object (README: Network)")
    up.add_argument("--upstream", default=None, metavar="IFACE",
                    help="nat: the host interface sessions reach the outside through")
    up.add_argument("--dns", action="append", default=None, metavar="ADDRESS",
                    help="nat: a DNS server for the session (repeatable)")
    up.add_argument("--allow", action="append", default=None, metavar="CIDR",
                    help="nat: a private network the session may reach, e.g. 192.168.7.0/24 (repeatable)")
    add("ls", "list sessions")
    cp = add("checkpoint", "checkpoint a session; prints the snapshot id")
    cp.add_argument("session", help="the session's id")
    cp.add_argument("--name", metavar="NAME", help="a name to restore the snapshot by")
    cp.add_argument("--snapshot-id", metavar="ID",
                    help="the snapshot's id (a retry with the same id returns the committed snapshot)")
    cp.add_argument("--leave-running", action="store_true", help="keep the session running after the dump")
    cp.add_argument("--cache", action="store_true", help="the store may evict it when nothing uses it")
    rs = add("restore", "restore (branch) a snapshot into new sessions")
    rs.add_argument("snapshot", help="the snapshot's id or name")
    rs.add_argument("--count", type=_int_at_least(1, 16384), default=1, metavar="N",
                    help="how many sibling sessions to restore at once (default 1; at most the instance's slots)")
    rs.add_argument("--wait-live", action="store_true",
                    help="return only after the liveness check (every checkpointed process still there)")
    rs.add_argument("--expect-window", metavar="TITLE",
                    help="ready once this window is mapped (default: the snapshot's first window)")
    ds = add("destroy", "destroy a session")
    ds.add_argument("session", help="the session's id")
    sc = add("screenshot", "save a PNG of a session's screen")
    sc.add_argument("session", help="the session's id")
    sc.add_argument("-o", "--output", required=True, type=_output_file, metavar="FILE",
                    help="where to write the PNG")
    ex = add("exec", "run a command in a session: drums exec SESSION [--user user] -- COMMAND...; "
                     "exits with the command's status (125-127: see drums --help)")
    ex.add_argument("session", help="the session's id")
    ex.add_argument("--user", default=None, choices=["root", "user"],
                    help="run as this user of the session (default root)")
    ex.add_argument("--timeout", type=_seconds, default=120.0, metavar="SECONDS",
                    help="give up after this many seconds (exit status 125; default 120)")
    ex.add_argument("argv", nargs="*", metavar="COMMAND", help="the command and its arguments, after --")
    add("snapshots", "list snapshots with sizes, the store's budget and its evictions")
    dsn = add("delete-snapshot", "delete a snapshot nobody uses")
    dsn.add_argument("snapshot", help="the snapshot's id or name")
    sps = add("spill", "move a snapshot nobody uses to disk now")
    sps.add_argument("snapshot", help="the snapshot's id or name")
    au = add("audit", "what two sessions share (pipes, sockets, files, devices)")
    au.add_argument("a", metavar="SESSION_A", help="a session's id")
    au.add_argument("b", metavar="SESSION_B", help="another session's id")
    sw = add("sweep", "clean up what dead runs of this instance left (processes, mounts, links, tables) "
                      "and print what was cleaned")
    sw.add_argument("--run", metavar="RUN", help="sweep only this run (default: every dead run)")
    sw.add_argument("--force", action="store_true", help="with --run: sweep it even if its daemon is alive")
    sw.add_argument("--dry-run", action="store_true", help="change nothing; report what would be done")
    sw.add_argument("--kill-timeout", type=_seconds, default=5.0, metavar="SECONDS",
                    help="seconds to wait for killed processes to die (default 5)")
    sw.add_argument("--ledger", metavar="DIR", default=None,
                    help="the ledger root (default: the instance's, /run/drums/<instance>/ledger)")
    sd = add("shutdown", "stop the daemon; sessions survive unless --destroy, --purge removes the instance")
    sd.add_argument("--destroy", action="store_true", help="destroy every session of the instance first")
    sd.add_argument("--purge", action="store_true",
                    help="destroy the sessions and remove the instance's state (snapshots included, its "
                         "state tmpfs unmounted), after printing what it will delete")
    sd.add_argument("--dry-run", action="store_true", help="with --purge: print what it would delete, change nothing")
    sub_help = {"doctor": "check this host's prerequisites (drums doctor --help)",
                "image": "desktop images: drums image build [NAME] [--spec FILE] [--force] | ls | rm NAME",
                "bench": "benchmarks: drums bench SUITE [--out DIR] [--quick] (drums bench --help)",
                "rollouts": "run scripted branches of a saved state and score them (drums rollouts --help)"}
    for name, text in sub_help.items():  # their own modules parse their options (and --help)
        add(name, text, add_help=False, allow_abbrev=False)
    return parser, cmds


def _instance(args):
    """The instance the global options name; what they leave out from $DRUMS_INSTANCE,
    $DRUMS_SLOT_BASE and $DRUMS_SLOT_COUNT (ValueError or InvalidArgument when those are bad)."""
    from .config import Instance, check_name

    env = os.environ
    name = args.instance if args.instance is not None else check_name(env.get("DRUMS_INSTANCE", "default"),
                                                                       "instance")
    base = args.slot_base if args.slot_base is not None else int(env.get("DRUMS_SLOT_BASE", "0"))
    count = args.slot_count if args.slot_count is not None else int(env.get("DRUMS_SLOT_COUNT", "64"))
    return Instance(name=name, slot_base=base, slot_count=count)


def passthrough_argv(args, rest: list[str]) -> list[str]:
    """The arguments a passthrough command's own ``main`` gets: the global options it takes, then ``rest``."""
    forwarded = ["--json"] if args.json else []
    for name in _passed_globals(args.cmd):
        value = getattr(args, name)
        if value is not None:
            forwarded += [f"--{name.replace('_', '-')}", str(value)]
    return forwarded + rest


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Parse ``drums`` arguments: (namespace with the global options' defaults filled in, what a
    passthrough command parses itself). A usage error exits 2 with one line on stderr."""
    parser, cmds = build_parser()
    command: list[str] = []
    if "--" in argv and "exec" in argv[: argv.index("--")]:  # after --: the command of `drums exec`
        cut = argv.index("--")
        argv, command = argv[:cut], argv[cut + 1:]
    args, rest = parser.parse_known_args(argv)
    for k, v in GLOBAL_DEFAULTS.items():
        if not hasattr(args, k):
            setattr(args, k, v)
    if args.cmd in PASSTHROUGH or args.cmd in PROVIDED:
        if passthrough(args.cmd) is None:
            cmds[args.cmd].error(cli_registry.missing(f"`drums {args.cmd}`"))
        return args, rest
    if rest:
        cmds[args.cmd].error(f"unrecognized arguments: {' '.join(rest)}")
    if args.cmd == "exec":
        args.argv = list(args.argv) + command
        if not args.argv:
            cmds["exec"].error("no command given: drums exec SESSION -- COMMAND [ARG...]")
    if args.cmd == "shutdown" and args.dry_run and not args.purge:
        cmds["shutdown"].error("--dry-run goes with --purge")
    if args.cmd == "sweep" and args.force and not args.run:
        cmds["sweep"].error("--force needs --run")
    try:
        args.target = _instance(args)
    except (DrumsError, ValueError) as exc:  # $DRUMS_INSTANCE, $DRUMS_SLOT_BASE or $DRUMS_SLOT_COUNT
        parser.error(f"bad instance settings in the environment: {exc}")
    if args.cmd == "up":
        from .session.netpolicy import from_options

        try:
            args.network_spec = from_options(args.network, args.upstream, args.dns, args.allow).to_spec()
        except DrumsError as exc:
            cmds["up"].error(f"bad network: {exc}")  # the message and its [REASON]
        if args.bare and args.desktop:
            cmds["up"].error("--desktop chooses the provider's desktop: not with --bare")
        if not args.bare and cli_registry.desktop() is None:
            cmds["up"].error(cli_registry.missing("the desktop `drums up` boots without --bare"))
    return args, []


def main(argv: list[str] | None = None) -> int:
    """``drums``: parse, run, and return the exit status (see ``EPILOG``)."""
    try:
        return _main(list(sys.argv[1:] if argv is None else argv))
    except BrokenPipeError:  # the reader went away (`drums ls | head`): no traceback
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130


def _main(argv: list[str]) -> int:
    import importlib

    args, rest = parse(argv)
    if args.cmd in PASSTHROUGH or args.cmd in PROVIDED:
        module, _, fn = passthrough(args.cmd)  # parse() made sure there is one
        return getattr(importlib.import_module(module), fn)(passthrough_argv(args, rest))
    status = EXIT_EXEC_DRUMS if args.cmd == "exec" else EXIT_FAILED
    try:
        client = Client(args.target)
        return _run(args, client)
    except DrumsError as exc:
        return report_error(exc, args.json, f"drums {args.cmd}", status)
    except OSError as exc:  # e.g. the screenshot's file cannot be written
        from .errors import Unavailable

        return report_error(Unavailable(str(exc), reason=Reason.OS_ERROR), args.json, f"drums {args.cmd}", status)


def _run(args, client: Client) -> int:
    op = protocol.for_command(args.cmd)
    if op is not None:  # a command that is one operation: its options carry the table's argument names
        return _show(args, getattr(client, op.client)(*op.from_namespace(args)))
    if args.cmd == "up":
        _up(args, client)
    elif args.cmd == "snapshots":
        rows = client.snapshots()
        store = client.store()
        _out(args, {"store": store, "snapshots": rows}, _snapshots_text(rows, store))
    elif args.cmd == "shutdown":
        if args.purge:
            return _purge(args, client.instance)
        client.shutdown(destroy_sessions=args.destroy)
        _out(args, {"stopped": True}, "drumsd stopped" + (", its sessions destroyed" if args.destroy else ""))
    elif args.cmd == "sweep":
        return _sweep(args, client.instance)
    return 0


def _up(args, client: Client) -> None:
    import shlex

    w, h = args.screen
    programs = [{"name": f"p{i}", "argv": shlex.split(p)} for i, p in enumerate(args.program)]
    guest_port = None
    if args.bare:
        spec = {"image": args.image or "default", "programs": programs}
    else:  # the provider's desktop (parse() made sure there is one): drums_core stays OSWorld-free
        import importlib

        d = cli_registry.desktop()
        chosen = {"desktop": args.desktop} if args.desktop else {}  # a provider without choices takes none
        spec, guest_port = getattr(importlib.import_module(d.module), d.function)((w, h), args.image, programs,
                                                                                  **chosen)
    spec.update({"expect_window": args.expect_window, "screen": [w, h], "network": args.network_spec})
    s = client.create(spec).to_dict()  # a Session is read-only: the document gets the guest URL
    if guest_port is not None:
        s["guest_url"] = f"http://{s['address']}:{guest_port}"
    url = f" {s['guest_url']}" if s.get("guest_url") else ""
    _out(args, s, f"{s['id']} {s['address']}{url} (ready in {s['timings']['ready']:.2f}s)")


def _show(args, res) -> int:
    """Print the result of a command that is one operation; its exit status."""
    if args.cmd == "ls":
        _out(args, res, _table([_session_row(s) for s in res],
                               ["id", "state", "address", "display", "snapshot", "liveness", "ready_s"]))
    elif args.cmd == "checkpoint":
        moved = (res.get("store") or {}).get("actions") or []
        _out(args, res, "\n".join([res["id"], *(f"  {_moved(a)}" for a in moved)]))
    elif args.cmd == "restore":
        _out(args, res, _table([_session_row(s) for s in res], ["id", "state", "address", "display", "ready_s"]))
    elif args.cmd == "destroy":
        _out(args, res, f"destroyed {args.session}")
    elif args.cmd == "screenshot":
        with open(args.output, "wb") as f:
            f.write(res)
        _out(args, {"path": args.output, "bytes": len(res)}, f"wrote {args.output} ({len(res)} bytes)")
    elif args.cmd == "exec":
        if args.json:
            print(json.dumps(res.to_dict(), indent=1))
        else:
            sys.stdout.write(res["stdout"])
            sys.stderr.write(res["stderr"])
        return int(res["returncode"])
    elif args.cmd == "delete-snapshot":
        _out(args, res, f"deleted {args.snapshot}")
    elif args.cmd == "spill":
        _out(args, res, f"{res['action']}: {res['id']} ({res['size'] / 2**20:.1f} MiB)")
    elif args.cmd == "audit":
        human = "\n".join(f"{s['kind']:8} {s['target']} {'(harmless)' if s['harmless'] else 'SHARED'}"
                          for s in res["shared"]) or "nothing shared"
        _out(args, res, human)
    return 0


def _purge(args, instance) -> int:
    from .daemon.purge import plan_purge, purge

    plan = plan_purge(instance)
    if not args.json:
        verb = "would" if args.dry_run else "will"
        print(f"drums shutdown --purge {verb}, for instance {instance.name}:")
        for line in plan.lines():
            print(f"  {line}")
        sys.stdout.flush()
    if args.dry_run:
        if args.json:
            print(json.dumps({"plan": plan.to_dict(), "dry_run": True}, indent=1))
        return 0
    report = purge(instance, plan)
    done = report.daemon_stopped or report.removed or report.unmounted
    _out(args, {"plan": plan.to_dict(), **report.to_dict()},
         f"purged instance {instance.name}: removed {len(report.removed)} path(s), unmounted "
         f"{len(report.unmounted)}" if done else "nothing to purge")
    return 0


def _sweep(args, instance) -> int:
    from pathlib import Path

    from .sweep.driver import sweep

    root = Path(args.ledger) if args.ledger else instance.ledger_root
    report = sweep(root, run=args.run, dry_run=args.dry_run, only_dead=not args.force,
                   kill_timeout=args.kill_timeout)
    if args.json:
        print(report.to_json(indent=1))
    else:
        done = [r for r in report.runs if r.status != "skipped-alive"]
        for r in done:
            print(r.summary())
            for e in r.errors:
                print(f"  error: {e}")
            for s in r.survivors:
                print(f"  survivor: {s}")
        for e in report.global_errors:
            print(f"error: {e}")
        c = report.counts()
        if done or report.global_errors:
            what = ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in c.items() if v)
            verb = "would clean" if args.dry_run else "cleaned"
            print(f"sweep of {root}: {len(done)} run(s); {verb}: {what or 'nothing'}")
        else:
            alive = len(report.runs)
            print(f"sweep of {root}: nothing to clean ({alive} live run(s) left alone)")
    if report.errors:
        return EXIT_FAILED
    return EXIT_SURVIVORS if report.survivors else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
