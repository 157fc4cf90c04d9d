"""Saved states and branches of a ``drums/Desktop-v0`` env (a mixin of :class:`.env.DrumsDesktopEnv`).

``save_state(name)`` checkpoints the desktop mid-episode (it goes on running) and ``branch(name, n)``
restores ``n`` siblings of it as new envs. With ``record_steps=True`` the env records a trajectory:
a checkpoint after ``reset`` (step 0) and after every step that does not end the episode, so that
``branch(step=k, n=N)`` restores ``N`` siblings of the desktop as it was after step ``k`` (tree search,
step-level credit assignment, counterfactual evaluation). The trajectory's checkpoints are the env
family's states: pinned in the snapshot store (never evicted) while the episode lasts; the next
``reset`` deletes those no sibling stands on, and the family's last ``close()`` deletes the rest.
"""
from __future__ import annotations

import copy
import time
from typing import TYPE_CHECKING, Any

from drums_core.config import check_name
from drums_core.errors import DrumsError, NotFound
from gymnasium.error import ResetNeeded

from . import desktops
from .states import SavedState

if TYPE_CHECKING:
    from typing import Self  # the env class this mixes into (DrumsDesktopEnv), without importing it


class Branching:
    """``save_state``, ``branch``, ``branch_from`` and the recorded trajectory of one env."""

    # set by DrumsDesktopEnv.__init__
    record_steps: bool
    _trajectory: dict[int, SavedState]

    @property
    def trajectory_steps(self) -> list[int]:
        """The steps of this episode recorded so far (``record_steps=True``), for ``branch(step=k)``."""
        return sorted(self._trajectory)

    def _record(self, step: int) -> dict[str, Any] | None:
        """Checkpoint the desktop as step ``step`` of the trajectory (``record_steps``); the desktop
        goes on running. Returns ``{"snapshot", "seconds"}`` for the step's info, or None."""
        if not self.record_steps:
            return None
        if step == 0 and self._origin is not None and self._origin.step == 0 and not self._history:
            state = self._origin  # the post-setup state this episode starts from: the same desktop
        else:
            state = self._save(None)
        self._trajectory[step] = state
        return {"snapshot": state.snapshot, "seconds": state.seconds}

    def _end_trajectory(self) -> None:
        """A new episode: the last one's step checkpoints go, unless a state or a sibling still needs
        them (the store refuses to delete a snapshot a session or another snapshot stands on; those
        go with the family)."""
        old, self._trajectory = self._trajectory, {}
        family = self._family
        if family is None:
            return
        keep = {id(s) for s in family.post_setup.values()} | {id(s) for s in family.by_name.values()}
        for state in sorted(old.values(), key=lambda s: -s.step):
            if id(state) in keep or not state.owned:
                continue
            try:
                self.client.delete_snapshot(state.snapshot)
            except NotFound:
                pass
            except DrumsError:
                continue  # stood on: the family's close deletes it
            family.forget(state)

    def save_state(self, name: str, *, keep: bool = False) -> dict[str, Any]:
        """Checkpoint the desktop as ``name`` (it keeps running) for :meth:`branch`.

        With ``keep=True`` the snapshot outlives this env (and its branches): restore it from
        anywhere by name (``drums rollouts --from-state NAME``, :meth:`branch_from`) and delete
        it with ``drums delete-snapshot``. Returns ``{"name", "snapshot", "step", "seconds"}``.
        """
        self._check_open()
        check_name(name, "state name")
        if self._desktop is None:
            raise ResetNeeded("call reset() before save_state()")
        state = self._save(name, keep=keep)
        return {"name": name, "snapshot": state.snapshot, "step": state.step, "seconds": state.seconds}

    def branch(self, name: str | None = None, n: int = 1, *, step: int | None = None,
               wait_live: bool = False) -> list[Self]:
        """``n`` new envs on sibling desktops restored at once from state ``name``, or from ``step``
        of this episode's recorded trajectory (``record_steps=True``), mid-episode.

        ``name`` is a state saved in this env's family (it and its branches), or else any snapshot
        name or id (then the episode restarts its step count at 0 with this env's task). ``step=k``
        is the desktop as it was after the episode's ``k``-th step (0: after ``reset``); the new
        envs' episodes go on from step ``k`` with the history up to it. The new envs are
        independent: each owns its desktop, and ``close()`` each of them. With ``wait_live`` the
        restore also waits for the daemon's liveness verdict. Give exactly one of ``name`` and
        ``step``; a step that was not recorded raises ``ValueError`` naming those that were.
        """
        self._check_open()
        if (name is None) == (step is None):
            raise ValueError("give exactly one of name= and step=")
        family = self._ensure_family()
        if step is not None:
            state = self._trajectory.get(step) if isinstance(step, int) and not isinstance(step, bool) else None
            if state is None:
                recorded = sorted(self._trajectory)
                raise ValueError(f"step {step!r} is not recorded in this episode (recorded: {recorded or 'none'}; "
                                 "record_steps=True records every step)")
            return self._branch(state, n, wait_live=wait_live)
        state = family.by_name.get(name)
        if state is None:
            if self._task is None:
                raise ValueError(f"no state {name!r} in this env's family and no task to restore it with")
            state = SavedState(snapshot=name, name=name, task=self._task, step=0, history=[], cache=None,
                               parent=None, owned=False)
        return self._branch(state, n, wait_live=wait_live)

    @classmethod
    def branch_from(cls, state: str, n: int, *, task: Any, wait_live: bool = False,
                    **kwargs: Any) -> list[Self]:
        """``n`` envs restored from a snapshot saved elsewhere (name or id), running ``task``.

        ``kwargs`` are the constructor's. The snapshot is not this process's: it is never deleted
        here. Each env restarts its step count at 0.
        """
        base = cls(task=task, **kwargs)
        try:
            return base.branch(state, n, wait_live=wait_live)
        finally:
            base.close()

    def _save(self, name: str | None, keep: bool = False) -> SavedState:
        assert self._desktop is not None and self._task is not None
        family = self._ensure_family()
        state = family.save(self._desktop, name, task=self._task, step=self._step_no, history=self._history,
                            cache=self._task_cache(), parent=self._origin, keep=keep,
                            episode_over=self._episode_over)
        self._origin = state
        return state

    def _branch(self, state: SavedState, n: int, wait_live: bool = False) -> list[Self]:
        if not isinstance(n, int) or n < 1:
            raise ValueError("n must be a positive number of branches")
        family = self._ensure_family()
        t = time.monotonic()
        restored = desktops.restore(self.client, state.snapshot, n, wait_live)
        seconds = time.monotonic() - t
        envs: list[Self] = []
        try:
            for desktop in restored:
                kwargs = dict(self._ezpickle_kwargs)
                kwargs.update(task=state.task, client=self.client, screen_size=desktop.screen)
                env = type(self)(**kwargs)
                env.spec = self.spec
                env._family = family
                env._workdir = family.join()
                env._task = state.task
                env._adopt(desktop, state)
                env._step_no = state.step
                env._history = copy.deepcopy(state.history)
                env._episode_over = state.episode_over
                env._dirty = True
                env.restore_info = {"state": state.name, "snapshot": state.snapshot, "siblings": n,
                                    "seconds": seconds, "session_timings": dict(desktop.session.get("timings", {}))}
                envs.append(env)
        except BaseException:
            for env in envs:
                env.close()
            for desktop in restored[len(envs):]:
                desktops.destroy_quietly(self.client, desktop.id)
            raise
        return envs

