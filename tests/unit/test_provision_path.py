"""`scripts/provision` puts `drums` on PATH: its `drums_on_path` step, run alone on a scratch
directory (a stand-in venv and bin directory): links, is idempotent, replaces a stale link of
ours, and refuses to replace a file that is not a link."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROVISION = REPO / "scripts" / "provision"


def _step_function() -> str:
    text = PROVISION.read_text()
    m = re.search(r"^drums_on_path\(\) \{\n.*?^\}\n", text, re.S | re.M)
    assert m, "scripts/provision has no drums_on_path step"
    assert 'step "drums on PATH ($BIN_DIR/drums)" drums_on_path' in text
    return m.group(0)


def _run(tmp_path: Path) -> subprocess.CompletedProcess:
    script = ("set -euo pipefail\n"
              'note() { printf "note: %s\\n" "$*"; }\n'
              'die() { printf "die: %s\\n" "$*" >&2; exit 1; }\n'
              f'VENV={tmp_path}/venv\nBIN_DIR={tmp_path}/bin\n' + _step_function() + "drums_on_path\n")
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)


def test_provision_script_parses():
    assert subprocess.run(["bash", "-n", str(PROVISION)], capture_output=True).returncode == 0


def test_drums_on_path_links_once_and_refuses_a_foreign_file(tmp_path):
    target = tmp_path / "venv" / "bin" / "drums"
    target.parent.mkdir(parents=True)
    target.write_text("#!/bin/sh\nexit 0\n")
    target.chmod(0o755)
    link = tmp_path / "bin" / "drums"
    first = _run(tmp_path)
    assert first.returncode == 0 and "linked" in first.stdout, first.stderr
    assert os.readlink(link) == str(target)
    second = _run(tmp_path)
    assert second.returncode == 0 and "present" in second.stdout
    link.unlink()
    link.symlink_to(tmp_path / "old-venv" / "bin" / "drums")  # a stale (dangling) link is replaced
    assert _run(tmp_path).returncode == 0 and os.readlink(link) == str(target)
    link.unlink()
    link.write_text("someone else's drums")
    refused = _run(tmp_path)
    assert refused.returncode == 1 and "not a symbolic link" in refused.stderr
    assert link.read_text() == "someone else's drums"
    assert sorted(p.name for p in link.parent.iterdir()) == ["drums"]  # no temporary link left
