"""OSWorld and gymnasium adapters for Drums, and the guest server that runs inside each desktop.

``import drums_osworld`` registers ``drums/Desktop-v0`` with gymnasium and arranges that OSWorld's
``DesktopEnv(provider_name="drums")`` works whenever ``desktop_env`` is (or later gets) imported.
Both are cheap: neither imports OSWorld nor boots anything. ``register()`` does the OSWorld part
explicitly (and patches an already-imported ``desktop_env`` at once).
"""
from __future__ import annotations


def register() -> None:
    """Make ``DesktopEnv(provider_name="drums")`` work in OSWorld 1.0.2 (idempotent)."""
    from .provider.registration import register as _register

    _register()


def _on_import() -> None:
    import importlib
    import importlib.util

    # Inside a desktop (the guest server) neither OSWorld nor gymnasium is installed: skip what needs them.
    for module, hook, needs in (("drums_osworld.provider.registration", "install_import_hook", None),
                                ("drums_osworld.gym_env", "register_envs", "gymnasium")):
        try:
            present = importlib.util.find_spec(module) is not None and (
                needs is None or importlib.util.find_spec(needs) is not None)
        except ModuleNotFoundError:  # the parent package is absent
            present = False
        if present:
            getattr(importlib.import_module(module), hook)()


_on_import()
