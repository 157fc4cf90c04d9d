"""Reuse modes: how a Drums ``DesktopEnv.reset`` gets a clean desktop for the next rollout.

The same agent code runs under each mode; only the provider's ``reuse_mode`` differs (set it with
:func:`set_reuse_mode`, the ``DRUMS_OSWORLD_REUSE`` environment variable, or
``python -m drums_osworld.apps.run --reuse MODE``):

``none``
    every rollout starts from the env's ``snapshot_name`` (``init_state``) and runs the task's setup.
``post_setup``
    the first rollout of a task runs the setup and saves ``post_setup:<task id>`` (a snapshot shared
    by every worker on the host, keyed by the image, the screen size and the setup steps); later
    rollouts restore it and skip the setup. Tasks without setup behave as under ``none``.

Either way a rollout never starts on a used desktop. OSWorld's ``reset`` skips its revert while
``is_environment_used`` is False, but that flag misses changes made through ``env.controller`` or
during a rollout whose task had no setup. Here the revert is skipped only when the provider knows
its desktop is an untouched restore of exactly the snapshot the rollout needs; a reset (and any
mutating controller call) makes the desktop used.
"""
from __future__ import annotations

import enum
import logging
import re
import time
from typing import Any, Callable

from drums_core.errors import InvalidArgument, NotFound, Unavailable
from drums_core.reasons import Reason

from ..setup_journal import SetupFailed, SetupReport, missing_apps_for

log = logging.getLogger("drums.osworld.snapshot")

POST_SETUP_PREFIX = "post_setup:"
_NAME_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,100}$")


class ReuseMode(str, enum.Enum):
    """How ``env.reset`` reuses desktops: ``none`` (revert to ``init_state`` and run the setup every time)
    or ``post_setup`` (restore the state saved after the task's setup the first time)."""

    NONE = "none"
    POST_SETUP = "post_setup"

    @classmethod
    def parse(cls, value: "str | ReuseMode | None") -> "ReuseMode":
        """The mode named by ``value`` (None or empty: ``NONE``); ``InvalidArgument`` for an unknown name."""
        if value is None or value == "":
            return cls.NONE
        try:
            return cls(value.value if isinstance(value, ReuseMode) else str(value).strip().lower())
        except ValueError:
            raise InvalidArgument(f"unknown reuse mode {value!r}; use 'none' or 'post_setup'",
                                  reason=Reason.BAD_REUSE_MODE) from None


def set_reuse_mode(env: Any, mode: "str | ReuseMode") -> None:
    """Choose how ``env.reset`` reuses desktops (a Drums env only)."""
    _drums_provider(env).reuse_mode = ReuseMode.parse(mode).value


def post_setup_name(task_config: dict) -> str:
    """``post_setup:<task id>`` (ids that are not valid snapshot names are hashed)."""
    tid = str(task_config.get("id", ""))
    if not _NAME_OK.match(tid):
        import hashlib

        tid = "sha-" + hashlib.sha256(tid.encode()).hexdigest()[:24]
    return POST_SETUP_PREFIX + tid


def post_setup_scope(env: Any, task_config: dict) -> str:
    """The shared scope of a task's post-setup state: image, screen, guest spec, setup steps (and the
    env's base snapshot when it is not ``init_state``)."""
    scope = _drums_provider(env).image_ref().setup_scope(list(task_config.get("config") or []))
    base = getattr(env, "snapshot_name", None) or "init_state"
    return scope if base == "init_state" else f"{scope}:base:{base}"


def _drums_provider(env: Any):
    from ..provider.provider import DrumsProvider

    prov = getattr(env, "provider", None)
    if not isinstance(prov, DrumsProvider):
        raise InvalidArgument("this needs a DesktopEnv(provider_name='drums')", reason=Reason.NOT_DRUMS)
    return prov


def drums_reset(env: Any, original_reset: Callable, task_config: dict | None = None, seed: Any = None,
                options: Any = None) -> dict:
    """``DesktopEnv.reset`` for Drums envs (installed by :func:`drums_osworld.provider.register`)."""
    prov = _drums_provider(env)
    t0 = time.monotonic()
    mode = ReuseMode.parse(prov.reuse_mode)
    prov.timings.clear()  # this reset's phases only: destroy, start (restore), saved_post_setup, reverted
    prov.setup_reports.clear()
    prov.setup_report = None
    prov.setup_phase = "setup"
    try:
        if mode is ReuseMode.POST_SETUP and task_config is not None and task_config.get("config"):
            obs = _post_setup_reset(env, prov, original_reset, task_config, seed, options)
        else:
            base = prov.resolve(env.snapshot_name, env.path_to_vm)
            if not prov.is_pristine_from(base):
                env.is_environment_used = True
            obs = original_reset(env, task_config, seed=seed, options=options)
            prov.timings["reverted"] = float(prov.timings.get("start") is not None)
    finally:
        prov.setup_phase = None
        prov.mark_used()  # from here on the desktop belongs to this rollout
        prov.timings["reset"] = time.monotonic() - t0
        prov.setup_report = _setup_report(prov, task_config)
    report = prov.setup_report
    if not report.ok:
        tid = (task_config or {}).get("id")
        log.warning("task %s: %s%s", tid, report.describe(),
                    "" if prov.strict_setup else " (this attempt is invalid: do not score it)")
        if prov.strict_setup:
            raise SetupFailed(report, tid)
    return obs


