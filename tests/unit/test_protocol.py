"""The wire (drums_core/protocol.py), checked without a daemon or root: the codec keeps today's bytes
and carries every error class with its reason and detail; the table of operations agrees with the
Client's methods, the Supervisor's and the daemon's handlers and the CLI's subcommands, both ways;
bad requests are refused as InvalidArgument before anything runs; a Client talks to the daemon's
request handler over a real unix socket."""
from __future__ import annotations

import base64
import inspect
import json
import socket
import threading
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from drums_core import errors, protocol
from drums_core.client import Client
from drums_core.protocol import OPS

# Client methods that are not one operation each: the raw door, and the daemon's starting
TRANSPORT = {"call", "start_daemon", "daemon_pid"}
# operations sent only through Client.call: the farm's node agent (transfer) and the fault tests (inject)
RAW_ONLY = {"export_snapshot", "import_snapshot", "inject"}
# public Supervisor methods that are its own helpers (restore steps, recovery), not operations
NOT_OPS = {"image_lowers", "check_snapshot_image"}


def _supervisor():
    from drums_core.session.supervisor import Supervisor

    return Supervisor


def _daemon():
    from drums_core.daemon.server import Daemon

    return Daemon


def _params(fn) -> list[inspect.Parameter]:
    return [p for p in inspect.signature(fn).parameters.values() if p.name != "self"]


def _public_methods(cls) -> set[str]:
    """Public methods defined by ``cls`` or a class it is made of (the Supervisor's checkpoint and restore halves)."""
    return {n for klass in cls.__mro__ if klass is not object for n, v in vars(klass).items()
            if not n.startswith("_") and inspect.isfunction(v)}


# ------------------------------------------------------------------ the codec
@pytest.mark.parametrize("op,args", [
    ("ping", {}), ("restore", {"snapshot": "s", "count": 2, "wait_live": False, "expect_window": None,
                               "scope": None, "min_nonblank": 0.0}),
    ("exec", {"session": "a", "argv": ["sh", "-c", "echo \u00e9"], "user": "user", "timeout": 5.0, "input": "x"}),
])
def test_requests_keep_todays_bytes(op, args):
    assert protocol.encode_request(op, args) == json.dumps({"op": op, "args": args}).encode() + b"\n"


def test_values_round_trip_with_bytes_records_and_dataclasses():
    @dataclass
    class P:
        pid: int
        comm: str

    class Rec:
        def to_dict(self):
            return {"id": "r"}

    class Pub:
        def public(self):
            return {"id": "p"}

    value = {"png": b"\x89PNG\x00\xff", "procs": [P(1, "init")], "r": Rec(), "p": Pub(), "n": [1, "a", None]}
    wire = json.loads(json.dumps(protocol.to_wire(value)))
    assert wire["png"] == {"__bytes__": base64.b64encode(b"\x89PNG\x00\xff").decode()}
    assert protocol.from_wire(wire) == {"png": b"\x89PNG\x00\xff", "procs": [{"pid": 1, "comm": "init"}],
                                        "r": {"id": "r"}, "p": {"id": "p"}, "n": [1, "a", None]}


def test_replies_carry_results():
    line = protocol.encode_reply([{"id": "s1"}, b"ab"])
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert json.loads(line)["ok"] is True
    assert protocol.decode_reply(line) == [{"id": "s1"}, b"ab"]


@pytest.mark.parametrize("cls", [errors.Unavailable, errors.Busy, errors.FailedPrecondition, errors.NotFound,
                                 errors.InvalidArgument, errors.Internal])
def test_every_error_class_crosses_with_reason_and_detail(cls):
    exc = cls("it failed", reason="SOME_REASON", detail={"lines": ["criu: 1", "criu: 2"], "n": 3})
    line = protocol.encode_error(exc)
    assert json.loads(line) == {"ok": False, "error": {"code": cls.code, "reason": "SOME_REASON",
                                                       "message": "it failed",
                                                       "detail": {"lines": ["criu: 1", "criu: 2"], "n": 3}}}
    with pytest.raises(cls) as got:
        protocol.decode_reply(line)
    assert type(got.value) is cls
    assert (got.value.reason, got.value.message, got.value.detail) == ("SOME_REASON", "it failed", exc.detail)


