"""The wire between :class:`~drums_core.client.Client` and ``drumsd``: one codec and one table of operations.

Framing: one JSON object per line (``\\n``-terminated UTF-8) each way on the daemon's unix socket.

- a request is ``{"op": NAME, "args": {...}}``;
- a reply is ``{"ok": true, "result": VALUE}`` or ``{"ok": false, "error": {"code", "reason",
  "message", "detail"}}``: the error a :class:`~drums_core.errors.DrumsError` sends with
  ``to_wire`` and :func:`drums_core.errors.from_wire` rebuilds as the same class, reason and detail;
- values are JSON, except ``bytes`` (``{"__bytes__": base64}``) and the daemon's records and
  dataclasses, which travel as their JSON objects (:func:`to_wire`; :func:`from_wire` undoes it).

:data:`OPS` is the table of operations: for each, its arguments (their wire names, in the order of
the Client method's and the serving method's parameters, with types and defaults), the
:class:`~drums_core.session.supervisor.Supervisor` method that serves it, whether the daemon's own
handler (``Daemon.op_<name>``) wraps it, the :class:`~drums_core.client.Client` method and the
``drums`` subcommand that send it. The client builds and checks its requests through it
(:meth:`Op.request`), the daemon checks what it receives and dispatches through it
(:func:`decode_request`), the CLI maps its subcommands onto it (:func:`for_command`). A request
the table refuses (unknown operation; a missing, unknown or mistyped argument) is an
:class:`~drums_core.errors.InvalidArgument` and changes nothing.

Only the standard library and :mod:`drums_core.errors` are imported here.
"""
from __future__ import annotations

import base64
import json
from dataclasses import asdict, dataclass
from typing import Any

from .errors import DrumsError, Internal, InvalidArgument, from_wire as error_from_wire
from .reasons import Reason

__all__ = ["Arg", "FRAME_END", "OPS", "Op", "REQUIRED", "decode_reply", "decode_request", "encode_error",
           "encode_reply", "encode_request", "for_command", "from_wire", "lookup", "to_wire"]

FRAME_END = b"\n"


# ------------------------------------------------------------------ values
def to_wire(value: Any) -> Any:
    """``value`` as JSON can carry it: bytes as ``{"__bytes__": base64}``, a daemon record by its
    ``public()`` or ``to_dict()``, another dataclass by its fields; lists and dicts element-wise."""
    if isinstance(value, bytes):
        return {"__bytes__": base64.b64encode(value).decode()}
    if hasattr(value, "public"):
        return value.public()
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if hasattr(value, "__dataclass_fields__"):
        return asdict(value)
    if isinstance(value, list):
        return [to_wire(v) for v in value]
    if isinstance(value, dict):
        return {k: to_wire(v) for k, v in value.items()}
    return value


