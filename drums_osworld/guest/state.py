"""The guest server's shared state: its settings (:class:`GuestConfig`) and :class:`GuestState`,
the one object every request handler works through (``current()`` inside a request)."""
from __future__ import annotations

import os
import shlex
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass

from flask import Flask, current_app

from . import setup_log
from .api import ApiError, json_flag
from .commands import Runner
from .recording import Recorder
from .screen import XConnection

#: Where an application keeps its :class:`GuestState` (``app.extensions[EXTENSION]``).
EXTENSION = "drums_guest"


@dataclass
class GuestConfig:
    """Settings of one server; the defaults are OSWorld's."""

    exec_timeout: float = 120.0        # /execute, /setup/execute
    open_timeout: float = 1800.0       # /setup/open_file waits this long for the window
    run_python_timeout: float = 30.0   # /run_python
    bash_timeout: float = 100.0        # /run_bash_script default when the client sends none
    run_as: str | None = None          # see commands.Runner
    display: str | None = None         # default: $DISPLAY, else :0
    workdir: str | None = None         # private scratch directory (default: a new /tmp dir)


class GuestState:
    """What the request handlers share: the config, the command runner, the X connection, the
    scratch directory, the recorder, the setup log and the reseed count. One per application
    (:func:`current` finds it from a handler)."""

    def __init__(self, cfg: GuestConfig) -> None:
        self.cfg = cfg
        if cfg.display:
            os.environ["DISPLAY"] = cfg.display
        self.runner = Runner(cfg.run_as)
        self.xc = XConnection(cfg.display or self.runner.env.get("DISPLAY"))
        self.workdir = cfg.workdir or tempfile.mkdtemp(prefix="drums-guest-")
        self._own_workdir = cfg.workdir is None
        os.makedirs(self.workdir, exist_ok=True)
        self.runner.chown(self.workdir)
        self.recorder = Recorder(self.workdir, self.xc.name, self.xc.screen_size)
        self.started_at = time.time()
        self.reseeds = 0
        self.setup_log = setup_log.SetupLog(self.runner.exit_status)
        self.reseed_lock = threading.Lock()

    def close(self) -> None:
        self.runner.close()
        self.recorder.abort()
        self.xc.close()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    # -- shared helpers ----------------------------------------------------------------------
    def command_from(self, data: dict) -> tuple[list[str] | str, bool]:
        """OSWorld's command handling: str + shell=False is shlex-split; ``~/`` args expanded."""
        shell = json_flag(data, "shell")
        command = data.get("command", "" if shell else [])
        if command is None:
            command = "" if shell else []
        if isinstance(command, str):
            if not shell:
                try:
                    command = shlex.split(command)
                except ValueError as exc:
                    raise ApiError(400, f"cannot split command: {exc}") from None
        elif isinstance(command, list):
            if not all(isinstance(a, str) for a in command):
                raise ApiError(400, "command list must contain only strings")
            if any("\x00" in a for a in command):
                raise ApiError(400, "command contains a NUL byte")
        else:
            raise ApiError(400, f"command must be a list of strings or a string, "
                                f"got {type(command).__name__}")
        if isinstance(command, str) and "\x00" in command:
            raise ApiError(400, "command contains a NUL byte")
        if not command or (isinstance(command, str) and not command.strip()):
            raise ApiError(400, "command is empty")
        if isinstance(command, list):
            command = [self.runner.expand_home(a) for a in command]
        return command, shell

    def path_from(self, raw: str) -> str:
        p = self.runner.expand_path(raw)
        if not os.path.isabs(p):
            p = os.path.join(self.runner.home, p)
        return p

    def makedirs(self, path: str) -> None:
        missing = []
        cur = path
        while cur and not os.path.exists(cur):
            missing.append(cur)
            parent = os.path.dirname(cur)
            if parent == cur:
                break
            cur = parent
        for d in reversed(missing):
            try:
                os.mkdir(d)
            except FileExistsError:
                continue
            self.runner.chown(d)


def attach(app: Flask, state: GuestState) -> None:
    """Make ``state`` the shared state of ``app``'s handlers."""
    app.extensions[EXTENSION] = state


def current(app: Flask | None = None) -> GuestState:
    """The shared state of ``app`` (default: the application handling the current request)."""
    return (app or current_app).extensions[EXTENSION]