def _setup_report(prov: Any, task: dict | None) -> SetupReport:
    """This reset's setup report: the last ``setup()`` it ran, else (a desktop restored after its
    setup) the restored guest's own record of that setup."""
    ran = [r for phase, r in prov.setup_reports if phase == "setup"]
    if ran:
        report = ran[-1]
    elif task and task.get("config"):
        from ..provider.setup_watch import read_current

        report = read_current(prov)
    else:
        return SetupReport(label="no setup")
    if not report.ok:
        report.missing_apps = missing_apps_for(task, prov.image_ref().image)
    return report


def _post_setup_reset(env: Any, prov: Any, original_reset: Callable, task: dict, seed: Any, options: Any) -> dict:
    name, scope = post_setup_name(task), post_setup_scope(env, task)
    from ..provider.images import evicted_name, find_snapshot

    snap = find_snapshot(prov.client, name, scope)
    if snap is None:  # first rollout of this task here (or its state was evicted): set up, save
        return _setup_and_save(env, prov, original_reset, task, seed, options, name, scope)
    reverted = not prov.is_pristine_from(snap["id"])
    if reverted:
        prov.revert_to_id(snap["id"])
        try:
            env._start_emulator()
        except NotFound as exc:
            if evicted_name(exc) is None:
                raise
            # the store evicted it (a cache state) between the lookup and the restore: the plain way
            log.warning("%s was evicted from the snapshot store before it could be restored; this rollout "
                        "reverts to %s and runs the setup: %s", name, env.snapshot_name or "init_state", exc)
            return _setup_and_save(env, prov, original_reset, task, seed, options, name, scope)
    env.is_environment_used = False  # the desktop is exactly the post-setup state: no revert, no setup
    skipped = dict(task)
    skipped["config"] = []
    obs = original_reset(env, skipped, seed=seed, options=options)
    env.config = list(task.get("config") or [])
    prov.timings["reverted"] = float(reverted)
    prov.timings["from_saved_state"] = 1.0
    return obs


def _setup_and_save(env: Any, prov: Any, original_reset: Callable, task: dict, seed: Any, options: Any, name: str,
                    scope: str) -> dict:
    """Revert to the base, run the task's setup, and save the result as the task's post-setup state (a
    cache state: the store may evict it later). A store with no room (``STORE_FULL``) or any other
    rolled-back failure leaves this rollout going on unsaved, with a warning."""
    base = prov.resolve(env.snapshot_name, env.path_to_vm)
    if not prov.is_pristine_from(base):
        env.is_environment_used = True
    obs = original_reset(env, task, seed=seed, options=options)
    prov.mark_used()
    t0 = time.monotonic()
    prov.timings["reverted"] = float("start" in prov.timings)
    report = _setup_report(prov, task)
    if not report.ok:  # never keep a failed setup as the state later rollouts start from
        log.warning("not saving %s: %s", name, report.describe())
        return obs
    try:
        saved = prov.checkpoint(name, scope=scope, private=False, cache=True)
    except Unavailable as exc:  # rolled back, the desktop runs on: this rollout proceeds unsaved
        if exc.reason == Reason.STORE_FULL:
            log.warning("the snapshot store is full and nothing in it can be evicted or spilled: %s is not "
                        "saved, this and later rollouts of the task run its setup (%s)", name, exc.message)
        else:
            log.warning("could not save %s (the next rollout sets up again): %s", name, exc)
        prov.timings["post_setup_unsaved"] = 1.0
        return obs
    prov.timings["saved_post_setup"] = time.monotonic() - t0
    log.info("saved %s (snapshot %s, scope %s)", name, saved["id"], scope)
    return obs


def delete_post_setup(task_config: dict, client: Any = None) -> list[str]:
    """Delete every ``post_setup:<task id>`` snapshot of this task on the host (all images and setups)."""
    from ..provider.images import connect

    client = connect(client)
    name = post_setup_name(task_config)
    deleted = []
    for s in sorted(client.snapshots(), key=lambda s: -s["created"]):
        if s.get("name") == name and str(s.get("scope", "")).startswith("osworld:"):
            client.delete_snapshot(s["id"])
            deleted.append(s["id"])
    return deleted
