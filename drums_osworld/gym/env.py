"""The gymnasium environment ``drums/Desktop-v0``: one OSWorld task on one Drums desktop.

    import gymnasium
    env = gymnasium.make("drums_osworld:drums/Desktop-v0", task="tasks/os/e0df059f-....json")
    obs, info = env.reset(seed=0)              # a desktop, with the task's setup run on it
    obs, reward, terminated, truncated, info = env.step("pyautogui.click(960, 540)")
    obs, reward, terminated, truncated, info = env.step("DONE")   # reward = the evaluator's score
    env.close()                                # the desktop (and every state saved) is gone

It mirrors OSWorld 1.0.2's ``DesktopEnv`` (``reset``/``step``/``evaluate``, shared notes
osworld-api.md sections 1.4-1.7) under gymnasium's contract, without OSWorld installed: setup
steps, getters and metrics are Drums' own (:mod:`drums_osworld.evaluation`).

Spaces (:mod:`.spaces`): the observation is a dict of ``screenshot`` (an (H, W, 3) uint8 array),
``instruction`` and, with ``require_a11y_tree=True``, ``accessibility_tree`` (the text spaces are
:class:`UnicodeText`); the action is pyautogui code as OSWorld's ``pyautogui`` action space sends it,
or ``"WAIT"``, ``"DONE"``, ``"FAIL"`` (a dict ``{"action_type": ...}`` or ``{"command": code}`` is
accepted as OSWorld accepts it).

Episodes: ``reset()`` gives a desktop with the task's setup done. With ``reuse="none"`` (OSWorld's
behaviour) every reset after the desktop was used boots a fresh desktop and runs the setup again;
with ``reuse="post_setup"`` the first reset checkpoints the desktop after the setup and later
resets of the same task restore that checkpoint instead (when the snapshot store is full and nothing
can be evicted or spilled, the episode goes on unsaved: ``info["post_setup_unsaved"] == "STORE_FULL"``).
``DONE`` and ``FAIL`` terminate;
``max_steps`` (default 15, OSWorld's ``run.py``) truncates. The reward is 0 until the episode
ends, then the task's evaluator score (``info["score"]``); :meth:`DrumsDesktopEnv.evaluate` scores
the current state at any time. ``step()`` after the end raises ``gymnasium.error.ResetNeeded``.
(Use ``max_steps`` rather than gymnasium's ``max_episode_steps``: the ``TimeLimit`` wrapper that
the latter adds truncates without scoring.)

Branching: ``env.unwrapped.save_state(name)`` checkpoints the desktop mid-episode (it goes on
running); ``env.unwrapped.branch(name, n)`` restores ``n`` sibling desktops of that state at once
and returns ``n`` new, independent :class:`DrumsDesktopEnv` whose episodes continue from the saved
step (no ``reset()`` needed; they are not wrapped). :meth:`DrumsDesktopEnv.branch_from` does the
same from a state saved elsewhere (any snapshot name or id, e.g. one saved by another process with
``keep=True``). With ``record_steps=True`` every step is checkpointed as it happens and
``env.unwrapped.branch(step=k, n=N)`` restores ``N`` siblings of the desktop as it was after step
``k`` (:mod:`.branching`).

Ownership (:mod:`.states`): an env owns its desktop; an env and the envs branched from it (transitively) share the
states they saved, and the last of them to close deletes those snapshots (except ``keep=True``
ones and what they depend on). ``close()`` is idempotent. Each env scores into a private cache
directory (seeded from the shared task cache, ``cache_dir``), so siblings and vector sub-envs never
overwrite each other's files.

Vector envs: ``gymnasium.make_vec("drums_osworld:drums/Desktop-v0", num_envs=4,
vectorization_mode="async", task=...)`` runs one desktop per sub-env. An env pickles as its
constructor arguments (gymnasium's ``EzPickle``): unpickling gives a fresh env with no desktop,
never a second owner of the same one.
"""
from __future__ import annotations

