"""A hostile accessible application, run INSIDE a desktop by tests/test_a11y.py (system python3 + Gio).

It speaks AT-SPI's D-Bus protocol itself (no toolkit), so it can publish what a toolkit never would
but any program an agent runs could: it registers with the desktop's AT-SPI registry like every
toolkit's bridge (``org.a11y.atspi.Socket.Embed``) and answers the walker's calls from a message
filter. ``big`` publishes an endless tree (a node with 2**31-1 children, a 10,000-deep chain, a
node that is its own child three times), names and attribute keys made to break XML (markup,
control characters, ``]]>``, quotes, names that are not XML names), a 1 MiB name, a text that
claims 2**31-1 characters and sends 8 MiB, a role outside AT-SPI's range with a markup role name,
absurd extents, 2**31-1 actions, and a node that answers with the wrong types. ``frozen`` answers
for its application object but never for its child (a hung app). Writes ``<ready file>`` once the
registry has taken it (its pid in it), then serves until killed.

usage: python3 a11y_hostile.py big|frozen READY_FILE
"""
import os
import sys
import threading

from gi.repository import Gio, GLib

ROOT = "/org/a11y/atspi/accessible/root"
BASE = "/org/a11y/atspi/accessible/"
ACC = "org.a11y.atspi.Accessible"
ROLE_APPLICATION, ROLE_PANEL, ROLE_PUSH_BUTTON, ROLE_PARAGRAPH = 75, 39, 43, 73
# STATE_ENABLED 8, SENSITIVE 24, SHOWING 25, VISIBLE 30 (bits of the first word)
STATES = [(1 << 8) | (1 << 24) | (1 << 25) | (1 << 30), 0]
EVIL = 'evil<app name="x">&amp;\'"\x01\x08\x0b\x1b]]><!--'
EVIL_KEYS = {"": "empty key", "1st": "digit first", "a b<c>": "space and markup", "xmlns": "ns?",
             "x:y": "colon", "\u00e9vil": "non-ascii", "k" * 300: "long key", "q": EVIL}
MODE = sys.argv[1]
calls = {"n": 0}


def node(path):
    """(name, role, child paths function, child count, interfaces, extra) of an object path."""
    if path == ROOT:
        name = "evil-" + MODE + EVIL
        kids = ["frozen"] if MODE == "frozen" else ["wide", "deep_0", "huge", "liar", "weird", "cycle"]
        return dict(name=name, role=ROLE_APPLICATION, count=len(kids), child=lambda i: kids[i])
    leaf = path[len(BASE):]
    if leaf == "wide":
        return dict(name="wide" + EVIL, role=ROLE_PANEL, count=2**31 - 1, child=lambda i: f"leaf_{i}")
    if leaf.startswith("leaf_"):
        return dict(name=(EVIL * 120)[:4096], role=ROLE_PUSH_BUTTON, count=0, attrs=EVIL_KEYS,
                    actions=True)
    if leaf.startswith("deep_"):
        d = int(leaf[5:])
        return dict(name=f"deep {d}", role=ROLE_PANEL, count=1 if d < 10_000 else 0,
                    child=lambda i: f"deep_{d + 1}")
    if leaf == "huge":
        return dict(name="H" * 2**20, role=ROLE_PARAGRAPH, count=0, text=True)
    if leaf == "weird":
        return dict(name="weird", role=9999, count=0, attrs=EVIL_KEYS)
    if leaf == "liar":
        return dict(name="liar", role=ROLE_PANEL, count=0, liar=True)
    if leaf == "cycle":
        return dict(name="cycle" + EVIL, role=ROLE_PANEL, count=3, child=lambda i: "cycle")
    if leaf == "frozen":
        return dict(frozen=True)
    return None


def ref(conn, leaf):
    return (conn.get_unique_name(), BASE + leaf)


