"""The public API, in the manner of trio's export test: what ``__all__`` lists exists and is documented,
``Client``'s methods say what they raise, importing the packages stays light, and the typed records
give back exactly the daemon's JSON. No root needed."""
from __future__ import annotations

import copy
import dataclasses
import inspect
import json
import pickle
import pydoc
import re
import subprocess
import sys
from pathlib import Path

import pytest

import drums_core
import drums_osworld
from drums_core import errors, records

REPO = Path(__file__).resolve().parents[2]
PACKAGES = [drums_core, drums_osworld]
ERROR_NAMES = {cls.__name__ for cls in (errors.DrumsError, *errors._BY_CODE.values())}
# Optional or heavy dependencies a plain ``import drums_core, drums_osworld`` must not pull in: OSWorld,
# Ray, torch, and what only the daemon (pycriu, pyroute2) or the guest (Xlib, pyautogui, flask) needs.
HEAVY = ("desktop_env", "ray", "torch", "pycriu", "pyroute2", "Xlib", "pyautogui", "flask", "PIL", "requests",
         "matplotlib")


def _public_names(pkg) -> list[str]:
    return list(pkg.__all__)


def _own_doc(obj) -> str:
    """The docstring ``obj`` has itself (a class's inherited one does not count)."""
    if inspect.isclass(obj):
        return (vars(obj).get("__doc__") or "").strip()
    return (getattr(obj, "__doc__", None) or "").strip()


def _public_members(cls):
    for name, value in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(value, property):
            yield name, value.fget
        elif isinstance(value, (classmethod, staticmethod)):
            yield name, value.__func__
        elif inspect.isfunction(value):
            yield name, value


@pytest.mark.parametrize("pkg", PACKAGES, ids=lambda p: p.__name__)
def test_all_names_exist_are_public_and_unique(pkg):
    names = _public_names(pkg)
    assert names, f"{pkg.__name__}.__all__ is empty"
    assert len(names) == len(set(names)), f"duplicates in {pkg.__name__}.__all__"
    private = [n for n in names if n.startswith("_")]
    assert not private, f"private names exported by {pkg.__name__}: {private}"
    missing = [n for n in names if not hasattr(pkg, n)]
    assert not missing, f"{pkg.__name__}.__all__ names what it does not have: {missing}"
    # dir() shows the lazily loaded names too
    assert set(names) <= set(dir(pkg))


@pytest.mark.parametrize("pkg", PACKAGES, ids=lambda p: p.__name__)
def test_every_export_is_documented(pkg):
    undocumented = []
    for name in _public_names(pkg):
        obj = getattr(pkg, name)
        if inspect.isclass(obj) or callable(obj):
            if not _own_doc(obj):
                undocumented.append(name)
            if inspect.isclass(obj):
                undocumented += [f"{name}.{m}" for m, fn in _public_members(obj) if not (fn.__doc__ or "").strip()]
        elif not re.search(rf"\b{re.escape(name)}\b", pkg.__doc__ or ""):
            undocumented.append(name)  # a constant: its package's docstring says what it is
    assert not undocumented, f"{pkg.__name__}: no docstring for {undocumented}"


def test_unknown_attribute_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no_such_name"):
        drums_osworld.no_such_name  # noqa: B018
    assert not hasattr(drums_core, "no_such_name")


def test_client_methods_say_what_they_raise():
    methods = dict(_public_members(drums_core.Client))
    assert {"create", "checkpoint", "restore", "destroy", "exec", "screenshot", "snapshots"} <= set(methods)
    vague = []
    for name, fn in methods.items():
        doc = fn.__doc__ or ""
        if not any(re.search(rf"\b{e}\b", doc) for e in ERROR_NAMES):
            vague.append(name)
    assert not vague, f"Client methods whose docstrings name no DrumsError class: {vague}"
    # every reason a docstring names is spelled like the daemon's stable codes
    for name, fn in methods.items():
        for section in re.findall(r"Raises:\n(.*?)(?:\n\s*\n|\Z)", fn.__doc__ or "", re.S):
            assert re.search(r"``[A-Z][A-Z_]+``", section), f"Client.{name}: its Raises section names no reason"


def test_help_of_restore_explains_arguments_result_and_errors():
    text = pydoc.render_doc(drums_core.Client.restore, renderer=pydoc.plaintext)
    for word in ("snapshot", "count", "wait_live", "expect_window", "min_nonblank", "Returns", "Session",
                 "Raises", "NotFound", "SNAPSHOT_NOT_FOUND", "Unavailable", "Internal", "InvalidArgument"):
        assert word in text, f"help(Client.restore) does not mention {word}"


