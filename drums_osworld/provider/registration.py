"""Make ``DesktopEnv(provider_name="drums")`` work in OSWorld (desktop-env 1.0.2) without editing it.

OSWorld has no provider registry. Three things stand in the way, and :func:`register` handles each
in memory, idempotently:

1. The factory ``create_vm_manager_and_provider`` is an if/elif over known names, and it is bound
   in two modules (``desktop_env.providers`` and, by ``from ... import``, ``desktop_env.desktop_env``).
   Both names are replaced by a wrapper that answers ``"drums"`` and passes everything else through.
2. ``DesktopEnv.__init__`` rejects names outside two hard-coded sets. The wrapped ``__init__`` runs
   the original with a name from the *clean-start* set (so ``is_environment_used`` starts False,
   with no revert before the first reset), while a context variable makes the factory build the
   Drums classes (with the env's ``screen_size``); afterwards ``provider_name`` is ``"drums"``.
3. ``DesktopEnv.reset`` trusts its ``is_environment_used`` flag, which misses changes made through
   the env's controllers or during a reset whose task has no setup. For Drums envs, ``reset`` goes
   through :func:`drums_osworld.snapshot.reuse.drums_reset`, which reverts unless the provider
   knows the desktop is an untouched restore, and applies the reuse mode (``none``/``post_setup``);
   ``_start_emulator`` additionally hands the new controllers to the provider for that tracking.

:func:`install_import_hook` is cheap (no OSWorld import): it calls :func:`register` as soon as
``desktop_env.desktop_env`` has been imported, or at once when it already is.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib.abc
import importlib.machinery
import inspect
import sys
import threading
from collections.abc import Iterator
from typing import Any

PROVIDER_NAME = "drums"
_CLEAN_START_NAME = "docker"  # in 1.0.2's clean-start set; its only other effect is path_to_vm kept as given
_TARGET = "desktop_env.desktop_env"

_lock = threading.RLock()
#: Options for the provider the factory builds while a Drums DesktopEnv is being constructed.
_creating: contextvars.ContextVar[dict | None] = contextvars.ContextVar("drums_creating", default=None)
_extra: contextvars.ContextVar[dict | None] = contextvars.ContextVar("drums_extra", default=None)


def is_drums_name(name: Any) -> bool:
    return isinstance(name, str) and name.lower().strip() == PROVIDER_NAME


@contextlib.contextmanager
def provider_options(**options: Any) -> Iterator[None]:
    """Extra keyword arguments for the ``DrumsProvider`` of Drums envs constructed in this block
    (used by branches to hand a restored desktop to a new ``DesktopEnv``)."""
    token = _extra.set({**(_extra.get() or {}), **options})
    try:
        yield
    finally:
        _extra.reset(token)


# ------------------------------------------------------------------------------------ patches
def _make_factory(original):
    @functools.wraps(original)
    def create_vm_manager_and_provider(provider_name: str, region: str | None = None, use_proxy: bool = False,
                                       *args: Any, **kwargs: Any):
        opts = _creating.get()
        if opts is not None or is_drums_name(provider_name):
            from .provider import DrumsProvider, DrumsVMManager

            return DrumsVMManager(), DrumsProvider(region, **(opts or {}))
        return original(provider_name, region, use_proxy, *args, **kwargs)

    create_vm_manager_and_provider.__drums__ = True
    return create_vm_manager_and_provider


def _patch_init(cls) -> None:
    original = cls.__init__
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self, provider_name: str = "vmware", *args: Any, **kwargs: Any) -> None:
        if not is_drums_name(provider_name):
            return original(self, provider_name, *args, **kwargs)
        bound = signature.bind(self, provider_name, *args, **kwargs)
        bound.apply_defaults()
        screen = bound.arguments.get("screen_size") or (1920, 1080)
        opts = {"screen_size": (int(screen[0]), int(screen[1])), **(_extra.get() or {})}
        token = _creating.set(opts)
        try:
            original(self, _CLEAN_START_NAME, *args, **kwargs)
        finally:
            _creating.reset(token)
        self.provider_name = PROVIDER_NAME

    __init__.__drums__ = True
    __init__.__drums_original__ = original
    cls.__init__ = __init__


def _is_drums_env(env: Any) -> bool:
    from .provider import DrumsProvider

    return isinstance(getattr(env, "provider", None), DrumsProvider)


def _patch_reset(cls) -> None:
    original = cls.reset

    @functools.wraps(original)
    def reset(self, task_config: dict | None = None, seed: Any = None, options: Any = None):
        if not _is_drums_env(self):
            return original(self, task_config, seed=seed, options=options)
        from ..snapshot.reuse import drums_reset

        return drums_reset(self, original, task_config, seed=seed, options=options)

    reset.__drums__ = True
    reset.__drums_original__ = original
    cls.reset = reset


def _patch_start(cls) -> None:
    original = cls._start_emulator

    @functools.wraps(original)
    def _start_emulator(self) -> None:
        if not _is_drums_env(self):
            return original(self)
        with self.provider.starting():
            original(self)
        self.provider.track_controllers(self.controller, self.setup_controller)

    _start_emulator.__drums__ = True
    _start_emulator.__drums_original__ = original
    cls._start_emulator = _start_emulator


def register() -> None:
    """Patch the imported (or now imported) OSWorld so that ``provider_name="drums"`` works. Idempotent."""
    with _lock:
        import desktop_env.desktop_env as de
        import desktop_env.providers as providers

        for module in (providers, de):
            factory = module.create_vm_manager_and_provider
            if not getattr(factory, "__drums__", False):
                module.create_vm_manager_and_provider = _make_factory(factory)
        cls = de.DesktopEnv
        if not getattr(cls.__dict__.get("__init__"), "__drums__", False):
            _patch_init(cls)
        if not getattr(cls.__dict__.get("reset"), "__drums__", False):
            _patch_reset(cls)
        if not getattr(cls.__dict__.get("_start_emulator"), "__drums__", False):
            _patch_start(cls)


def is_registered() -> bool:
    mod = sys.modules.get(_TARGET)
    if mod is None:
        return False
    prov = sys.modules.get("desktop_env.providers")
    return (getattr(mod.create_vm_manager_and_provider, "__drums__", False)
            and getattr(getattr(prov, "create_vm_manager_and_provider", None), "__drums__", False)
            and getattr(mod.DesktopEnv.__dict__.get("__init__"), "__drums__", False))


# ------------------------------------------------------------------------------------ import hook
class _RegisteringLoader(importlib.abc.Loader):
    """Wraps the real loader of ``desktop_env.desktop_env``; registers once the module has run."""

    def __init__(self, inner: importlib.abc.Loader) -> None:
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        self.inner.exec_module(module)
        register()

    def __getattr__(self, name: str) -> Any:  # get_code, get_source, is_package, ... for tools
        return getattr(self.inner, name)


class _ImportHook(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None):
        if fullname != _TARGET:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and not isinstance(spec.loader, _RegisteringLoader):
                    spec.loader = _RegisteringLoader(spec.loader)
                return spec
        return None


def install_import_hook() -> None:
    """Register as soon as ``desktop_env.desktop_env`` is imported (at once if it already is)."""
    with _lock:
        if not any(isinstance(f, _ImportHook) for f in sys.meta_path):
            sys.meta_path.insert(0, _ImportHook())
    if _TARGET in sys.modules and getattr(sys.modules[_TARGET], "DesktopEnv", None) is not None:
        register()