def answer(conn, msg):
    """The reply body (a GLib.Variant tuple), or None to never answer, or an error string."""
    path, iface, member = msg.get_path(), msg.get_interface(), msg.get_member()
    n = node(path)
    if n is None:
        return "org.freedesktop.DBus.Error.UnknownObject"
    if n.get("frozen"):
        return None
    args = msg.get_body().unpack() if msg.get_body() is not None else ()
    if n.get("liar"):
        return GLib.Variant("(s)", ("not what you asked for",))
    if iface == "org.freedesktop.DBus.Properties" and member in ("Get", "GetAll"):
        props = {
            "Name": GLib.Variant("s", n["name"]), "Description": GLib.Variant("s", EVIL),
            "Parent": GLib.Variant("(so)", ("", "/org/a11y/atspi/null")),
            "ChildCount": GLib.Variant("i", n["count"]), "Locale": GLib.Variant("s", "C"),
            "AccessibleId": GLib.Variant("s", ""), "HelpText": GLib.Variant("s", ""),
            "ToolkitName": GLib.Variant("s", "evil"), "Version": GLib.Variant("s", "1"),
            "AtspiVersion": GLib.Variant("s", "2.1"), "Id": GLib.Variant("i", 1),
            "CharacterCount": GLib.Variant("i", 2**31 - 1), "CaretOffset": GLib.Variant("i", 0),
            "NActions": GLib.Variant("i", 2**31 - 1),
            "CurrentValue": GLib.Variant("d", float("nan")), "MinimumValue": GLib.Variant("d", -1e308),
            "MaximumValue": GLib.Variant("d", float("inf")), "MinimumIncrement": GLib.Variant("d", 0.0),
        }
        if member == "Get":
            return GLib.Variant("(v)", (props.get(args[1], GLib.Variant("s", "")),))
        return GLib.Variant("(a{sv})", (props,))
    if iface == "org.freedesktop.DBus.Properties" and member == "Set":
        return GLib.Variant("()", ())
    if iface == "org.freedesktop.DBus.Introspectable":
        return GLib.Variant("(s)", ("<node/>",))
    if iface == ACC:
        if member == "GetChildAtIndex":
            i = args[0]
            if 0 <= i < n["count"]:
                return GLib.Variant("((so))", (ref(conn, n["child"](i)),))
            return GLib.Variant("((so))", (("", "/org/a11y/atspi/null"),))
        if member == "GetChildren":
            return GLib.Variant("(a(so))", ([ref(conn, n["child"](i)) for i in range(min(n["count"], 16))],))
        if member == "GetRole":
            return GLib.Variant("(u)", (n["role"],))
        if member in ("GetRoleName", "GetLocalizedRoleName"):
            return GLib.Variant("(s)", ("<script>alert(1)</script> evil role" + EVIL,))
        if member == "GetState":
            return GLib.Variant("(au)", (STATES,))
        if member == "GetAttributes":
            return GLib.Variant("(a{ss})", (n.get("attrs", {"toolkit": "evil"}),))
        if member == "GetInterfaces":
            ifaces = [ACC, "org.a11y.atspi.Component", "org.a11y.atspi.Value", "org.a11y.atspi.Image"]
            if n.get("text"):
                ifaces.append("org.a11y.atspi.Text")
            if n.get("actions"):
                ifaces.append("org.a11y.atspi.Action")
            if path == ROOT:
                ifaces.append("org.a11y.atspi.Application")
            return GLib.Variant("(as)", (ifaces,))
        if member == "GetIndexInParent":
            return GLib.Variant("(i)", (0,))
        if member == "GetApplication":
            return GLib.Variant("((so))", ((conn.get_unique_name(), ROOT),))
        if member == "GetRelationSet":
            return GLib.Variant("(a(ua(so)))", ([],))
    if iface == "org.a11y.atspi.Component" and member == "GetExtents":
        return GLib.Variant("((iiii))", ((-2**31, 2**31 - 1, 2**31 - 1, -5),))
    if iface == "org.a11y.atspi.Text" and member == "GetText":
        return GLib.Variant("(s)", (("T<&>\x01" * (2**21))[: 8 * 2**20],))
    if iface == "org.a11y.atspi.Action" and member in ("GetName", "GetDescription", "GetKeyBinding"):
        return GLib.Variant("(s)", (f"act {args[0]} <&>" + EVIL,))
    if iface == "org.a11y.atspi.Action" and member == "GetActions":
        return GLib.Variant("(a(sss))", ([("a b<c", EVIL, EVIL)] * 64,))
    return "org.freedesktop.DBus.Error.UnknownMethod"


def on_message(conn, msg, incoming, _data):
    if not incoming or msg.get_message_type() != Gio.DBusMessageType.METHOD_CALL:
        return msg
    if msg.get_destination() != conn.get_unique_name():
        return msg
    calls["n"] += 1
    try:
        body = answer(conn, msg)
    except Exception as exc:  # noqa: BLE001 - a bug here answers with an error, as an app would
        body = "org.freedesktop.DBus.Error.Failed"
        print("error", msg.get_member(), exc, file=sys.stderr)
    if body is None:
        return None  # never answered: the caller waits for its timeout
    if isinstance(body, str):
        reply = Gio.DBusMessage.new_method_error_literal(msg, body, "evil says no")
    else:
        reply = Gio.DBusMessage.new_method_reply(msg)
        reply.set_body(body)
    conn.send_message(reply, Gio.DBusSendMessageFlags.NONE)
    return None


def main():
    ready = sys.argv[2]
    session = Gio.bus_get_sync(Gio.BusType.SESSION, None)
    addr = session.call_sync("org.a11y.Bus", "/org/a11y/bus", "org.a11y.Bus", "GetAddress", None,
                             GLib.VariantType("(s)"), Gio.DBusCallFlags.NONE, 10000, None).unpack()[0]
    flags = Gio.DBusConnectionFlags.AUTHENTICATION_CLIENT | Gio.DBusConnectionFlags.MESSAGE_BUS_CONNECTION
    conn = Gio.DBusConnection.new_for_address_sync(addr, flags, None, None)
    conn.add_filter(on_message, None)
    conn.call_sync("org.a11y.atspi.Registry", ROOT, "org.a11y.atspi.Socket", "Embed",
                   GLib.Variant("((so))", ((conn.get_unique_name(), ROOT),)), GLib.VariantType("((so))"),
                   Gio.DBusCallFlags.NONE, 10000, None)
    with open(ready + ".tmp", "w") as f:
        f.write(f"{os.getpid()}\n")
    os.rename(ready + ".tmp", ready)
    threading.Event().wait()


if __name__ == "__main__":
    main()
