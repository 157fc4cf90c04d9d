"""Run OSWorld's own runner scripts with Drums registered.

    python -m drums_osworld.apps.run [--reuse none|post_setup] <script.py> [script args...]
    python -m drums_osworld.apps.run run.py --provider_name drums --observation_type screenshot ...
    python -m drums_osworld.apps.run scripts/python/run_multienv.py --provider_name drums --num_envs 4 ...

OSWorld's ``run.py`` and ``scripts/python/run_multienv.py`` are not in the desktop-env wheel; they
live in an OSWorld checkout and construct ``DesktopEnv(provider_name=args.provider_name, ...)``.
This launcher, without editing them:

* registers Drums (``DesktopEnv(provider_name="drums")`` works, see :mod:`.provider.registration`);
* adds ``"drums"`` to any ``--provider_name`` option that has ``choices`` (run_multienv's list is
  ``["aws", "virtualbox", "vmware", "docker", "azure"]``);
* keeps both in worker processes: ``fork`` inherits them, ``forkserver`` preloads
  ``drums_osworld``, and ``spawn`` children import it before unpickling their target;
* runs the script as ``__main__`` with ``sys.argv`` and ``sys.path[0]`` as ``python script.py``
  would (relative paths resolve against the current directory, as usual).

``--reuse`` sets ``DRUMS_OSWORLD_REUSE`` for every Drums env the script makes (default ``none``).
"""
from __future__ import annotations

import argparse
import os
import runpy
import sys

PROVIDER_OPTIONS = ("--provider_name", "--provider-name")


def _patch_argparse() -> None:
    """Accept "drums" wherever a ``--provider_name`` option restricts its ``choices``."""
    container = argparse._ActionsContainer
    original = container.add_argument
    if getattr(original, "__drums__", False):
        return

    def add_argument(self, *args, **kwargs):
        names = [a for a in args if isinstance(a, str)]
        is_provider = any(n in PROVIDER_OPTIONS for n in names) or kwargs.get("dest") == "provider_name"
        choices = kwargs.get("choices")
        if is_provider and choices is not None and "drums" not in choices:
            kwargs["choices"] = [*choices, "drums"]
        return original(self, *args, **kwargs)

    add_argument.__drums__ = True
    add_argument.__wrapped__ = original
    container.add_argument = add_argument


def _keep_in_workers() -> None:
    """Make multiprocessing workers register too, whatever their start method."""
    import multiprocessing
    import multiprocessing.spawn as spawn

    try:
        multiprocessing.set_forkserver_preload(["drums_osworld"])
    except (AttributeError, ValueError):  # pragma: no cover - platforms without forkserver
        pass
    original = spawn.get_command_line
    if getattr(original, "__drums__", False):
        return

    def get_command_line(**kwds):
        argv = original(**kwds)
        # [python, *flags, "-c", prog, "--multiprocessing-fork", ...]: import drums_osworld first.
        if "-c" in argv:
            i = argv.index("-c") + 1
            argv = [*argv[:i], "import drums_osworld, drums_osworld.apps.run as _r; _r._patch_argparse(); " + argv[i],
                    *argv[i + 1:]]
        return argv

    get_command_line.__drums__ = True
    spawn.get_command_line = get_command_line
    # Children find drums_osworld through PYTHONPATH even when the script changes sys.path.
    pkg_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if pkg_parent not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([pkg_parent, *paths])


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="python -m drums_osworld.apps.run",
        description="Run an OSWorld runner script (run.py, scripts/python/run_multienv.py) on Drums desktops.")
    parser.add_argument("--reuse", choices=["none", "post_setup"], default=None,
                        help="how resets reuse desktops (default: $DRUMS_OSWORLD_REUSE or none)")
    parser.add_argument("script", help="the OSWorld script to run")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    ns = parser.parse_args(argv)
    script = os.path.abspath(ns.script)
    if not os.path.isfile(script):
        parser.error(f"no such script: {ns.script}")
    if ns.reuse:
        os.environ["DRUMS_OSWORLD_REUSE"] = ns.reuse

    # Registration happens as soon as the script imports desktop_env (at once if it already is).
    from drums_osworld.provider.registration import install_import_hook

    install_import_hook()
    _patch_argparse()
    _keep_in_workers()
    sys.argv = [script, *ns.args]
    sys.path[0] = os.path.dirname(script)
    runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
