"""Helpers for the OSWorld provider and snapshot-bridge tests: run snippets with the real
desktop-env 1.0.2 (in its own venv, tests/osworld_harness.py) against the suite's daemon."""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import pytest

from . import REPO
from .osworld_forkserver import run_snippet
from .osworld_harness import BOOTSTRAP, OSWorldSnippetError, ensure_osworld_venv, osworld_env, stub_dir

MARK = "@@DRUMS-OSWORLD-JSON@@ "

# Shared by every snippet: the real DesktopEnv, with drums registered by importing drums_osworld.
PRELUDE = textwrap.dedent(f'''\
    import json, os, sys, time, logging
    import requests
    logging.basicConfig(level=logging.WARNING)
    import drums_osworld
    from desktop_env.desktop_env import DesktopEnv
    TASKS = {str(REPO / "tasks")!r}

    def load_task(rel):
        with open(os.path.join(TASKS, rel)) as f:
            return json.load(f)

    _http = requests.Session()
    _http.trust_env = False

    def guest_sh(env, command):
        """Run a shell command in env's desktop straight through the guest server (not a step)."""
        r = _http.post(f"http://{{env.vm_ip}}:{{env.server_port}}/execute",
                       json={{"command": command, "shell": True}}, timeout=120)
        r.raise_for_status()
        return r.json()["output"]
''')


def _venv() -> Path:
    try:
        return ensure_osworld_venv()
    except Exception as exc:  # noqa: BLE001 - no venv means these tests cannot show anything: fail
        pytest.fail(f"the OSWorld test venv (desktop-env==1.0.2) is unavailable: {exc}")


class OSWorld:
    """Runs snippets with the real OSWorld against the suite's daemon instance."""

    def __init__(self, venv: Path, instance: Any) -> None:
        self.venv = venv
        self.instance = instance
        self.workdir = Path(tempfile.mkdtemp(prefix="drums-osworld-test-"))

    def env(self, **extra: str) -> dict[str, str]:
        return osworld_env(self.venv, {
            "PYTHONPATH": f"{stub_dir(self.venv)}{os.pathsep}{REPO}",
            "DRUMS_INSTANCE": self.instance.name,
            "DRUMS_SLOT_BASE": str(self.instance.slot_base),
            "DRUMS_SLOT_COUNT": str(self.instance.slot_count),
            **extra,
        })

    def script(self, snippet: str, prelude: bool = True) -> Path:
        fd, path = tempfile.mkstemp(prefix="snippet-", suffix=".py", dir=self.workdir)
        with os.fdopen(fd, "w") as f:
            f.write(BOOTSTRAP + "\n" + (PRELUDE if prelude else "") + "\n" + textwrap.dedent(snippet))
        return Path(path)

    def popen(self, snippet: str, **extra: str) -> subprocess.Popen:
        return subprocess.Popen([str(self.venv / "bin/python"), str(self.script(snippet))], cwd=self.workdir,
                                env=self.env(**extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def run(self, snippet: str, timeout: float = 900, argv: list[str] | None = None, **extra: str) -> Any:
        """Run ``snippet``; return what it last passed to ``emit()``. Its stdout is echoed (pytest -s)."""
        if argv is not None:
            r = subprocess.run(argv, cwd=self.workdir, env=self.env(**extra), capture_output=True, text=True,
                               timeout=timeout)
        else:  # in a fork of a process that has desktop-env imported already (osworld_forkserver)
            r = run_snippet(str(self.venv / "bin/python"), str(self.script(snippet)), [], str(self.workdir),
                            self.env(**extra), timeout)
        for line in r.stdout.splitlines():
            if not line.startswith(MARK):
                print(line)
        if r.returncode != 0:
            raise OSWorldSnippetError(r.returncode, r.stdout, r.stderr)
        values = [line[len(MARK):] for line in r.stdout.splitlines() if line.startswith(MARK)]
        return json.loads(values[-1]) if values else None

    def lease_files(self) -> list[str]:
        d = self.instance.state_dir / "osworld" / "leases"
        return sorted(p.name for p in d.iterdir()) if d.exists() else []


def watchdog_pids(instance: Any) -> list[int]:
    """Live lease watchdogs of this instance (found by their exact argv)."""
    from drums_core.host.procs import scan_processes

    pids = [p.pid for p in scan_processes().values()
            if not p.zombie and "drums_osworld.provider.leases" in p.argv and instance.name in p.argv]
    return pids