def test_other_failures_cross_as_internal_or_bad_request():
    with pytest.raises(errors.Internal) as got:
        protocol.decode_reply(protocol.encode_error(RuntimeError("boom")))
    assert got.value.reason == "INTERNAL" and "boom" in got.value.message
    with pytest.raises(errors.InvalidArgument) as bad:
        protocol.decode_reply(protocol.encode_error(KeyError("argv")))
    assert bad.value.reason == "BAD_REQUEST"
    # a detail JSON cannot carry goes as text; a result it cannot carry is an Internal error, not a dead line
    with pytest.raises(errors.NotFound) as nf:
        protocol.decode_reply(protocol.encode_error(errors.NotFound("gone", detail={"at": object})))
    assert isinstance(nf.value.detail["at"], str)
    with pytest.raises(errors.Internal) as res:
        protocol.decode_reply(protocol.encode_reply({"x": {1, 2}}))
    assert res.value.reason == "BAD_RESULT"


@pytest.mark.parametrize("line", [b"not json\n", b"[1]\n", b"\xff\xfe\n"])
def test_a_reply_that_is_not_one_is_internal(line):
    with pytest.raises(errors.Internal) as got:
        protocol.decode_reply(line)
    assert got.value.reason == "BAD_REPLY"


def test_a_failure_without_an_error_is_internal():
    with pytest.raises(errors.Internal):
        protocol.decode_reply(b'{"ok": false}\n')
    with pytest.raises(errors.NotFound) as got:  # a code this side knows; an unknown one is Internal
        protocol.decode_reply(b'{"ok": false, "error": {"code": "NOT_FOUND", "message": "m"}}\n')
    assert got.value.reason == "NOT_FOUND"


# ------------------------------------------------------------------ checking requests
@pytest.mark.parametrize("line,reason", [
    (b"{nope\n", "BAD_REQUEST"), (b"[]\n", "BAD_REQUEST"), (b'{"args": {}}\n', "BAD_REQUEST"),
    (b'{"op": 3}\n', "BAD_REQUEST"), (b'{"op": "launch_missiles"}\n', "UNKNOWN_OP"),
    (b'{"op": "inject", "args": {"point": "x"}}\n', "UNKNOWN_OP"),  # a test hook, hooks off
    (b'{"op": "get", "args": []}\n', "BAD_REQUEST"), (b'{"op": "get", "args": {}}\n', "BAD_REQUEST"),
    (b'{"op": "get", "args": {"session": "a", "sid": "a"}}\n', "BAD_REQUEST"),
    (b'{"op": "get", "args": {"session": 7}}\n', "INVALID_NAME"),
    (b'{"op": "restore", "args": {"snapshot": "s", "count": "2"}}\n', "BAD_COUNT"),
    (b'{"op": "restore", "args": {"snapshot": "s", "count": true}}\n', "BAD_COUNT"),
    (b'{"op": "restore", "args": {"snapshot": "s", "min_nonblank": "0.5"}}\n', "BAD_NONBLANK"),
    (b'{"op": "restore", "args": {"snapshot": "s", "min_nonblank": null}}\n', "BAD_NONBLANK"),
    (b'{"op": "restore", "args": {"snapshot": "s", "expect_window": ["a"]}}\n', "BAD_WINDOW"),
    (b'{"op": "restore", "args": {"snapshot": "s", "wait_live": "yes"}}\n', "BAD_REQUEST"),
    (b'{"op": "exec", "args": {"session": "a", "argv": "ls"}}\n', "BAD_COMMAND"),
    (b'{"op": "exec", "args": {"session": "a", "argv": ["ls"], "timeout": "1"}}\n', "BAD_REQUEST"),
    (b'{"op": "exec", "args": {"session": "a", "argv": ["ls"], "user": 0}}\n', "BAD_USER"),
    (b'{"op": "create", "args": {"spec": [1]}}\n', "BAD_SPEC"),
])
def test_bad_requests_are_invalid_arguments(line, reason):
    with pytest.raises(errors.InvalidArgument) as got:
        protocol.decode_request(line)
    assert got.value.reason == reason
    assert "\n" not in got.value.message


def test_requests_get_their_defaults_in_table_order():
    op, args = protocol.decode_request(b'{"op": "exec", "args": {"timeout": 3, "argv": ["ls"], "session": "a"}}')
    assert op is OPS["exec"]
    assert list(args.items()) == [("session", "a"), ("argv", ["ls"]), ("user", None), ("timeout", 3.0),
                                  ("input", None)]
    assert protocol.decode_request(b'{"op": "ping"}')[1] == {}
    assert protocol.decode_request(b'{"op": "ping", "args": null}')[1] == {}
    assert protocol.decode_request(b'{"op": "inject", "args": {"point": "p"}}', hooks=True)[1] == {"point": "p",
                                                                                                  "times": 1}


