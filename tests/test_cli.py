"""The ``drums`` CLI against the suite's daemon: every command, JSON for scripts, exit codes passed through."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import REPO


def drums(instance, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, DRUMS_INSTANCE=instance.name, DRUMS_SLOT_BASE=str(instance.slot_base),
               DRUMS_SLOT_COUNT=str(instance.slot_count), PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-m", "drums_core.cli", *args], capture_output=True, text=True, env=env,
                         timeout=300)
    if check:
        assert out.returncode == 0, (args, out.stdout, out.stderr)
    return out


def test_cli_round_trip(client, drums_instance, tmp_path):
    up = json.loads(drums(drums_instance, "--json", "up", "--program",
                                 "xterm -xrm '*allowTitleOps: false' -title clitest",
                          "--expect-window", "clitest").stdout)
    sid = up["id"]
    assert up["address"].startswith("169.254.")
    table = drums(drums_instance, "ls").stdout
    assert sid in table and "RUNNING" in table
    ex = drums(drums_instance, "exec", sid, "--user", "user", "--", "sh", "-c", "id -un; exit 7", check=False)
    assert ex.returncode == 7 and ex.stdout.strip() == "user"
    png = tmp_path / "shot.png"
    drums(drums_instance, "screenshot", sid, "-o", str(png))
    assert png.read_bytes()[:4] == b"\x89PNG"
    snap_id = drums(drums_instance, "checkpoint", sid, "--name", "cli-snap").stdout.strip()
    assert len(snap_id) == 32
    sibs = json.loads(drums(drums_instance, "--json", "restore", "cli-snap", "--count", "2").stdout)
    assert len(sibs) == 2
    listing = json.loads(drums(drums_instance, "--json", "snapshots").stdout)
    assert any(s["id"] == snap_id and s["name"] == "cli-snap" for s in listing["snapshots"])
    assert listing["store"]["budget"] > 0 and listing["store"]["used"] >= listing["snapshots"][0]["size"]
    assert "cli-snap" in drums(drums_instance, "snapshots").stdout
    audit = json.loads(drums(drums_instance, "--json", "audit", sibs[0]["id"], sibs[1]["id"]).stdout)
    assert audit["unexpected"] == []
    bad = drums(drums_instance, "--json", "restore", "../etc", check=False)
    assert bad.returncode == 1 and json.loads(bad.stdout)["error"]["code"] == "INVALID_ARGUMENT"
    for s in sibs:
        drums(drums_instance, "destroy", s["id"])
    drums(drums_instance, "delete-snapshot", snap_id)
    assert json.loads(drums(drums_instance, "--json", "ls").stdout) == []
