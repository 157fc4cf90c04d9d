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

Spaces:

- observation: ``Dict(screenshot=Box(0, 255, (H, W, 3), uint8), instruction=Text)`` plus
  ``accessibility_tree=Text`` with ``require_a11y_tree=True``. The text spaces are
  :class:`UnicodeText`: any Unicode string up to a length (gymnasium's ``Text`` only holds a fixed
  character set, and instructions and accessibility trees are arbitrary text).
- action: :class:`UnicodeText`, pyautogui code as OSWorld's ``pyautogui`` action space sends it,
  or ``"WAIT"``, ``"DONE"``, ``"FAIL"``. A dict ``{"action_type": ...}`` or ``{"command": code}`` is
  accepted as OSWorld accepts it.

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
``keep=True``).

Ownership: an env owns its desktop; an env and the envs branched from it (transitively) share the
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
import hashlib
import io
import json
import logging
import os
import shutil
import string
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.error import ResetNeeded
from gymnasium.utils import EzPickle
from gymnasium.vector.utils import shared_memory

from drums_core.config import SESSION_PASSWORD, Instance, check_name
from drums_core.errors import DrumsError, FailedPrecondition, NotFound, Unavailable

from .. import actions
from ..actions import fix_pyautogui_less_than

# drums_core.client, drums_osworld.desktop/.evaluation/.tasks and Pillow are imported where they are
# used: ``import drums_osworld`` imports this module, and so does every guest server's start-up.
if TYPE_CHECKING:
    from drums_core.client import Client

    from ..desktop import Desktop
    from ..setup_journal import Journal, SetupReport
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

#: Longest instruction the observation space holds (characters).
INSTRUCTION_MAX = 16_384
#: Longest action: one ``python -c`` argument must stay under Linux's 128 KiB per-argument limit.
ACTION_MAX = 32_768
#: Default longest accessibility tree (characters); a longer tree is cut at an element boundary
#: (with a logged warning), so it still parses (drums_osworld.guest.a11y_guard).
A11Y_MAX = 1_000_000

REUSE_MODES = ("none", "post_setup")


def register_envs() -> None:
    """Register ``drums/Desktop-v0`` with gymnasium (idempotent; ``import drums_osworld`` calls it)."""
    if ENV_ID in gymnasium.registry:
        return
    gymnasium.register(id=ENV_ID, entry_point=ENTRY_POINT, nondeterministic=True)


# --------------------------------------------------------------------------- spaces
class _AllCharacters:
    """Set-like: every Unicode character (what :class:`UnicodeText` holds)."""

    def __contains__(self, char: object) -> bool:
        return isinstance(char, str) and len(char) == 1

    def __len__(self) -> int:
        return 0x110000

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _AllCharacters)

    def __hash__(self) -> int:
        return hash(_AllCharacters)


class _CodePoints:
    """Sequence-like: index -> the character with that code point."""

    def __getitem__(self, index: Any) -> str:
        return chr(int(index))

    def __len__(self) -> int:
        return 0x110000


_SAMPLE_CHARSET = string.ascii_letters + string.digits + string.punctuation + " \n"


class UnicodeText(spaces.Text):
    """A :class:`gymnasium.spaces.Text` of any Unicode string of ``min_length..max_length`` characters.

    ``contains`` accepts every character; flattening (and ``AsyncVectorEnv``'s shared memory)
    stores code points. ``sample()`` draws from printable ASCII (letters, digits, punctuation,
    space, newline), and a ``mask``/``probability`` refers to that sample alphabet.
    """

    def __init__(self, max_length: int, *, min_length: int = 0, seed: int | np.random.Generator | None = None):
        super().__init__(max_length, min_length=min_length, charset=_SAMPLE_CHARSET, seed=seed)
        self._sampler = spaces.Text(max_length, min_length=min_length, charset=_SAMPLE_CHARSET)

    @property
    def character_set(self) -> Any:  # type: ignore[override]
        return _AllCharacters()

    @property
    def character_list(self) -> Any:  # type: ignore[override]
        return _CodePoints()

    def character_index(self, char: str) -> np.int32:
        return np.int32(ord(char))

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        self._sampler._np_random = self.np_random
        return self._sampler.sample(mask=mask, probability=probability)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, UnicodeText) and self.min_length == other.min_length
                and self.max_length == other.max_length)

    def __repr__(self) -> str:
        return f"UnicodeText({self.min_length}, {self.max_length})"


