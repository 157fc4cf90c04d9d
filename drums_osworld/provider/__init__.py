"""OSWorld's provider interface on Drums: ``DesktopEnv(provider_name="drums")``.

    import drums_osworld                       # registers (lazily, when desktop_env gets imported)
    from desktop_env.desktop_env import DesktopEnv
    env = DesktopEnv(provider_name="drums", action_space="pyautogui")

Modules:
  * :mod:`.registration` -- ``register()`` (patch OSWorld 1.0.2 in memory, idempotent) and
    ``install_import_hook()`` (cheap: no OSWorld import). Imported by ``drums_osworld`` itself,
    so this package's ``__init__`` must stay free of heavy imports: the classes below load lazily.
  * :mod:`.provider` -- ``DrumsProvider`` and ``DrumsVMManager`` as ``DesktopEnv`` really calls them.
  * :mod:`.images` -- ``drums://<image>`` paths, snapshot scopes, the shared ``init_state``.
  * :mod:`.leases` -- who owns which session; a watchdog reclaims them when the owner dies.
"""
from __future__ import annotations

from typing import Any

__all__ = ["DrumsProvider", "DrumsVMManager", "register", "install_import_hook", "reap_orphans"]


def register() -> None:
    from .registration import register as _register

    _register()


def install_import_hook() -> None:
    from .registration import install_import_hook as _install

    _install()


def __getattr__(name: str) -> Any:
    if name in ("DrumsProvider", "DrumsVMManager"):
        from . import provider

        return getattr(provider, name)
    if name == "reap_orphans":
        from .leases import reap_orphans

        return reap_orphans
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
