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
    try:
        from .provider.registration import install_import_hook
    except ImportError:  # the provider package is optional at import time (e.g. inside a guest)
        install_import_hook = None
    if install_import_hook is not None:
        install_import_hook()
    try:
        from .gym_env import register_envs
    except ImportError:
        register_envs = None
    if register_envs is not None:
        register_envs()


_on_import()
