"""Which Debian suite CRIU 4.2.x comes from: the decision scripts/provision acts on."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "criu_suite.py"

BOOKWORM = """\
PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"
NAME="Debian GNU/Linux"
VERSION_ID="12"
VERSION="12 (bookworm)"
VERSION_CODENAME=bookworm
ID=debian
HOME_URL="https://www.debian.org/"
"""

TRIXIE = """\
PRETTY_NAME="Debian GNU/Linux 13 (trixie)"
NAME="Debian GNU/Linux"
VERSION_ID="13"
VERSION="13 (trixie)"
VERSION_CODENAME=trixie
DEBIAN_VERSION_FULL=13.1
ID=debian
HOME_URL="https://www.debian.org/"
"""

UBUNTU = """\
NAME="Ubuntu"
VERSION_ID="24.04"
ID=ubuntu
ID_LIKE=debian
VERSION_CODENAME=noble
"""

BULLSEYE = """\
VERSION_ID="11"
VERSION_CODENAME=bullseye
ID=debian
"""


def _run(tmp_path: Path, text: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "os-release"
    path.write_text(text)
    return subprocess.run([sys.executable, str(SCRIPT), str(path)], capture_output=True,
                          text=True, timeout=30, check=False)


@pytest.mark.parametrize("text", [BOOKWORM, TRIXIE], ids=["bookworm", "trixie"])
def test_debian_12_and_13_take_criu_from_unstable(tmp_path: Path, text: str) -> None:
    res = _run(tmp_path, text)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "sid"


@pytest.mark.parametrize("text", [UBUNTU, BULLSEYE], ids=["ubuntu", "bullseye"])
def test_unknown_hosts_are_refused_with_a_reason(tmp_path: Path, text: str) -> None:
    res = _run(tmp_path, text)
    assert res.returncode == 2
    assert res.stdout == ""
    assert "criu_suite:" in res.stderr and "supported" in res.stderr


def test_this_host_has_a_suite() -> None:
    res = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True,
                         timeout=30, check=False)
    assert res.returncode == 0, f"this host cannot be provisioned: {res.stderr}"
    assert res.stdout.strip() == "sid"


def test_missing_os_release_is_an_error(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "absent")],
                         capture_output=True, text=True, timeout=30, check=False)
    assert res.returncode == 2
    assert "cannot read" in res.stderr
