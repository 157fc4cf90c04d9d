"""Typed records of what the daemon answers: :class:`Session`, :class:`Snapshot`, :class:`ExecResult`,
:class:`Window` and :class:`Process`.

Each record is a frozen dataclass built from the daemon's JSON reply (:meth:`Record.from_dict`) that
gives that JSON back unchanged (:meth:`Record.to_dict`: the same keys, in the same order, with the
same values). Keys the record does not know (a newer daemon's) are kept in ``extra`` and come back
in ``to_dict()``; fields the reply did not carry (an older daemon's) read as their default and stay
out of ``to_dict()``.

A record is also a read-only mapping of its JSON, so code written against the plain dicts of
earlier versions runs unchanged::

    s = client.create()
    s.id == s["id"]; s.get("address"); "snapshot" in s; dict(s) == s.to_dict()

``json.dumps`` does not know records: use ``json.dumps(r.to_dict())``, or
``json.dumps(data, default=json_default)`` for a document that holds records anywhere.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

__all__ = ["Record", "Session", "Snapshot", "ExecResult", "Window", "Process", "json_default", "plain"]

R = TypeVar("R", bound="Record")

_HIDDEN = ("extra", "_keys")


class Record(Mapping):
    """Base of the records: a frozen dataclass that is also a read-only mapping of its JSON.

    Subclasses declare the daemon's keys as dataclass fields (plus ``extra`` and ``_keys``)."""

    __slots__ = ()
    # the daemon's keys the record declares as fields, in declaration order (set for each subclass)
    _names: ClassVar[tuple[str, ...]] = ()
    _known_names: ClassVar[frozenset[str]] = frozenset()
    # every record also declares these two: keys it does not know, and the reply's key order
    extra: dict[str, Any]
    _keys: tuple[str, ...]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        names = tuple(k for k in cls.__dict__.get("__annotations__", {}) if k not in _HIDDEN)
        cls._names = names
        cls._known_names = frozenset(names)

    # ------------------------------------------------------------------ JSON
    @classmethod
    def from_dict(cls: type[R], data: Mapping[str, Any]) -> R:
        """Build the record from the daemon's JSON object.

        Raises ``TypeError`` when ``data`` is not a mapping with string keys, or lacks a required
        key (``id`` for sessions and snapshots)."""
        if isinstance(data, Record):
            data = data.to_dict()
        if not isinstance(data, Mapping) or not all(isinstance(k, str) for k in data):
            raise TypeError(f"{cls.__name__}.from_dict needs a JSON object, got {type(data).__name__}")
        known = cls._known()
        kwargs = {k: v for k, v in data.items() if k in known}
        extra = {k: v for k, v in data.items() if k not in known}
        try:
            return cls(**kwargs, extra=extra, _keys=tuple(data))
        except TypeError as exc:
            raise TypeError(f"{cls.__name__}.from_dict: {exc}") from None

    @classmethod
    def _known(cls) -> frozenset[str]:
        return cls._known_names

    def to_dict(self) -> dict[str, Any]:
        """The record as the daemon sent it (a new dict; nested values are shared, not copied)."""
        return {k: self[k] for k in self}

    # --------------------------------------------------------------- mapping
    def __getitem__(self, key: str) -> Any:
        if key in self.extra:
            return self.extra[key]
        if key in self._present():
            return getattr(self, key)
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._present_order())

    def __len__(self) -> int:
        return len(self._present_order())

    def __contains__(self, key: object) -> bool:
        return key in self.extra or key in self._present()

    def _present(self) -> frozenset[str]:
        known = self._known()
        if self._keys:
            return frozenset(k for k in self._keys if k in known)
        return known

    def _present_order(self) -> tuple[str, ...]:
        if self._keys:
            return self._keys
        return self._names + tuple(k for k in self.extra if k not in self._known_names)

    # Mapping's __eq__ compares items: a record equals the dict of its JSON, and another record of it.
    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True, eq=False)
