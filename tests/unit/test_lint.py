"""``ruff check`` (the rules of pyproject.toml/ruff settings, the lint env of tox.ini) finds nothing in
the project's code, its tests and its scripts: run in the unit lane of ``make test``, so a finding
fails the suite in its first minute."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TARGETS = ("drums_core", "drums_osworld", "tests", "scripts")


def _ruff() -> list[str]:
    here = Path(sys.executable).parent / "ruff"
    if here.exists():
        return [str(here)]
    found = shutil.which("ruff")
    if found is None:
        pytest.fail("ruff is not installed (it is in the dev extra: scripts/provision installs it)")
    return [found]


def test_ruff_check_is_clean() -> None:
    out = subprocess.run([*_ruff(), "check", "--output-format", "concise", "--no-cache", *TARGETS], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"ruff check found problems:\n{out.stdout[-6000:]}{out.stderr[-2000:]}"
