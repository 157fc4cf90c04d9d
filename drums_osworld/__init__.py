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
    from .gym_env import register_envs
    from .provider.registration import install_import_hook

    install_import_hook()
    register_envs()


_on_import()
