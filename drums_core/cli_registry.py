"""What packages above the engine add to the ``drums`` command line (the engine imports none of them).

``drums bench``, ``drums rollouts`` and the desktop ``drums up`` boots by default (an OSWorld desktop
with its guest server) are not the engine's: a package provides them by calling :func:`register_command`
and :func:`register_desktop` with the dotted names of its own modules (nothing is imported until the
command runs). The CLI finds providers two ways:

- the entry-point group ``drums.cli`` (``NAME = module:function``, the function registering them):
  the installed ``drums`` distribution declares ``osworld = drums_osworld:register_cli``;
- a package that is already imported has registered itself (``import drums_osworld`` does), which
  is what a process that imports it first sees without any installed metadata.

Only the standard library is imported here: ``import drums_osworld`` runs this inside every desktop.
"""
from __future__ import annotations

from dataclasses import dataclass

GROUP = "drums.cli"


@dataclass(frozen=True)
class Command:
    """A subcommand whose own module parses its options: ``module.build_parser()`` returns its parser
    (for ``--help`` and the help test), ``module.main(argv)`` runs it and returns the exit status;
    ``globals`` names the ``drums`` global options it takes (``instance``, ``slot_base``)."""

    name: str
    module: str
    build_parser: str = "build_parser"
    main: str = "main"
    globals: tuple[str, ...] = ()


@dataclass(frozen=True)
class Desktop:
    """What ``drums up`` boots without ``--bare``: ``module.function(screen, image, programs)`` returns
    ``(session spec, guest port or None)``; ``image`` is None for the provider's default image. With
    ``drums up --desktop NAME`` it is called with ``desktop=NAME`` too (the provider's names; an
    unknown one is its ``InvalidArgument``)."""

    module: str
    function: str


_COMMANDS: dict[str, Command] = {}
_DESKTOP: list[Desktop] = []
_LOADED: list[bool] = []
_PROBLEMS: list[str] = []  # entry points that failed to load, named in the CLI's error


def register_command(command: Command) -> None:
    """Provide ``drums <command.name>`` (idempotent; a later registration of the name replaces it)."""
    _COMMANDS[command.name] = command


def register_desktop(desktop: Desktop) -> None:
    """Provide the desktop ``drums up`` boots without ``--bare`` (idempotent)."""
    _DESKTOP[:] = [desktop]


def _load_entry_points() -> None:
    """Call the registration functions installed packages declare in :data:`GROUP` (once)."""
    if _LOADED:
        return
    _LOADED.append(True)
    from importlib.metadata import entry_points

    for ep in entry_points(group=GROUP):
        try:
            ep.load()()
        except (ImportError, AttributeError) as exc:  # a broken or partial install: say so, do not crash
            _PROBLEMS.append(f"{ep.name} = {ep.value}: {exc}")


def command(name: str) -> Command | None:
    """The provider of ``drums NAME``, or None when no imported or installed package provides it."""
    if name not in _COMMANDS:
        _load_entry_points()
    return _COMMANDS.get(name)


def desktop() -> Desktop | None:
    """The provider of ``drums up``'s default desktop, or None."""
    if not _DESKTOP:
        _load_entry_points()
    return _DESKTOP[0] if _DESKTOP else None


def missing(what: str) -> str:
    """The one-line reason why ``what`` is unavailable."""
    why = f"; entry points that failed: {'; '.join(_PROBLEMS)}" if _PROBLEMS else ""
    return (f"no installed package provides {what} (entry-point group {GROUP!r}; Drums' OSWorld "
            f"adapters, drums_osworld, do){why}")