import copy
import logging
import os
import shutil
import time
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gymnasium
import numpy as np
from gymnasium.error import ResetNeeded
from gymnasium.utils import EzPickle

from drums_core.config import SESSION_PASSWORD, Instance, check_name
from drums_core.errors import NotFound, Unavailable
from drums_core.reasons import Reason

from .. import actions
from ..actions import fix_pyautogui_less_than
from . import desktops, task_setup
from .spaces import A11Y_MAX, INSTRUCTION_MAX, UnicodeText, action_space, observation_space, screenshot_array
from .branching import Branching
from .states import Family, SavedState, copy_dir, task_key

# drums_core.client, drums_osworld.desktop/.evaluation/.tasks and Pillow are imported where they are
# used: ``import drums_osworld`` imports this module, and so does every guest server's start-up.
if TYPE_CHECKING:
    from drums_core.client import Client

    from ..desktop import Desktop
    from ..setup_journal import SetupReport
    from ..tasks import Task

log = logging.getLogger("drums.osworld.gym")

__all__ = [
    "ENV_ID",
    "DrumsDesktopEnv",
    "UnicodeText",
    "fix_pyautogui_less_than",
    "register_envs",
]

ENV_ID = "drums/Desktop-v0"
ENTRY_POINT = "drums_osworld.gym.env:DrumsDesktopEnv"

REUSE_MODES = ("none", "post_setup")


def register_envs() -> None:
    """Register ``drums/Desktop-v0`` with gymnasium (idempotent; ``import drums_osworld`` calls it)."""
    if ENV_ID in gymnasium.registry:
        return
    gymnasium.register(id=ENV_ID, entry_point=ENTRY_POINT, nondeterministic=True)


