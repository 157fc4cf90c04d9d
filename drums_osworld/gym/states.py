"""The states a ``drums/Desktop-v0`` env saves (:mod:`drums_osworld.gym.env`), and who deletes them.

A :class:`Family` is an env and the envs branched from it (transitively). They share the states they
saved (:class:`SavedState`: a snapshot plus the host side of its episode), and the last of them to
close deletes those snapshots, newest first, sparing ``keep=True`` ones and the states they stand
on (:func:`release_states`). Each member works in a private directory under the family's root, and
each saved state keeps a copy of the task cache there.
"""
from __future__ import annotations

import copy
import hashlib
import json
import logging
import shutil
import tempfile
import threading
import time
import uuid
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from drums_core.errors import DrumsError, NotFound

if TYPE_CHECKING:
    from drums_core.client import Client

    from ..desktop import Desktop
    from ..tasks import Task

log = logging.getLogger("drums.osworld.gym")

__all__ = ["Family", "SavedState", "copy_dir", "release_states", "task_key"]


@dataclass(eq=False)
class SavedState:
    """A checkpointed desktop plus the host side of its episode."""

    snapshot: str
    name: str | None
    task: Task
    step: int
    history: list[Any]
    cache: Path | None          # a copy of the env's task cache dir when it was saved
    parent: SavedState | None       # the state the saved desktop was restored from (its layers)
    keep: bool = False
    owned: bool = True          # False: saved elsewhere; never deleted here
    episode_over: bool = False
    seconds: float = 0.0


@dataclass(eq=False)
class Family:
    """An env and the envs branched from it: they share saved states; the last to close deletes them."""

    client: Client
    root: Path
    states: list[SavedState] = field(default_factory=list)
    by_name: dict[str, SavedState] = field(default_factory=dict)
    post_setup: dict[str, SavedState] = field(default_factory=dict)
    members: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    serial: int = 0

    def __post_init__(self) -> None:
        self._finalizer = weakref.finalize(self, release_states, self.client, self.states, self.root)

    @classmethod
    def create(cls, client: Client) -> Family:
        return cls(client=client, root=Path(tempfile.mkdtemp(prefix="drums-gym-")))

    def join(self) -> Path:
        """A new member; returns a private directory for it."""
        with self.lock:
            self.members += 1
            self.serial += 1
            path = self.root / f"env-{self.serial}"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def leave(self) -> None:
        with self.lock:
            self.members -= 1
            last = self.members <= 0
        if last:
            self._finalizer()

    def add(self, state: SavedState) -> None:
        with self.lock:
            self.states.append(state)
            if state.name is not None:
                self.by_name[state.name] = state

    def forget(self, state: SavedState) -> None:
        """``state``'s snapshot was deleted: it is no longer the family's to delete."""
        with self.lock:
            if state in self.states:
                self.states.remove(state)
            if state.name is not None and self.by_name.get(state.name) is state:
                del self.by_name[state.name]
        if state.cache is not None:
            shutil.rmtree(state.cache, ignore_errors=True)

    def save(self, desktop: Desktop, name: str | None, *, task: Task, step: int, history: list[Any],
             cache: Path, parent: SavedState | None, keep: bool, episode_over: bool) -> SavedState:
        """Checkpoint ``desktop`` (it goes on running) as a state of this family, with a copy of the
        task cache directory ``cache`` and a copy of ``history``."""
        t = time.monotonic()
        snap = desktop.checkpoint(name=name, leave_running=True, snapshot_id=uuid.uuid4().hex)
        with self.lock:
            self.serial += 1
            saved_cache = self.root / f"state-{self.serial}"
        copy_dir(cache, saved_cache)
        state = SavedState(snapshot=snap["id"], name=name, task=task, step=step, history=copy.deepcopy(history),
                           cache=saved_cache, parent=parent, keep=keep, episode_over=episode_over,
                           seconds=time.monotonic() - t)
        self.add(state)
        return state


def release_states(client: Client, states: list[SavedState], root: Path) -> None:
    """Delete the snapshots of ``states`` newest first, sparing kept ones and what they stand on."""
    spared: set[int] = set()
    for st in states:
        if st.keep:
            node: SavedState | None = st
            while node is not None:
                spared.add(id(node))
                node = node.parent
    for st in reversed(states):
        if not st.owned or id(st) in spared:
            continue
        try:
            client.delete_snapshot(st.snapshot)
        except NotFound:
            pass
        except DrumsError as exc:
            log.warning("could not delete snapshot %s (%s): %s", st.snapshot, st.name or "post-setup", exc)
    states.clear()
    shutil.rmtree(root, ignore_errors=True)


def task_key(task: Task) -> str:
    blob = json.dumps({"id": task.id, "config": task.config}, sort_keys=True, default=str)
    return task.id + ":" + hashlib.sha256(blob.encode()).hexdigest()[:16]


def copy_dir(src: Path | None, dst: Path) -> None:
    """Make ``dst`` a copy of ``src`` (empty when ``src`` is missing). Copies, never hard links: a
    getter rewrites files in place."""
    shutil.rmtree(dst, ignore_errors=True)
    if src is not None and src.is_dir():
        shutil.copytree(src, dst, symlinks=True)
    else:
        dst.mkdir(parents=True, exist_ok=True)