def test_client_annotations_name_the_records():
    hints = {name: inspect.signature(fn).return_annotation for name, fn in _public_members(drums_core.Client)}
    assert hints["create"] == "Session" and hints["get"] == "Session" and hints["wait_live"] == "Session"
    assert hints["restore"] == "list[Session]" and hints["list"] == "list[Session]"
    assert hints["checkpoint"] == "Snapshot" and hints["snapshot"] == "Snapshot"
    assert hints["snapshots"] == "list[Snapshot]" and hints["exec"] == "ExecResult"


def test_py_typed_markers_ship():
    for pkg in PACKAGES:
        assert (Path(pkg.__file__).parent / "py.typed").is_file(), f"{pkg.__name__} has no py.typed"
    cfg = (REPO / "setup.cfg").read_text()
    assert re.search(r"^drums_core = py\.typed$", cfg, re.M) and re.search(r"^drums_osworld = py\.typed$", cfg, re.M)


def _fresh_modules(code: str) -> dict:
    """``sys.modules`` of a new interpreter after ``code``, which runs from the checkout under test."""
    prog = (f"import sys; sys.path.insert(0, {str(REPO)!r}); {code}; import json; "
            "print(json.dumps(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=120, cwd="/")
    assert out.returncode == 0, out.stderr
    return set(json.loads(out.stdout.splitlines()[-1]))


def test_import_is_light():
    mods = _fresh_modules("import drums_core, drums_osworld")
    heavy = sorted(m for m in mods if m.split(".")[0] in HEAVY)
    assert not heavy, f"import drums_core, drums_osworld imported {heavy}"
    # what the exports load on first use (tests/osworld/test_provider.py holds OSWorld's side of this)
    loaded = sorted(m for m in ("drums_core.client", "drums_osworld.provider.provider", "drums_osworld.desktop")
                    if m in mods)
    assert not loaded, f"import drums_core, drums_osworld loaded {loaded} before their first use"


def test_drums_core_alone_imports_nothing_of_osworld_or_gymnasium():
    mods = _fresh_modules("import drums_core")
    above = sorted(m for m in mods if m.split(".")[0] in ("drums_osworld", "gymnasium", *HEAVY))
    assert not above, f"import drums_core imported {above}"


def test_every_lazy_name_resolves_without_osworld_ray_or_torch():
    mods = _fresh_modules("import drums_osworld; [getattr(drums_osworld, n) for n in drums_osworld.__all__]")
    heavy = sorted(m for m in mods if m.split(".")[0] in ("desktop_env", "ray", "torch"))
    assert not heavy, f"resolving drums_osworld.__all__ imported {heavy}"


def test_the_acceptance_one_liner_lists_the_api():
    out = subprocess.run([sys.executable, "-c", "import drums_core, drums_osworld; "
                          "print(drums_core.__all__, drums_osworld.__all__)"],
                         capture_output=True, text=True, timeout=120, cwd=str(REPO))
    assert out.returncode == 0, out.stderr
    assert "'Client'" in out.stdout and "'Session'" in out.stdout and "'DrumsDesktopEnv'" in out.stdout


# ------------------------------------------------------------------ records against the daemon's own types
def _wire(value):
    """What the daemon sends for ``value`` and the client decodes: the codec's to_wire, through JSON."""
    from drums_core.protocol import to_wire

    return json.loads(json.dumps(to_wire(value)))


def _daemon_session():
    from drums_core.session.model import Session as DaemonSession
    from drums_core.session.model import SessionSpec, State

    return DaemonSession(id="s1", slot=7, state=State.RUNNING, spec=SessionSpec(), dir="/run/drums/x/sessions/s1",
                         root="/run/drums/x/sessions/s1/root", ifname="dvh7", host_address="169.254.0.29",
                         address="169.254.0.30", display=107, hostname="drums-s1", machine_id="m" * 32,
                         created=1.5, snapshot="snap1", layers=["/l1"], timings={"ready": 0.25})


def _daemon_snapshot():
    from drums_core.store.snapshots import Snapshot as DaemonSnapshot

    return DaemonSnapshot(id="snap1", name="base", scope="s1", session="s1", image="default", layers=["/l1"],
                          parent=None, created=2.5, boot_id="b", size=1024, params={"leave_running": True},
                          processes=[[1, "init", 3.0]], windows=["xterm"])


def test_session_record_is_the_daemons_json_field_for_field():
    wire = _wire(_daemon_session())
    assert set(wire) == set(records.Session._names), "records.Session and the daemon's Session.public() differ"
    s = records.Session.from_dict(wire)
    assert s.to_dict() == wire and list(s.to_dict()) == list(wire)
    assert json.dumps(s.to_dict()) == json.dumps(wire)
    assert s.extra == {}
    assert (s.id, s.address, s.state, s.display, s.timings["ready"]) == ("s1", "169.254.0.30", "RUNNING", 107, 0.25)


def test_snapshot_record_covers_checkpoint_and_listing_replies():
    base = _wire(_daemon_snapshot())
    assert set(base) <= set(records.Snapshot._names), "records.Snapshot lacks fields of the daemon's Snapshot"
    checkpoint = {**base, "store": {"actions": []}}
    listing = {**base, "location": "memory", "last_used": 3.0, "children": [], "in_use": None}
    for reply in (base, checkpoint, listing):
        snap = records.Snapshot.from_dict(reply)
        assert list(snap.to_dict().items()) == list(reply.items())
        assert snap.extra == {}
    assert records.Snapshot.from_dict(checkpoint).store == {"actions": []}
    assert records.Snapshot.from_dict(base).store is None and "store" not in records.Snapshot.from_dict(base)


def test_window_and_process_records_match_the_daemons_types():
    from drums_core.session.display import Window
    from drums_core.session.processes import ProcessInfo

    for daemon_value, record in ((Window(id=5, title="t", wm_class="c", mapped=True), records.Window),
                                 (ProcessInfo(pid=10, nspid=1, comm="init", ppid=9), records.Process)):
        wire = _wire(daemon_value)
        assert set(wire) == set(record._names)
        assert record.from_dict(wire).to_dict() == wire


def test_records_read_as_mappings_and_are_read_only():
    wire = _wire(_daemon_session())
    s = records.Session.from_dict(wire)
    assert s["id"] == s.id == "s1" and s.get("address") == "169.254.0.30" and s.get("nope", 1) == 1
    assert "snapshot" in s and "nope" not in s and len(s) == len(wire)
    assert list(s.keys()) == list(wire) and dict(s.items()) == wire and {**s} == wire and dict(s) == wire
    assert s == wire and s == records.Session.from_dict(wire)
    with pytest.raises(KeyError):
        s["nope"]  # noqa: B018
    with pytest.raises(TypeError):
        s["id"] = "other"  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.id = "other"  # type: ignore[misc]
    assert s.to_dict() == wire  # nothing changed
    assert pickle.loads(pickle.dumps(s)) == s and copy.deepcopy(s) == s


def test_records_keep_keys_a_newer_daemon_adds_and_omit_what_an_older_one_lacked():
    reply = {"id": "x", "state": "RUNNING", "future_field": {"a": [1]}, "address": "169.254.0.2"}
    s = records.Session.from_dict(reply)
    assert s.extra == {"future_field": {"a": [1]}} and s["future_field"] == {"a": [1]}
    assert list(s.to_dict().items()) == list(reply.items())  # same keys, same order: absent fields stay absent
    assert s.snapshot is None and "snapshot" not in s and s.layers == []


def test_records_in_json_documents():
    s = records.Session.from_dict({"id": "x", "state": "RUNNING"})
    e = records.ExecResult.from_dict({"returncode": 3, "stdout": "o", "stderr": "e"})
    doc = {"sessions": [s], "exec": e, "other": Path("/p")}
    assert json.loads(json.dumps(doc, default=records.json_default)) == {
        "sessions": [{"id": "x", "state": "RUNNING"}], "exec": {"returncode": 3, "stdout": "o", "stderr": "e"},
        "other": "/p"}
    assert records.plain(doc)["sessions"] == [{"id": "x", "state": "RUNNING"}]
    assert not e.ok and e.returncode == 3


@pytest.mark.parametrize("bad", [None, [1, 2], "id", {"slot": 1}, {1: "x"}])
def test_records_refuse_what_is_not_a_reply(bad):
    with pytest.raises(TypeError, match="Session.from_dict"):
        records.Session.from_dict(bad)


def test_readme_from_python_examples_compile_and_use_the_public_api():
    text = (REPO / "README.md").read_text()
    section = text.split("### From Python", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 3, "the From Python section shows a Client, a gymnasium and an OSWorld example"
    for block in blocks:
        compile(block, "README.md", "exec")
        assert len(block.strip().splitlines()) <= 12
        for module, names in re.findall(r"^from (drums_core|drums_osworld) import (.+)$", block, re.M):
            pkg = {"drums_core": drums_core, "drums_osworld": drums_osworld}[module]
            assert {n.strip() for n in names.split(",")} <= set(pkg.__all__)
        for name in re.findall(r"\bdrums_osworld\.(\w+)\(", block):
            assert name in drums_osworld.__all__
    assert "gymnasium.make(" in blocks[1] and 'provider_name="drums"' in blocks[2]