def from_wire(value: Any) -> Any:
    """A decoded JSON value with its ``{"__bytes__": base64}`` objects turned back into bytes."""
    if isinstance(value, dict):
        if set(value) == {"__bytes__"}:
            return base64.b64decode(value["__bytes__"])
        return {k: from_wire(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_wire(v) for v in value]
    return value


def _frame(obj: dict) -> bytes:
    return json.dumps(obj).encode() + FRAME_END


# ------------------------------------------------------------------ the table
class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()
_TYPE_NAMES = {str: "a string", int: "a whole number", float: "a number", bool: "true or false",
               list: "a list", dict: "an object"}


@dataclass(frozen=True)
class Arg:
    """One argument of an operation: its wire ``name``, JSON ``type`` (``str``, ``int``, ``float``
    (an int is taken), ``bool``, ``list`` or ``dict``) and ``default`` (:data:`REQUIRED` for none; a
    default of None also lets None through). A value of the wrong type is refused as
    ``InvalidArgument`` with ``reason`` (the reason the serving method gives for the same mistake,
    else ``BAD_REQUEST``). ``omit_default``: the client leaves the argument out while it has its
    default value (a daemon that predates it accepts the request unchanged)."""

    name: str
    type: type
    default: Any = REQUIRED
    reason: str = Reason.BAD_REQUEST
    omit_default: bool = False

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    def check(self, op: str, value: Any) -> Any:
        """``value`` if it fits (an int given for a float becomes a float, a tuple for a list a list),
        else InvalidArgument."""
        if value is None and self.default is None:
            return None
        t = self.type
        if t is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if t is list and isinstance(value, tuple):  # what JSON sends as a list
            return list(value)
        if not isinstance(value, t) or (t is not bool and isinstance(value, bool)):
            want = _TYPE_NAMES[t] + (" or null" if self.default is None else "")
            raise InvalidArgument(f"{op}: {self.name} must be {want}, not {_short(value)}", reason=self.reason)
        return value


def _short(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


@dataclass(frozen=True)
class Op:
    """One operation of the daemon.

    ``args`` in the order of the parameters of the Client method (which may name them otherwise:
    ``ref`` for ``snapshot``) and of the method serving it. ``serves``: the Supervisor method that
    serves it (None: the daemon serves it from its store, keeper or itself). ``in_daemon``: the
    daemon's own ``Daemon.op_<name>`` handles it (around ``serves`` where set), with the arguments
    by name; otherwise ``Supervisor.<serves>`` is called with them in order. ``client``: the Client
    method that sends it (None: only through ``Client.call``). ``cli``: the ``drums`` subcommand
    that runs it alone. ``long_running``: it may take many seconds (a desktop boots, CRIU dumps or
    restores, a command runs); the daemon runs it to completion even when the client goes away, and
    logs it. ``mutates``: it changes sessions, snapshots or the daemon. ``test_hook``: it exists
    only in a daemon started with ``DRUMS_TEST_HOOKS=1``."""

    name: str
    args: tuple[Arg, ...] = ()
    serves: str | None = None
    in_daemon: bool = False
    client: str | None = None
    cli: str | None = None
    long_running: bool = False
    mutates: bool = False
    test_hook: bool = False

    def check(self, args: Any) -> dict[str, Any]:
        """The request's arguments checked against the table, defaults filled in, in table order.

        Raises InvalidArgument: ``BAD_REQUEST`` when ``args`` is not an object or names an argument
        the operation does not have, or lacks a required one; the argument's reason when a value
        has the wrong type."""
        if not isinstance(args, dict):
            raise InvalidArgument(f"{self.name}: args must be an object", reason=Reason.BAD_REQUEST)
        unknown = sorted(set(args) - {a.name for a in self.args})
        if unknown:
            raise InvalidArgument(f"{self.name}: unknown argument(s) {', '.join(map(repr, unknown))}; it takes "
                                  f"{', '.join(a.name for a in self.args) or 'none'}", reason=Reason.BAD_REQUEST)
        out = {}
        for a in self.args:
            if a.name not in args:
                if a.required:
                    raise InvalidArgument(f"{self.name}: missing argument {a.name!r}", reason=Reason.BAD_REQUEST)
                out[a.name] = a.default
            else:
                out[a.name] = a.check(self.name, args[a.name])
        return out

    def request(self, *values: Any, **named: Any) -> dict[str, Any]:
        """The ``args`` a client sends: ``values`` in table order, then ``named`` by wire name,
        checked (:meth:`check`), every argument present but those ``omit_default`` at their default."""
        if len(values) > len(self.args):
            raise InvalidArgument(f"{self.name} takes {len(self.args)} arguments, not {len(values)}",
                                  reason=Reason.BAD_REQUEST)
        given = dict(zip((a.name for a in self.args), values, strict=False))
        twice = sorted(set(given) & set(named))
        if twice:
            raise InvalidArgument(f"{self.name}: {', '.join(twice)} given twice", reason=Reason.BAD_REQUEST)
        full = self.check({**given, **named})
        return {a.name: full[a.name] for a in self.args
                if not (a.omit_default and full[a.name] == a.default)}

    def from_namespace(self, ns: Any) -> list[Any]:
        """The arguments, in table order, from an argparse namespace whose attributes are named by
        wire name, up to the last one it has (those before it it lacks: their defaults); to call the
        Client method positionally."""
        given = [hasattr(ns, a.name) for a in self.args]
        last = max((i for i, g in enumerate(given) if g), default=-1)
        return [getattr(ns, a.name, a.default) for a in self.args[:last + 1]]


def _named(name: str) -> Arg:
    """A required session id, or snapshot id or name: a non-string is what the serving method calls
    an invalid name."""
    return Arg(name, str, reason=Reason.INVALID_NAME)


_SESSION = _named("session")
_SNAPSHOT = _named("snapshot")  # an id, or a name (the newest of that name)
_SCOPE = Arg("scope", str, None, reason=Reason.INVALID_NAME)
_SCOPE_RAW = Arg("scope", str, None, reason=Reason.INVALID_NAME, omit_default=True)  # not one of the Client method's
_LONG = {"long_running": True, "mutates": True}

OPS: dict[str, Op] = {op.name: op for op in (
    # sessions
    Op("create", (Arg("spec", dict, None, reason=Reason.BAD_SPEC),), serves="create", client="create", **_LONG),
    Op("checkpoint", (_SESSION, Arg("name", str, None, reason=Reason.INVALID_NAME),
                      Arg("snapshot_id", str, None, reason=Reason.INVALID_NAME), Arg("leave_running", bool, False),
                      _SCOPE, Arg("cache", bool, False, omit_default=True)),
       serves="checkpoint", in_daemon=True, client="checkpoint", cli="checkpoint", **_LONG),
    Op("restore", (_SNAPSHOT, Arg("count", int, 1, reason=Reason.BAD_COUNT), Arg("wait_live", bool, False),
                   Arg("expect_window", str, None, reason=Reason.BAD_WINDOW), _SCOPE,
                   Arg("min_nonblank", float, 0.0, reason=Reason.BAD_NONBLANK)),
       serves="restore", client="restore", cli="restore", **_LONG),
    Op("destroy", (_SESSION,), serves="destroy", client="destroy", cli="destroy", **_LONG),
    Op("list", serves="list_sessions", client="list", cli="ls"),
    Op("get", (_SESSION,), serves="get", client="get"),
    Op("wait_live", (_SESSION, Arg("timeout", float, 30.0)), serves="wait_live", client="wait_live",
       long_running=True),
    Op("exec", (_SESSION, Arg("argv", list, reason=Reason.BAD_COMMAND), Arg("user", str, None, reason=Reason.BAD_USER),
                Arg("timeout", float, 120.0), Arg("input", str, None)),
       serves="exec", client="exec", cli="exec", **_LONG),
    Op("screenshot", (_SESSION,), serves="screenshot", client="screenshot", cli="screenshot"),
    Op("windows", (_SESSION,), serves="windows", client="windows"),
    Op("memory", (_SESSION,), serves="memory", client="memory"),
    Op("processes", (_SESSION,), serves="processes", client="processes"),
    Op("audit", (_named("a"), _named("b")), in_daemon=True, client="audit", cli="audit"),
    # the snapshot store
    Op("snapshots", in_daemon=True, client="snapshots"),
    Op("store", in_daemon=True, client="store"),
    Op("snapshot", (_SNAPSHOT, _SCOPE), in_daemon=True, client="snapshot"),
    Op("spill_snapshot", (_SNAPSHOT, _SCOPE_RAW), in_daemon=True, client="spill_snapshot", cli="spill", **_LONG),
    Op("delete_snapshot", (_SNAPSHOT, _SCOPE_RAW), in_daemon=True, client="delete_snapshot", cli="delete-snapshot",
       mutates=True),
    Op("export_snapshot", (_SNAPSHOT, Arg("dest", str), Arg("skip", list, None)), in_daemon=True,
       long_running=True),
    Op("import_snapshot", (Arg("path", str), Arg("sha256", str)), in_daemon=True, **_LONG),
    # the daemon
    Op("ping", in_daemon=True, client="ping"),
    Op("stats", in_daemon=True, client="stats"),
    Op("inject", (Arg("point", str), Arg("times", int, 1)), in_daemon=True, mutates=True, test_hook=True),
    Op("shutdown", (Arg("destroy_sessions", bool, False),), serves="shutdown", in_daemon=True, client="shutdown",
       mutates=True),
)}


def lookup(name: Any, hooks: bool = False) -> Op:
    """The operation named ``name`` (a test hook only when ``hooks``); InvalidArgument ``UNKNOWN_OP``."""
    op = OPS.get(name) if isinstance(name, str) else None
    if op is None or (op.test_hook and not hooks):
        raise InvalidArgument(f"unknown operation {name!r}", reason=Reason.UNKNOWN_OP)
    return op


def for_command(cmd: str) -> Op | None:
    """The operation the ``drums`` subcommand ``cmd`` runs alone, or None."""
    return next((op for op in OPS.values() if op.cli == cmd), None)


# ------------------------------------------------------------------ requests
def encode_request(op: str, args: dict[str, Any]) -> bytes:
    """One request line."""
    return _frame({"op": op, "args": to_wire(args)})


def decode_request(line: bytes, hooks: bool = False) -> tuple[Op, dict[str, Any]]:
    """The operation and its checked arguments (:meth:`Op.check`) of one request line.

    Raises InvalidArgument: ``BAD_REQUEST`` (not JSON, not an object with a string ``op``, bad
    arguments), ``UNKNOWN_OP``, or an argument's own reason for a mistyped value."""
    try:
        req = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"request is not JSON: {exc}", reason=Reason.BAD_REQUEST) from None
    if not isinstance(req, dict) or not isinstance(req.get("op"), str):
        raise InvalidArgument("request must be an object with an 'op'", reason=Reason.BAD_REQUEST)
    op = lookup(req["op"], hooks)
    args = req.get("args")
    return op, op.check(from_wire({} if args is None else args))


# ------------------------------------------------------------------ replies
def encode_reply(result: Any) -> bytes:
    """The reply line of a result (an Internal error's when the result cannot be sent as JSON)."""
    try:
        return _frame({"ok": True, "result": to_wire(result)})
    except (TypeError, ValueError) as exc:
        return encode_error(Internal(f"internal error: result not serialisable: {exc}", reason=Reason.BAD_RESULT))


def encode_error(exc: BaseException) -> bytes:
    """The reply line of a failure: a DrumsError as itself (reason and detail kept; a detail JSON
    cannot carry goes as text), a KeyError as InvalidArgument ``BAD_REQUEST``, anything else as
    :class:`~drums_core.errors.Internal`."""
    if not isinstance(exc, DrumsError):
        if isinstance(exc, KeyError):
            exc = InvalidArgument(f"missing field {exc}", reason=Reason.BAD_REQUEST)
        else:
            exc = Internal(f"internal error: {exc!r}")
    return json.dumps({"ok": False, "error": exc.to_wire()}, default=str).encode() + FRAME_END


def decode_reply(data: bytes) -> Any:
    """The result a reply line carries, decoded (:func:`from_wire`); the error it carries, raised
    as its own class (:func:`drums_core.errors.from_wire`); Internal ``BAD_REPLY`` when it is not a reply."""
    try:
        reply = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise Internal(f"drumsd sent a reply that is not JSON: {exc}", reason=Reason.BAD_REPLY) from None
    if not isinstance(reply, dict):
        raise Internal(f"drumsd sent a reply that is not an object: {_short(reply)}", reason=Reason.BAD_REPLY)
    if not reply.get("ok"):
        error = reply.get("error")
        raise error_from_wire(error if isinstance(error, dict) else {})
    return from_wire(reply.get("result"))
