"""Mid-task branches: N sibling ``DesktopEnv``s from one state, each with its own desktop.

    env.reset(task_config=task); env.step(...)            # an agent prefix
    env._save_state("mid")                                # optional: branch() can save for you
    a, b, c = branch(env, 3, "mid")                       # restored at once, one daemon call
    a.step(...); b.step(...); a.evaluate(); b.evaluate()  # independent continuations, own evaluators
    close_all([a, b, c])

Each sibling is a real ``DesktopEnv(provider_name="drums")`` built around a desktop restored from
the state: its own session, address and reseeded infrastructure (hostname, guest-server RNG),
the parent's processes with their memory (so an agent's seeded RNG continues identically), the
parent's task (instruction, evaluator), action history and counters, and a cache directory of its
own (getters write result files there, so siblings evaluating at once do not collide). A sibling
is marked used: its next ``reset`` reverts to the env's ``snapshot_name`` as usual.

The state is private to the env that saved it; it is deleted when that env and every sibling made
from it have closed.
"""
from __future__ import annotations

import logging
import os
import uuid
from typing import Any

from drums_core.errors import NotFound

from ..desktop import Desktop
from ..provider import leases
from ..provider.registration import provider_options
from .reuse import _drums_provider

log = logging.getLogger("drums.osworld.snapshot")


def _task_of(env: Any) -> dict | None:
    if not hasattr(env, "task_id") or not hasattr(env, "evaluator"):
        return None
    return {"id": env.task_id, "instruction": env.instruction, "config": list(getattr(env, "config", []) or []),
            "evaluator": env.evaluator}


def saved_state(env: Any, name: str) -> dict | None:
    """The state ``name`` this env saved (``env._save_state(name)``), or None."""
    from ..provider.images import find_snapshot

    prov = _drums_provider(env)
    return find_snapshot(prov.client, name, prov.image_ref().private_scope(prov.owner))


def branch(env: Any, count: int, name: str | None = None, *, env_class: type | None = None) -> list[Any]:
    """``count`` sibling DesktopEnvs continuing from ``env``'s state ``name``.

    When ``name`` names a state the env saved, the siblings start from it; otherwise the env's
    current state is saved now (under ``name``, or a fresh one) and the env keeps running.
    All siblings are restored in one call (all or nothing).
    """
    prov = _drums_provider(env)
    snap = saved_state(env, name) if name else None
    if snap is None:
        snap = prov.save_state(env.path_to_vm, name)
    desktops = Desktop.restore(prov.client, snap["id"], count=count)
    # Leased at once (to this process), so a kill while the envs are being built loses nothing.
    holder = f"branch-{uuid.uuid4().hex[:12]}"
    for d in desktops:
        leases.hold(prov.client, "session", d.id, holder)
    cls = env_class or type(env)
    siblings: list[Any] = []
    try:
        while desktops:
            desktop = desktops.pop(0)
            try:
                with provider_options(adopt=desktop, share_snapshot=snap["id"], reuse_mode=prov.reuse_mode):
                    sib = cls(provider_name="drums", path_to_vm=env.path_to_vm, snapshot_name=env.snapshot_name,
                              action_space=env.action_space,
                              cache_dir=os.path.join(env.cache_dir_base, "drums-branches", desktop.id),
                              screen_size=(env.screen_width, env.screen_height), headless=env.headless,
                              require_a11y_tree=env.require_a11y_tree, require_terminal=env.require_terminal,
                              os_type=env.os_type, enable_proxy=env.enable_proxy,
                              client_password=env.client_password)
            except BaseException:
                _discard(prov.client, desktop, holder)
                raise
            siblings.append(sib)
            leases.release(prov.client, "session", desktop.id, holder)  # the sibling's provider holds it now
            _continue_from(sib, env)
    except BaseException:
        for d in desktops:
            _discard(prov.client, d, holder)
        close_all(siblings)
        raise
    log.info("branched %d siblings from state %s: %s", count, snap["id"],
             [s.provider.desktop.id for s in siblings])
    return siblings


def _discard(client: Any, desktop: Desktop, holder: str) -> None:
    try:
        if not desktop.closed:
            desktop.close()
    except NotFound:
        pass
    finally:
        leases.release(client, "session", desktop.id, holder)


def _continue_from(sib: Any, env: Any) -> None:
    task = _task_of(env)
    if task is not None:
        sib._set_task_info(task)
        sib.setup_controller.reset_cache_dir(sib.cache_dir)
    sib.action_history = list(env.action_history)
    sib._traj_no = env._traj_no
    sib._step_no = env._step_no
    sib.current_use_proxy = getattr(env, "current_use_proxy", False)
    sib.is_environment_used = True  # mid-task: a reset must revert


def close_all(envs: list[Any]) -> None:
    """Close every env, even when some close fails; re-raise the first failure."""
    first: BaseException | None = None
    for e in envs:
        try:
            e.close()
        except BaseException as exc:  # noqa: BLE001 - keep closing the others
            first = first or exc
    if first is not None:
        raise first