# --------------------------------------------------------------------------- the env
class DrumsDesktopEnv(Branching, gymnasium.Env, EzPickle):
    """One OSWorld task on one Drums desktop; see the module docstring.

    Args:
        task: the task: a path to an OSWorld task JSON file, a dict, or a
            :class:`~drums_osworld.tasks.Task`. May be omitted when every ``reset`` passes
            ``options={"task": ...}``.
        reuse: ``"none"`` (boot and set up on every reset, as OSWorld) or ``"post_setup"``
            (checkpoint after the first setup of a task, restore it on later resets).
        screen_size: ``(width, height)`` of the desktop and of the screenshot observation.
        require_a11y_tree: add the accessibility tree (XML) to the observation.
        max_steps: truncate the episode after this many steps (``None``: never).
        pause: seconds to wait after each action before observing (``DesktopEnv.step``'s ``pause``).
        client: the :class:`~drums_core.client.Client` of the daemon to use (default: the
            instance named by ``instance``, or ``$DRUMS_INSTANCE``; started when not running).
        instance: a Drums instance name, used when ``client`` is not given.
        cache_dir: the shared task cache base (``<cache_dir>/<task id>`` holds the files that
            ``download`` steps read); each env works on a private copy of it.
        a11y_max_length: longest accessibility tree kept (characters).
        render_mode: ``None`` or ``"rgb_array"`` (``render()`` grabs the screen as an array).
        strict_setup: a failed setup step raises :class:`~drums_osworld.setup_journal.SetupFailed`
            from ``reset`` (default: ``$DRUMS_STRICT_SETUP``). Otherwise ``reset`` returns and
            ``info["setup"]`` says what failed: the attempt is invalid, and it is never scored
            (``evaluate`` raises ``SetupFailed``; the last step's ``info["score"]`` is None and
            ``info["invalid"]`` names the step and the error).
        network: the desktop's network policy (:mod:`drums_core.session.netpolicy`): ``"none"`` (no route
            out), ``"nat:<upstream>[:<dns>,...]"`` or a dict like ``{"policy": "nat", "upstream":
            "eth1", "dns": [...]}``. Default: ``$DRUMS_NETWORK``, else ``none``. Bad input raises
            :class:`~drums_core.errors.InvalidArgument` (``BAD_NETWORK``) here.
        record_steps: checkpoint the desktop after ``reset`` and after every step that does not end
            the episode (it goes on running; ``info["checkpoint"]`` says which snapshot and how long
            it took), so that ``branch(step=k, n=N)`` restores ``N`` siblings of step ``k``
            (:mod:`.branching`).
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 1}

    def __init__(self, task: str | os.PathLike[str] | Mapping[str, Any] | Task | None = None, *,
                 reuse: str = "none", screen_size: tuple[int, int] = (1920, 1080),
                 require_a11y_tree: bool = False, max_steps: int | None = 15, pause: float = 2.0,
                 client: Client | None = None, instance: str | None = None,
                 cache_dir: str | os.PathLike[str] | None = None, a11y_max_length: int = A11Y_MAX,
                 render_mode: str | None = None, strict_setup: bool | None = None,
                 network: str | Mapping[str, Any] | None = None, record_steps: bool = False) -> None:
        EzPickle.__init__(self, task=task, reuse=reuse, screen_size=screen_size,
                          require_a11y_tree=require_a11y_tree, max_steps=max_steps, pause=pause,
                          client=client, instance=instance, cache_dir=cache_dir,
                          a11y_max_length=a11y_max_length, render_mode=render_mode, strict_setup=strict_setup,
                          network=network, record_steps=record_steps)
        from ..provider.images import network_key

        self.network = network_key(dict(network) if isinstance(network, Mapping) else network)
        if reuse not in REUSE_MODES:
            raise ValueError(f"reuse must be one of {', '.join(REUSE_MODES)}, not {reuse!r}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be None or 'rgb_array', not {render_mode!r}")
        width, height = (int(v) for v in screen_size)
        if not (320 <= width <= 7680 and 240 <= height <= 4320):
            raise ValueError(f"screen_size {screen_size!r} is out of range (320x240 .. 7680x4320)")
        if max_steps is not None and int(max_steps) < 1:
            raise ValueError("max_steps must be a positive number of steps or None")
        if pause < 0:
            raise ValueError("pause must not be negative")
        self.reuse = reuse
        self.screen_size = (width, height)
        self.require_a11y_tree = bool(require_a11y_tree)
        self.max_steps = None if max_steps is None else int(max_steps)
        self.pause = float(pause)
        self.render_mode = render_mode
        self.a11y_max_length = int(a11y_max_length)
        if client is None:
            from drums_core.client import Client
            from drums_core.config import instance_from_env

            client = Client(Instance(name=check_name(instance, "instance")) if instance else instance_from_env())
        self.client = client
        from ..evaluation import DEFAULT_CACHE_DIR

        self.cache_dir = Path(cache_dir) if cache_dir is not None else DEFAULT_CACHE_DIR

        self.observation_space = observation_space(self.screen_size,
                                                   self.a11y_max_length if self.require_a11y_tree else None)
        self.action_space = action_space()

        self._task: Task | None = self._load_task(task) if task is not None else None
        self._desktop: Desktop | None = None
        self._desktop_finalizer: weakref.finalize | None = None
        self._origin: SavedState | None = None     # the state the current desktop stands on
        self._family: Family | None = None    # created on first use (branches share their parent's)
        self._workdir: Path | None = None
        self._step_no = 0
        self._history: list[Any] = []
        self.record_steps = bool(record_steps)
        self._trajectory: dict[int, SavedState] = {}
        self._episode_over = False
        self._dirty = False
        self._last_png: bytes | None = None
        self._last_score: float | None = None
        self._closed = False
        self.restore_info: dict[str, Any] | None = None
        from ..setup_journal import strict_default

        self.strict_setup = strict_default() if strict_setup is None else bool(strict_setup)
        self._setup_report: SetupReport | None = None

    # ------------------------------------------------------------------ properties
    @property
    def task(self) -> Task | None:
        """The current task."""
        return self._task

    @property
    def desktop(self) -> Desktop | None:
        """The live desktop (``None`` before the first reset and after close)."""
        return self._desktop

    @property
    def session_id(self) -> str | None:
        """The Drums session id of the current desktop (None before ``reset()`` and after ``close()``)."""
        return self._desktop.id if self._desktop is not None else None

    @property
    def step_count(self) -> int:
        """Steps taken in the current episode."""
        return self._step_no

    @property
    def action_history(self) -> list[Any]:
        """The actions of the current episode so far (a copy)."""
        return list(self._history)

    @property
    def last_screenshot_png(self) -> bytes | None:
        """The PNG bytes behind the last observation's screenshot."""
        return self._last_png

    @property
    def saved_states(self) -> list[str]:
        """Names of the states saved in this env's family (it and its branches)."""
        return sorted(self._family.by_name) if self._family is not None else []

    # ------------------------------------------------------------------ gymnasium API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Start an episode: a desktop with the task's setup done. ``options={"task": ...}`` switches task."""
        super().reset(seed=seed)
        self._check_open()
        task = self._task_for_reset(options)
        family = self._ensure_family()
        self._episode_over = True  # until this reset succeeds
        self._setup_report = None
        timings: dict[str, float] = {}
        unsaved: str | None = None
        t0 = time.monotonic()
        state = family.post_setup.get(task_key(task)) if self.reuse == "post_setup" else None
        if state is not None:
            self._reset_from(state, task, timings)
            source = "post_setup_restore"
        else:
            unsaved = self._reset_by_setup(task, timings)
            source = "setup"
        self._end_trajectory()  # the last episode's desktop is gone: nothing of ours stands on its steps
        self._step_no = 0
        self._history = []
        self._episode_over = False
        self._last_score = None
        obs = self.observe()
        checkpoint = self._record(0)
        timings["total"] = time.monotonic() - t0
        info = {"task_id": task.id, "session": self._desktop.id, "source": source, "seconds": timings}
        if checkpoint is not None:
            info["checkpoint"] = checkpoint
        if unsaved is not None:
            info["post_setup_unsaved"] = unsaved
        report = self.setup_report
        if report is not None:
            info["setup"] = report.to_json()
            if not report.ok:
                info["invalid"] = report.describe()
        return obs, info

    def _task_for_reset(self, options: dict[str, Any] | None) -> Task:
        """The task of the episode ``reset(options=...)`` starts (``options`` may switch it)."""
        options = dict(options or {})
        unknown = sorted(set(options) - {"task"})
        if unknown:
            raise ValueError(f"unknown reset options {unknown} (known: task)")
        if "task" in options:
            self._task = self._load_task(options["task"])
        if self._task is None:
            raise ValueError("no task: pass task= to the constructor or options={'task': ...} to reset()")
        return self._task

    def _reset_from(self, state: SavedState, task: Task, timings: dict[str, float]) -> None:
        """Reset onto a desktop restored from ``task``'s post-setup ``state``."""
        self._drop_desktop()
        t = time.monotonic()
        desktop = desktops.restore(self.client, state.snapshot, 1)[0]
        timings["restore"] = time.monotonic() - t
        self._adopt(desktop, state)
        self._dirty = bool(task.config)
        self._setup_report = task_setup.read_report(self._desktop, task) if task.config else None

    def _reset_by_setup(self, task: Task, timings: dict[str, float]) -> str | None:
        """Reset onto a clean desktop (a new one unless the current one is unused) with ``task``'s setup
        run on it, then saved as its post-setup state when reusing; returns why that was not saved."""
        if self._desktop is None or self._dirty:
            self._drop_desktop()
            t = time.monotonic()
            desktop = desktops.boot(self.client, self.screen_size, self.network)
            timings["boot"] = time.monotonic() - t
            self._adopt(desktop, None)
            self._dirty = False
        copy_dir(self.cache_dir / task.id, self._task_cache())
        if task.config:
            self._dirty = True  # also when the setup fails half way
        t = time.monotonic()
        self._setup_report = task_setup.run(self._desktop, task, task_cache=self._task_cache(),
                                            screen_size=self.screen_size, strict=self.strict_setup)
        timings["setup"] = time.monotonic() - t
        if self.reuse != "post_setup" or not self._setup_report.ok:  # a failed setup is never reused
            return None
        t = time.monotonic()
        try:
            state = self._save(None)
        except Unavailable as exc:  # rolled back, the desktop runs on: this episode goes on unsaved
            if exc.reason != Reason.STORE_FULL:
                raise
            log.warning("the snapshot store is full: the post-setup state of %s is not saved, later "
                        "resets of the task run its setup again (%s)", task.id, exc.message)
            return exc.reason
        self._ensure_family().post_setup[task_key(task)] = state
        timings["checkpoint"] = time.monotonic() - t
        return None

    def step(self, action: Any) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        """Run one action (pyautogui code, ``WAIT``, ``DONE`` or ``FAIL``) as ``DesktopEnv.step`` does.

        An action OSWorld would not run raises :class:`~drums_osworld.actions.InvalidAction` (a
        ``ValueError``) and changes nothing.
        """
        self._check_open()
        if self._desktop is None:
            raise ResetNeeded("call reset() before step()")
        if self._episode_over:
            raise ResetNeeded("the episode has ended (terminated or truncated): call reset()")
        parsed = actions.parse(action)
        kind = parsed.kind
        self._step_no += 1
        self._history.append(copy.deepcopy(action))
        self._dirty = True
        info: dict[str, Any] = {"step": self._step_no, "action_type": kind}
        seconds: dict[str, float] = {}
        t = time.monotonic()
        result = actions.run(self._desktop.guest, parsed, self.pause)
        if kind == "DONE":
            info["done"] = True
        elif kind == "FAIL":
            info["fail"] = True
        elif result is not None:
            info["exec"] = result
        seconds["action"] = time.monotonic() - t
        terminated = parsed.terminal
        truncated = not terminated and self.max_steps is not None and self._step_no >= self.max_steps
        t = time.monotonic()
        obs = self.observe()
        seconds["observe"] = time.monotonic() - t
        reward = 0.0
        if not (terminated or truncated):
            checkpoint = self._record(self._step_no)
            if checkpoint is not None:
                info["checkpoint"] = checkpoint
                seconds["checkpoint"] = checkpoint["seconds"]
        if terminated or truncated:
            self._episode_over = True
            report = self.setup_report
            if report is not None and not report.ok:  # an invalid attempt: no score, not a 0
                info["score"] = None
                info["invalid"] = report.describe()
                info["setup"] = report.to_json()
            else:
                t = time.monotonic()
                reward = self.evaluate()
                seconds["evaluate"] = time.monotonic() - t
                info["score"] = reward
        info["seconds"] = seconds
        return obs, reward, terminated, truncated, info

    def render(self) -> np.ndarray | None:
        """With ``render_mode="rgb_array"``: the screen now, as an (H, W, 3) uint8 array."""
        if self.render_mode != "rgb_array":
            return None
        self._check_open()
        if self._desktop is None:
            raise ResetNeeded("call reset() before render()")
        return screenshot_array(self._desktop.guest.screenshot(), self.screen_size)

    def close(self) -> None:
        """Destroy the desktop; the family's last env also deletes its saved states. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._drop_desktop()
            self._end_trajectory()
        finally:
            if self._workdir is not None:
                shutil.rmtree(self._workdir, ignore_errors=True)
            if self._family is not None:
                self._family.leave()
            super().close()

    # ------------------------------------------------------------------ OSWorld-style extras
    def observe(self) -> dict[str, Any]:
        """The observation of the desktop now (what ``reset``/``step`` return), without acting."""
        self._check_open()
        if self._desktop is None or self._task is None:
            raise ResetNeeded("call reset() first")
        guest = self._desktop.guest
        png = guest.screenshot()
        self._last_png = png
        obs: dict[str, Any] = {"screenshot": screenshot_array(png, self.screen_size),
                               "instruction": self._task.instruction}
        if self.require_a11y_tree:
            from ..guest.a11y_guard import EMPTY, contain

            # the desktop's XML, contained: agents eval its coordinates; cut at an element, it still parses
            tree = contain(guest.accessibility() or EMPTY, self.a11y_max_length).xml
            obs["accessibility_tree"] = tree
        return obs

    def evaluate(self) -> float:
        """The task's score for the desktop now (``DesktopEnv.evaluate``: postconfig, then the metric)."""
        self._check_open()
        if self._desktop is None or self._task is None:
            raise ResetNeeded("call reset() first")
        from ..evaluation import evaluate
        from ..setup_journal import SetupFailed

        report = self.setup_report
        if report is not None and not report.ok:
            raise SetupFailed(report, self._task.id)
        if self._task.evaluator.get("postconfig"):
            task_setup.begin_postconfig(self._desktop)
        last = self._history[-1] if self._history else None
        score = float(evaluate(self._task, self._desktop.guest, last, cache_dir=self._cache_base(),
                               client_password=SESSION_PASSWORD, screen_size=self.screen_size))
        if self._task.evaluator.get("postconfig"):
            self._dirty = True
        self._last_score = score
        return score

    # ------------------------------------------------------------------ internals
    def _check_open(self) -> None:
        if self._closed:
            raise gymnasium.error.ClosedEnvironmentError("this DrumsDesktopEnv is closed")

    def _load_task(self, source: Any) -> Task:
        from ..tasks import load_task

        task = load_task(source, require_drums_support=True)
        if len(task.instruction) > INSTRUCTION_MAX:
            raise ValueError(f"task {task.id}: the instruction has {len(task.instruction)} characters; "
                             f"the observation space holds {INSTRUCTION_MAX}")
        return task

    def _ensure_family(self) -> Family:
        if self._family is None:
            self._family = Family.create(self.client)
        if self._workdir is None:
            self._workdir = self._family.join()
        return self._family

    def _cache_base(self) -> Path:
        assert self._workdir is not None
        return self._workdir / "cache"

    def _task_cache(self) -> Path:
        assert self._task is not None
        return self._cache_base() / self._task.id

    @property
    def setup_report(self) -> SetupReport | None:
        """How the current desktop's task setup went (None: the task has no setup, or no desktop).
        A desktop restored from a saved state (a branch) reports the setup that state was made with."""
        if self._setup_report is None and self._desktop is not None and self._task is not None \
                and self._task.config:
            self._setup_report = task_setup.read_report(self._desktop, self._task)
        return self._setup_report

    def _adopt(self, desktop: Desktop, origin: SavedState | None) -> None:
        self._desktop = desktop
        self._origin = origin
        self._desktop_finalizer = weakref.finalize(self, desktops.destroy_quietly, self.client, desktop.id)
        if origin is not None:
            copy_dir(origin.cache if origin.cache is not None else self.cache_dir / origin.task.id,
                      self._task_cache())

    def _drop_desktop(self) -> None:
        desktop, self._desktop = self._desktop, None
        self._origin = None
        if self._desktop_finalizer is not None:
            self._desktop_finalizer.detach()
            self._desktop_finalizer = None
        if desktop is not None:
            try:
                desktop.close()
            except NotFound:
                pass

    def __repr__(self) -> str:
        task = self._task.id if self._task is not None else None
        return f"<DrumsDesktopEnv task={task} session={self.session_id} step={self._step_no}>"