# AsyncVectorEnv(shared_memory=True) calls read_from_shared_memory once, at construction, and relies
# on the result being a live numpy view; gymnasium's Text reader returns strings, frozen at that
# moment (every later observation would read as the empty one). UnicodeText's batch is a live
# sequence instead: indexing decodes the row now, and a (deep) copy, which AsyncVectorEnv returns by
# default, is a tuple of the current strings. Code points travel as int32, padded with 0x110000.
_PAD = 0x110000


class _SharedTexts(Sequence):
    """The current strings of ``n`` sub-envs' :class:`UnicodeText` rows in shared memory."""

    def __init__(self, rows: np.ndarray) -> None:
        self._rows = rows

    def __len__(self) -> int:
        return self._rows.shape[0]

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return tuple(self[i] for i in range(*index.indices(len(self))))
        row = self._rows[index]
        end = np.flatnonzero(row == _PAD)
        codes = row[: end[0]] if end.size else row
        return codes.astype("<u4").tobytes().decode("utf-32-le", "surrogatepass")

    def __deepcopy__(self, memo: dict[int, Any]) -> tuple[str, ...]:
        return tuple(self)

    def __copy__(self) -> tuple[str, ...]:
        return tuple(self)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, (Sequence, _SharedTexts)) and tuple(self) == tuple(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(tuple(self))


@shared_memory.read_from_shared_memory.register(UnicodeText)
def _read_unicode_texts(space: UnicodeText, memory: Any, n: int = 1) -> _SharedTexts:
    return _SharedTexts(np.frombuffer(memory.get_obj(), dtype=np.int32).reshape((n, space.max_length)))


@shared_memory.write_to_shared_memory.register(UnicodeText)
def _write_unicode_text(space: UnicodeText, index: int, value: str, memory: Any) -> None:
    row = np.frombuffer(memory.get_obj(), dtype=np.int32)[index * space.max_length:(index + 1) * space.max_length]
    codes = np.frombuffer(value.encode("utf-32-le", "surrogatepass"), dtype="<u4")[: space.max_length]
    row[: codes.size] = codes
    row[codes.size:] = _PAD


# --------------------------------------------------------------------------- states
@dataclass(eq=False)
class _State:
    """A checkpointed desktop plus the host side of its episode."""

    snapshot: str
    name: str | None
    task: Task
    step: int
    history: list[Any]
    cache: Path | None          # a copy of the env's task cache dir when it was saved
    parent: _State | None       # the state the saved desktop was restored from (its layers)
    keep: bool = False
    owned: bool = True          # False: saved elsewhere; never deleted here
    episode_over: bool = False
    seconds: float = 0.0


@dataclass(eq=False)
class _Family:
    """An env and the envs branched from it: they share saved states; the last to close deletes them."""

    client: Client
    root: Path
    states: list[_State] = field(default_factory=list)
    by_name: dict[str, _State] = field(default_factory=dict)
    post_setup: dict[str, _State] = field(default_factory=dict)
    members: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    serial: int = 0

    def __post_init__(self) -> None:
        self._finalizer = weakref.finalize(self, _release_states, self.client, self.states, self.root)

    @classmethod
    def create(cls, client: Client) -> _Family:
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

    def add(self, state: _State) -> None:
        with self.lock:
            self.states.append(state)
            if state.name is not None:
                self.by_name[state.name] = state


def _release_states(client: Client, states: list[_State], root: Path) -> None:
    """Delete the snapshots of ``states`` newest first, sparing kept ones and what they stand on."""
    spared: set[int] = set()
    for st in states:
        if st.keep:
            node: _State | None = st
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


def _destroy_quietly(client: Client, session_id: str) -> None:
    try:
        client.destroy(session_id)
    except NotFound:
        pass
    except DrumsError as exc:
        log.warning("could not destroy session %s: %s", session_id, exc)


def _retry_unavailable(what: str, fn: Any, attempts: int = 3) -> Any:
    """Call ``fn``; an ``Unavailable`` (nothing happened) is retried, anything else is not."""
    for attempt in range(attempts):
        try:
            return fn()
        except Unavailable as exc:
            if attempt + 1 == attempts:
                raise
            log.warning("%s failed retryably (%s); retrying", what, exc)
            time.sleep(0.5 * (attempt + 1))
    raise AssertionError("unreachable")


def _task_key(task: Task) -> str:
    blob = json.dumps({"id": task.id, "config": task.config}, sort_keys=True, default=str)
    return task.id + ":" + hashlib.sha256(blob.encode()).hexdigest()[:16]


def _copy_dir(src: Path | None, dst: Path) -> None:
    """Make ``dst`` a copy of ``src`` (empty when ``src`` is missing). Copies, never hard links: a
    getter rewrites files in place."""
    shutil.rmtree(dst, ignore_errors=True)
    if src is not None and src.is_dir():
        shutil.copytree(src, dst, symlinks=True)
    else:
        dst.mkdir(parents=True, exist_ok=True)


# --------------------------------------------------------------------------- the env
class DrumsDesktopEnv(gymnasium.Env, EzPickle):
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
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 1}

    def __init__(self, task: str | os.PathLike[str] | Mapping[str, Any] | Task | None = None, *,
                 reuse: str = "none", screen_size: tuple[int, int] = (1920, 1080),
                 require_a11y_tree: bool = False, max_steps: int | None = 15, pause: float = 2.0,
                 client: Client | None = None, instance: str | None = None,
                 cache_dir: str | os.PathLike[str] | None = None, a11y_max_length: int = A11Y_MAX,
                 render_mode: str | None = None, strict_setup: bool | None = None,
                 network: str | Mapping[str, Any] | None = None) -> None:
        EzPickle.__init__(self, task=task, reuse=reuse, screen_size=screen_size,
                          require_a11y_tree=require_a11y_tree, max_steps=max_steps, pause=pause,
                          client=client, instance=instance, cache_dir=cache_dir,
                          a11y_max_length=a11y_max_length, render_mode=render_mode, strict_setup=strict_setup,
                          network=network)
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

        obs = {"screenshot": spaces.Box(0, 255, (height, width, 3), np.uint8),
               "instruction": UnicodeText(INSTRUCTION_MAX)}
        if self.require_a11y_tree:
            obs["accessibility_tree"] = UnicodeText(self.a11y_max_length)
        self.observation_space = spaces.Dict(obs)
        self.action_space = UnicodeText(ACTION_MAX, min_length=1)

        self._task: Task | None = self._load_task(task) if task is not None else None
        self._desktop: Desktop | None = None
        self._desktop_finalizer: weakref.finalize | None = None
        self._origin: _State | None = None     # the state the current desktop stands on
        self._family: _Family | None = None    # created on first use (branches share their parent's)
        self._workdir: Path | None = None
        self._step_no = 0
        self._history: list[Any] = []
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
        options = dict(options or {})
        unknown = sorted(set(options) - {"task"})
        if unknown:
            raise ValueError(f"unknown reset options {unknown} (known: task)")
        if "task" in options:
            self._task = self._load_task(options["task"])
        if self._task is None:
            raise ValueError("no task: pass task= to the constructor or options={'task': ...} to reset()")
        task = self._task
        family = self._ensure_family()
        self._episode_over = True  # until this reset succeeds
        self._setup_report = None
        timings: dict[str, float] = {}
        unsaved: str | None = None
        t0 = time.monotonic()
        state = family.post_setup.get(_task_key(task)) if self.reuse == "post_setup" else None
        if state is not None:
            self._drop_desktop()
            t = time.monotonic()
            desktop = _retry_unavailable("restore", lambda: self._restore_desktops(state.snapshot, 1)[0])
            timings["restore"] = time.monotonic() - t
            self._adopt(desktop, state)
            self._dirty = bool(task.config)
            source = "post_setup_restore"
            self._setup_report = self._read_setup_report() if task.config else None
        else:
            if self._desktop is None or self._dirty:
                self._drop_desktop()
                t = time.monotonic()
                desktop = _retry_unavailable("boot", self._boot_desktop)
                timings["boot"] = time.monotonic() - t
                self._adopt(desktop, None)
                self._dirty = False
            _copy_dir(self.cache_dir / task.id, self._task_cache())
            if task.config:
                self._dirty = True  # also when the setup fails half way
            t = time.monotonic()
            self._setup_report = self._run_setup(task)
            timings["setup"] = time.monotonic() - t
            source = "setup"
            if self.reuse == "post_setup" and self._setup_report.ok:  # a failed setup is never reused
                t = time.monotonic()
                try:
                    state = self._save(None)
                except Unavailable as exc:  # rolled back, the desktop runs on: this episode goes on unsaved
                    if exc.reason != "STORE_FULL":
                        raise
                    log.warning("the snapshot store is full: the post-setup state of %s is not saved, later "
                                "resets of the task run its setup again (%s)", task.id, exc.message)
                    unsaved = exc.reason
                else:
                    family.post_setup[_task_key(task)] = state
                    timings["checkpoint"] = time.monotonic() - t
        self._step_no = 0
        self._history = []
        self._episode_over = False
        self._last_score = None
        obs = self.observe()
        timings["total"] = time.monotonic() - t0
        info = {"task_id": task.id, "session": self._desktop.id, "source": source, "seconds": timings}
        if unsaved is not None:
            info["post_setup_unsaved"] = unsaved
        report = self.setup_report
        if report is not None:
            info["setup"] = report.to_json()
            if not report.ok:
                info["invalid"] = report.describe()
        return obs, info

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
        return self._screenshot_array(self._desktop.guest.screenshot())

    def close(self) -> None:
        """Destroy the desktop; the family's last env also deletes its saved states. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._drop_desktop()
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
        obs: dict[str, Any] = {"screenshot": self._screenshot_array(png), "instruction": self._task.instruction}
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
            journal = self._journal()
            journal.begin("postconfig")  # so postconfig calls do not land in the setup's record
            journal.close()
        last = self._history[-1] if self._history else None
        score = float(evaluate(self._task, self._desktop.guest, last, cache_dir=self._cache_base(),
                               client_password=SESSION_PASSWORD, screen_size=self.screen_size))
        if self._task.evaluator.get("postconfig"):
            self._dirty = True
        self._last_score = score
        return score

    # ------------------------------------------------------------------ branching
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

    def branch(self, name: str, n: int, *, wait_live: bool = False) -> list[DrumsDesktopEnv]:
        """``n`` new envs on sibling desktops restored at once from state ``name``, mid-episode.

        ``name`` is a state saved in this env's family (it and its branches), or else any snapshot
        name or id (then the episode restarts its step count at 0 with this env's task). The new
        envs are independent: each owns its desktop, and ``close()`` each of them. With
        ``wait_live`` the restore also waits for the daemon's liveness verdict.
        """
        self._check_open()
        family = self._ensure_family()
        state = family.by_name.get(name)
        if state is None:
            if self._task is None:
                raise ValueError(f"no state {name!r} in this env's family and no task to restore it with")
            state = _State(snapshot=name, name=name, task=self._task, step=0, history=[], cache=None,
                           parent=None, owned=False)
        return self._branch(state, n, wait_live=wait_live)

    @classmethod
    def branch_from(cls, state: str, n: int, *, task: Any, wait_live: bool = False,
                    **kwargs: Any) -> list[DrumsDesktopEnv]:
        """``n`` envs restored from a snapshot saved elsewhere (name or id), running ``task``.

        ``kwargs`` are the constructor's. The snapshot is not this process's: it is never deleted
        here. Each env restarts its step count at 0.
        """
        base = cls(task=task, **kwargs)
        try:
            return base.branch(state, n, wait_live=wait_live)
        finally:
            base.close()

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

    def _ensure_family(self) -> _Family:
        if self._family is None:
            self._family = _Family.create(self.client)
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
            self._setup_report = self._read_setup_report()
        return self._setup_report

    def _journal(self) -> Journal:
        from ..setup_journal import Journal

        assert self._desktop is not None
        return Journal(self._desktop.guest.base_url)

    def _read_setup_report(self) -> SetupReport:
        from ..setup_journal import missing_apps_for

        journal = self._journal()
        try:
            report = journal.read(label="setup")
        finally:
            journal.close()
        if not report.ok:
            report.missing_apps = missing_apps_for(self._task.raw if self._task else None, self._image())
        return report

    def _image(self) -> str | None:
        try:
            return str(self._desktop.session["spec"]["image"]) if self._desktop is not None else None
        except (KeyError, TypeError):
            return None

    def _run_setup(self, task: Task) -> SetupReport:
        """The task's setup on the current desktop, journaled in its guest; raises what run_setup
        raises (after noting it), and :class:`SetupFailed` when strict and a step failed."""
        from ..evaluation import SetupError, run_setup
        from ..setup_journal import SetupFailed, SetupReport, missing_apps_for

        journal = self._journal()
        try:
            mark = journal.begin("setup") if task.config else None
            try:
                run_setup(task.config, self._desktop.guest, task_cache_dir=self._task_cache(),
                          client_password=SESSION_PASSWORD, screen_size=self.screen_size,
                          on_step=journal.step if mark is not None else None)
            except SetupError as exc:
                if mark is not None:
                    journal.note(exc.step_index, exc.step_type, str(exc))
                raise
            if mark is None:
                return SetupReport(label="no setup")
            report = journal.read(mark)
        finally:
            journal.close()
        if not report.ok:
            report.missing_apps = missing_apps_for(task.raw, self._image())
            log.warning("task %s: %s", task.id, report.describe())
            if self.strict_setup:
                raise SetupFailed(report, task.id)
        return report

    def _boot_desktop(self) -> Desktop:
        from ..desktop import Desktop

        if not self.network:
            return Desktop.boot(self.client, screen=self.screen_size)
        from ..desktop import desktop_spec

        return Desktop(self.client, self.client.create({**desktop_spec(self.screen_size),
                                                        "network": json.loads(self.network)}))

    def _restore_desktops(self, snapshot: str, n: int, wait_live: bool = False) -> list[Desktop]:
        from ..desktop import Desktop

        return Desktop.restore(self.client, snapshot, count=n, wait_live=wait_live)

    def _adopt(self, desktop: Desktop, origin: _State | None) -> None:
        self._desktop = desktop
        self._origin = origin
        self._desktop_finalizer = weakref.finalize(self, _destroy_quietly, self.client, desktop.id)
        if origin is not None:
            _copy_dir(origin.cache if origin.cache is not None else self.cache_dir / origin.task.id,
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

    def _save(self, name: str | None, keep: bool = False) -> _State:
        assert self._desktop is not None and self._task is not None
        family = self._ensure_family()
        t = time.monotonic()
        snap = self._desktop.checkpoint(name=name, leave_running=True, snapshot_id=uuid.uuid4().hex)
        with family.lock:
            family.serial += 1
            cache = family.root / f"state-{family.serial}"
        _copy_dir(self._task_cache(), cache)
        state = _State(snapshot=snap["id"], name=name, task=self._task, step=self._step_no,
                       history=copy.deepcopy(self._history), cache=cache, parent=self._origin,
                       keep=keep, episode_over=self._episode_over, seconds=time.monotonic() - t)
        family.add(state)
        self._origin = state
        return state

    def _branch(self, state: _State, n: int, wait_live: bool = False) -> list[DrumsDesktopEnv]:
        if not isinstance(n, int) or n < 1:
            raise ValueError("n must be a positive number of branches")
        family = self._ensure_family()
        t = time.monotonic()
        desktops = _retry_unavailable("restore", lambda: self._restore_desktops(state.snapshot, n, wait_live))
        seconds = time.monotonic() - t
        envs: list[DrumsDesktopEnv] = []
        try:
            for desktop in desktops:
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
            for desktop in desktops[len(envs):]:
                _destroy_quietly(self.client, desktop.id)
            raise
        return envs

    def _screenshot_array(self, png: bytes) -> np.ndarray:
        from PIL import Image

        with Image.open(io.BytesIO(png)) as img:
            arr = np.array(img.convert("RGB"), dtype=np.uint8)
        width, height = self.screen_size
        if arr.shape != (height, width, 3):
            raise FailedPrecondition(f"the desktop's screenshot is {arr.shape[1]}x{arr.shape[0]}, "
                                     f"the observation space {width}x{height}", reason="SCREEN_SIZE_MISMATCH")
        return arr

    def __repr__(self) -> str:
        task = self._task.id if self._task is not None else None
        return f"<DrumsDesktopEnv task={task} session={self.session_id} step={self._step_no}>"
