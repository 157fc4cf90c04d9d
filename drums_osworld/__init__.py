"""OSWorld and gymnasium adapters for Drums, and the guest server that runs inside each desktop.

``import drums_osworld`` registers ``drums/Desktop-v0`` (``ENV_ID``) with gymnasium and arranges
that OSWorld's ``DesktopEnv(provider_name="drums")`` works whenever ``desktop_env`` is (or later
gets) imported. Both are cheap: neither imports OSWorld nor boots anything. ``register()`` does the
OSWorld part explicitly (and patches an already-imported ``desktop_env`` at once).

Public names (the classes and functions load on first use, so ``import drums_osworld`` stays light:
no OSWorld, Ray or torch):

- gymnasium: ``ENV_ID``, :class:`DrumsDesktopEnv` (``gymnasium.make("drums_osworld:drums/Desktop-v0",
  task=...)``), :func:`run_rollouts` (N scripted branches of one saved state);
- OSWorld: :func:`register`, :class:`DrumsProvider` and :class:`DrumsVMManager` (what
  ``DesktopEnv(provider_name="drums")`` runs on), :func:`set_reuse_mode` / :class:`ReuseMode`
  (``none`` or ``post_setup``), :func:`branch` / :func:`saved_state` (sibling ``DesktopEnv``s of
  a state saved mid-task);
- desktops and tasks: :class:`Desktop` and :func:`desktop_spec` (an OSWorld desktop on a Drums
  session), :class:`GuestClient` (its guest server), :class:`Task`, :func:`load_task`,
  :func:`find_task`, :func:`list_tasks`, :class:`TaskError`, :func:`evaluate` (a task's
  evaluator on a desktop).
"""
from __future__ import annotations

from drums_core.lazy import lazy_exports

# public name -> module it lives in (imported on first access: see __getattr__)
_LAZY = {
    "ENV_ID": "drums_osworld.gym.env",
    "DrumsDesktopEnv": "drums_osworld.gym.env",
    "run_rollouts": "drums_osworld.apps.rollouts",
    "DrumsProvider": "drums_osworld.provider.provider",
    "DrumsVMManager": "drums_osworld.provider.provider",
    "set_reuse_mode": "drums_osworld.snapshot.reuse",
    "ReuseMode": "drums_osworld.snapshot.reuse",
    "branch": "drums_osworld.snapshot.branch",
    "saved_state": "drums_osworld.snapshot.branch",
    "Desktop": "drums_osworld.desktop",
    "desktop_spec": "drums_osworld.desktop",
    "GuestClient": "drums_osworld.guest.client",
    "Task": "drums_osworld.tasks",
    "TaskError": "drums_osworld.tasks",
    "load_task": "drums_osworld.tasks",
    "find_task": "drums_osworld.tasks",
    "list_tasks": "drums_osworld.tasks",
    "evaluate": "drums_osworld.evaluation.evaluate",
}

__all__ = ["register", *_LAZY]


def register() -> None:
    """Make ``DesktopEnv(provider_name="drums")`` work in OSWorld 1.0.2 (idempotent).

    Patches an already-imported ``desktop_env`` at once; without it, ``import drums_osworld``'s
    import hook does the same when ``desktop_env`` is imported later. Raises ``ImportError`` when
    OSWorld (``desktop-env``) is not installed."""
    from .provider.registration import register as _register

    _register()


__getattr__, __dir__ = lazy_exports(globals(), _LAZY)


def register_cli() -> None:
    """Provide ``drums bench``, ``drums rollouts`` and the desktop ``drums up`` boots without ``--bare``
    (idempotent; imports nothing of them). The installed ``drums`` declares it in the entry-point
    group ``drums.cli``, and ``import drums_osworld`` calls it (see :mod:`drums_core.cli_registry`)."""
    from drums_core.cli_registry import Command, Desktop, register_command, register_desktop

    register_command(Command("bench", "drums_osworld.bench", build_parser="_parser", globals=("instance", "slot_base")))
    register_command(Command("rollouts", "drums_osworld.apps.rollouts", globals=("instance",)))
    register_desktop(Desktop("drums_osworld.desktop", "cli_desktop"))


def _on_import() -> None:
    import importlib.util

    # Inside a desktop (the guest server) neither OSWorld nor gymnasium is installed: skip what needs them.
    for module, hook, needs in (("drums_osworld.provider.registration", "install_import_hook", None),
                                ("drums_osworld.gym.env", "register_envs", "gymnasium")):
        try:
            present = importlib.util.find_spec(module) is not None and (
                needs is None or importlib.util.find_spec(needs) is not None)
        except ModuleNotFoundError:  # the parent package is absent
            present = False
        if present:
            getattr(importlib.import_module(module), hook)()
    register_cli()


_on_import()