class Session(Record):
    """A desktop session, as ``Client.create``, ``restore``, ``get``, ``wait_live`` and ``list`` return it.

    ``state`` is one of ``STARTING``, ``RUNNING``, ``CHECKPOINTING``, ``RESTORING``, ``STOPPING``,
    ``BROKEN``; ``broken`` names why when it is ``BROKEN``. ``liveness`` is ``unchecked`` until the
    post-restore check has run, then ``ok`` or ``failed``. ``address`` is the guest's IPv4 address
    (reachable from the host only), ``display`` the X display number inside the session, ``spec``
    the session spec it was made from (a dict), ``timings`` seconds per phase (``ready``, ...),
    ``snapshot`` the snapshot it was restored from (None for a cold boot)."""

    id: str
    slot: int | None = None
    state: str | None = None
    spec: dict[str, Any] = field(default_factory=dict)
    dir: str | None = None
    root: str | None = None
    ifname: str | None = None
    host_address: str | None = None
    address: str | None = None
    display: int | None = None
    hostname: str | None = None
    machine_id: str | None = None
    created: float | None = None
    init_pid: int = 0
    init_start: int = 0
    snapshot: str | None = None
    layers: list[str] = field(default_factory=list)
    broken: str | None = None
    liveness: str | None = None
    timings: dict[str, Any] = field(default_factory=dict)
    oom_kills: int = 0
    image_hash: str | None = None
    cgroup: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, repr=False)
    _keys: tuple[str, ...] = field(default=(), repr=False)

    @property
    def is_broken(self) -> bool:
        """True when the daemon marked the session broken (every later call on it fails)."""
        return self.state == "BROKEN"


@dataclass(frozen=True, eq=False)
class Snapshot(Record):
    """A checkpoint, as ``Client.checkpoint``, ``snapshot`` and ``snapshots`` return it.

    ``layers`` are its frozen layers, newest first; ``parent`` the snapshot it stacks on (a
    checkpoint of a restored session); ``windows`` the titles mapped when it was taken (``window_ids``
    their X window ids, which a restore's readiness waits for: a title may change once the
    application runs on); ``state``
    ``committed`` once usable (``broken`` otherwise); ``retention`` ``pinned`` or ``cache`` (the
    store may evict it when nothing uses it). ``Client.snapshots`` adds ``location`` (``memory`` or
    ``disk``), ``last_used``, ``children`` and ``in_use``; ``Client.checkpoint`` adds ``store``,
    whose ``actions`` list what was evicted or spilled to make room. Those are None when absent."""

    id: str
    name: str | None = None
    scope: str | None = None
    session: str | None = None
    image: str | None = None
    layers: list[str] = field(default_factory=list)
    parent: str | None = None
    created: float | None = None
    boot_id: str | None = None
    size: int | None = None
    params: dict[str, Any] = field(default_factory=dict)
    processes: list[list] = field(default_factory=list)
    windows: list[str] = field(default_factory=list)
    window_ids: list[int] = field(default_factory=list)
    spec: dict[str, Any] = field(default_factory=dict)
    files: dict[str, int] = field(default_factory=dict)
    dump_seconds: float | None = None
    state: str | None = None
    image_hash: str | None = None
    id_base: int | None = None
    retention: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)  # what ``size`` counts (drums_core.store.usage)
    # from Client.checkpoint
    store: dict[str, Any] | None = None
    # from Client.snapshots
    location: str | None = None
    last_used: float | None = None
    children: list[str] | None = None
    in_use: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, repr=False)
    _keys: tuple[str, ...] = field(default=(), repr=False)


@dataclass(frozen=True, eq=False)
class ExecResult(Record):
    """What ``Client.exec`` returns: the command's exit status and its whole output, as text."""

    returncode: int
    stdout: str = ""
    stderr: str = ""
    extra: dict[str, Any] = field(default_factory=dict, repr=False)
    _keys: tuple[str, ...] = field(default=(), repr=False)

    @property
    def ok(self) -> bool:
        """True when the command exited with status 0."""
        return self.returncode == 0


@dataclass(frozen=True, eq=False)
class Window(Record):
    """A top-level X window of a session, as ``Client.windows`` lists them."""

    id: int
    title: str = ""
    wm_class: str = ""
    mapped: bool = False
    extra: dict[str, Any] = field(default_factory=dict, repr=False)
    _keys: tuple[str, ...] = field(default=(), repr=False)


@dataclass(frozen=True, eq=False)
class Process(Record):
    """A process of a session, as ``Client.processes`` lists them: host ``pid``, ``nspid`` inside
    the session's pid namespace, ``comm`` and host ``ppid``."""

    pid: int
    nspid: int | None = None
    comm: str | None = None
    ppid: int | None = None
    extra: dict[str, Any] = field(default_factory=dict, repr=False)
    _keys: tuple[str, ...] = field(default=(), repr=False)


def plain(value: Any) -> Any:
    """``value`` with every record inside it (in lists, tuples and dicts) replaced by its ``to_dict()``."""
    if isinstance(value, Record):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def json_default(value: Any) -> Any:
    """A ``default=`` for :func:`json.dumps`: records become their JSON object, anything else its ``str``."""
    if isinstance(value, Record):
        return value.to_dict()
    return str(value)