def test_client_requests_are_todays():
    assert OPS["checkpoint"].request("s1") == {"session": "s1", "name": None, "snapshot_id": None,
                                               "leave_running": False, "scope": None}  # no cache: older daemons
    assert OPS["checkpoint"].request("s1", None, None, True, None, True)["cache"] is True
    assert OPS["spill_snapshot"].request("x") == {"snapshot": "x"}
    assert OPS["exec"].request("a", ("ls", "-l"))["argv"] == ["ls", "-l"]  # a tuple travels as a list
    with pytest.raises(errors.InvalidArgument):
        OPS["get"].request("a", "b")
    with pytest.raises(errors.InvalidArgument):
        OPS["get"].request("a", session="b")


# ------------------------------------------------------------------ the table against its users
def test_the_table_is_well_formed():
    for name, op in OPS.items():
        assert op.name == name
        names = [a.name for a in op.args]
        assert len(set(names)) == len(names), name
        required = [a.required for a in op.args]
        assert required == sorted(required, reverse=True), f"{name}: a required argument after an optional one"
        for a in op.args:
            assert a.type in (str, int, float, bool, list, dict)
            assert a.required or a.default is None or isinstance(a.default, a.type), (name, a)
        assert op.serves or op.in_daemon, name
    assert protocol.lookup("restore") is OPS["restore"]
    assert protocol.for_command("ls") is OPS["list"] and protocol.for_command("up") is None


def test_every_op_has_a_client_method_and_every_client_method_an_op():
    for op in OPS.values():
        if op.client is None:
            continue
        method = getattr(Client, op.client, None)
        assert callable(method), f"op {op.name}: no Client.{op.client}"
        params = _params(method)
        for p, a in zip(params, op.args, strict=False):  # the Client's parameters are the table's, in its order
            want = inspect.Parameter.empty if a.required else a.default
            assert p.default == want, f"Client.{op.client}({p.name}) default {p.default!r}, the table's {want!r}"
        for a in op.args[len(params):]:
            assert not a.required and a.omit_default, f"Client.{op.client} lacks {a.name}, and sends it"
    sent = {op.client for op in OPS.values() if op.client}
    assert _public_methods(Client) - TRANSPORT == sent
    assert {op.name for op in OPS.values() if op.client is None} == RAW_ONLY


def test_every_op_has_a_server_and_every_supervisor_method_an_op():
    Supervisor, Daemon = _supervisor(), _daemon()
    for op in OPS.values():
        if op.serves:
            assert callable(getattr(Supervisor, op.serves, None)), f"op {op.name}: no Supervisor.{op.serves}"
        if op.in_daemon:
            handler = getattr(Daemon, f"op_{op.name}", None)
            assert callable(handler), f"op {op.name}: no Daemon.op_{op.name}"
            params = _params(handler)
            if not any(p.kind is p.VAR_KEYWORD for p in params):
                assert [p.name for p in params] == [a.name for a in op.args], op.name
        else:  # called with the arguments in table order
            params = _params(getattr(Supervisor, op.serves))
            assert len(params) == len(op.args), f"Supervisor.{op.serves} and the table's {op.name} differ"
            for p, a in zip(params, op.args, strict=True):
                want = inspect.Parameter.empty if a.required else a.default
                assert p.default == want, f"Supervisor.{op.serves}({p.name}) default {p.default!r}, table {want!r}"
    handlers = {n[3:] for n in vars(Daemon) if n.startswith("op_")}
    assert handlers == {op.name for op in OPS.values() if op.in_daemon}
    served = {op.serves for op in OPS.values() if op.serves}
    assert _public_methods(Supervisor) - NOT_OPS == served


def test_cli_subcommands_carry_the_ops_argument_names():
    from drums_core import cli

    _, cmds = cli.build_parser()
    for op in OPS.values():
        if op.cli is None:
            continue
        assert op.cli in cmds, op.cli
        dests = {a.dest for a in cmds[op.cli]._actions}
        missing = [a.name for a in op.args if a.required and a.name not in dests]
        assert not missing, f"drums {op.cli} has no option named {missing} for op {op.name}"


@pytest.mark.parametrize("argv", [["ls"], ["checkpoint", "s1", "--name", "n", "--cache"],
                                  ["restore", "snap", "--count", "2", "--wait-live"], ["destroy", "s1"],
                                  ["screenshot", "s1", "-o", "/tmp/x.png"],
                                  ["exec", "s1", "--user", "user", "--", "id"],
                                  ["delete-snapshot", "snap"], ["spill", "snap"], ["audit", "s1", "s2"]])
def test_cli_commands_call_their_client_method_with_its_arguments(argv, monkeypatch):
    from drums_core import cli

    for k in ("DRUMS_INSTANCE", "DRUMS_SLOT_BASE", "DRUMS_SLOT_COUNT"):
        monkeypatch.delenv(k, raising=False)
    ns, _ = cli.parse(argv)
    op = protocol.for_command(ns.cmd)
    values = op.from_namespace(ns)
    inspect.signature(getattr(Client, op.client)).bind(None, *values)  # the method takes them
    sent = op.request(*values)
    assert sent and all(sent[k] == v for k, v in vars(ns).items() if k in sent) or op.name == "list"


# ------------------------------------------------------------------ the daemon's handler, and a client talking to it
class FakeSupervisor:
    """Records what the daemon calls; answers like the Supervisor would."""

    def __init__(self):
        self.calls = []
        self.run, self.counters, self.sessions = "run-1", {"dumps": 0}, {}

    def __getattr__(self, name):
        def method(*args, **kw):
            self.calls.append((name, args, kw))
            return self.answers.get(name)
        return method

    answers = {
        "restore": [{"id": "s2", "state": "RUNNING", "address": "169.254.0.2", "display": 101}],
        "screenshot": b"\x89PNG",
        "exec": {"returncode": 0, "stdout": "hi\n", "stderr": ""},
        "processes": [SimpleNamespace(pid=1, nspid=1, comm="init", ppid=0, to_dict=lambda: {
            "pid": 1, "nspid": 1, "comm": "init", "ppid": 0})],
    }


@pytest.fixture
def daemon(monkeypatch):
    d = _daemon().__new__(_daemon())
    d.sup, d.instance, d.started, d.server = FakeSupervisor(), SimpleNamespace(name="t"), 0.0, None
    monkeypatch.delenv("DRUMS_TEST_HOOKS", raising=False)
    return d


def test_the_daemon_dispatches_through_the_table(daemon):
    reply = daemon.handle_line(b'{"op": "exec", "args": {"session": "a", "argv": ["echo", "hi"], "timeout": 5}}\n')
    assert json.loads(reply) == {"ok": True, "result": {"returncode": 0, "stdout": "hi\n", "stderr": ""}}
    assert daemon.sup.calls == [("exec", ("a", ["echo", "hi"], None, 5.0, None), {})]
    assert json.loads(daemon.handle_line(b'{"op": "ping"}'))["result"]["instance"] == "t"
    assert json.loads(daemon.handle_line(b'{"op": "stats"}'))["result"] == {"counters": {"dumps": 0},
                                                                           "sessions": 0, "run": "run-1"}


@pytest.mark.parametrize("line", [b'{"op": "destroy", "args": {"session": "a", "force": true}}',
                                  b'{"op": "destroy", "args": {}}', b'{"op": "destroy", "args": {"session": 1}}',
                                  b'{"op": "nuke"}', b'{"op": "inject", "args": {"point": "p", "times": 1}}',
                                  b'{"op": "shutdown", "args": {"destroy_sessions": "yes"}}'])
def test_bad_input_changes_nothing(daemon, line):
    reply = json.loads(daemon.handle_line(line))
    assert reply["ok"] is False and reply["error"]["code"] == "INVALID_ARGUMENT"
    assert daemon.sup.calls == []


def _serve(daemon, path):
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(8)

    def loop():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn, conn.makefile("rb") as rf:
                for line in rf:
                    conn.sendall(daemon.handle_line(line))

    threading.Thread(target=loop, daemon=True).start()
    return srv


def test_a_client_talks_to_the_daemons_handler(daemon, tmp_path):
    path = str(tmp_path / "drumsd.sock")
    srv = _serve(daemon, path)
    try:
        c = Client(SimpleNamespace(name="t", socket=path), autostart=False, timeout=10)
        sibs = c.restore("base", count=1, min_nonblank=0)
        assert sibs[0].id == "s2" and sibs[0]["display"] == 101
        assert daemon.sup.calls[-1] == ("restore", ("base", 1, False, None, None, 0.0), {})
        assert c.screenshot("s2") == b"\x89PNG"
        assert c.exec("s2", ["echo", "hi"]).stdout == "hi\n"
        assert c.processes("s2")[0].comm == "init"
        with pytest.raises(errors.InvalidArgument) as got:  # refused before it is sent
            c.restore("base", count="3")
        assert got.value.reason == "BAD_COUNT"
        with pytest.raises(errors.InvalidArgument) as unknown:  # the raw door: the daemon refuses
            c.call("restore", snapshot="base", cuont=3)
        assert unknown.value.reason == "BAD_REQUEST" and "cuont" in unknown.value.message
        with pytest.raises(errors.InvalidArgument) as hook:
            c.call("inject", point="p")
        assert hook.value.reason == "UNKNOWN_OP"
        assert [call[0] for call in daemon.sup.calls] == ["restore", "screenshot", "exec", "processes"]
    finally:
        srv.close()
