"""CRIU's kernel-feature cache on a host whose /run is no tmpfs (drums_core.host.criu_cache).

CRIU writes ``/run/criu.kdat`` only on a tmpfs but loads it from anywhere: the daemon makes it once
per boot, kernel and CRIU, and CRIU then skips its probes. Shown with the real CRIU on the host's
own cache (made or kept, never removed here: other workers' CRIU runs load it): CRIU loads it.
The rest runs on a cache and record of this test's own (the module's paths pointed at a directory
of the test; ``criu check`` still makes the content): a record of another boot makes the file
again; a file Drums did not write is left alone, by ``ensure`` and by ``remove``; ``remove``
(purge) deletes Drums' own file and record.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from drums_core import config
from drums_core.host import criu_cache

pytestmark = pytest.mark.timeout(120)


def test_criu_loads_the_cache_the_daemon_makes(tmp_path: Path) -> None:
    if criu_cache.status()["state"] == "tmpfs":
        pytest.fail("this host's /run is a tmpfs: CRIU keeps its own cache (the test needs a disk /run)")
    first = criu_cache.ensure()
    assert first["state"] in ("made", "kept"), first
    assert criu_cache.ensure()["state"] == "kept"
    assert criu_cache.status() == {"state": "kept"}
    log = tmp_path / "check.log"
    subprocess.run([str(config.CRIU_BIN), "check", "-v4", "-o", str(log)], capture_output=True, timeout=60,
                   check=False)
    assert f"Loaded kdat cache from {criu_cache.KDAT}" in log.read_text(errors="replace")


def test_a_stale_cache_is_made_again_and_only_drums_own_is_removed(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(criu_cache, "RUN", tmp_path)
    monkeypatch.setattr(criu_cache, "KDAT", tmp_path / "criu.kdat")
    monkeypatch.setattr(criu_cache, "RECORD", tmp_path / "state" / "criu-kdat.json")
    monkeypatch.setattr(criu_cache, "_run_is_tmpfs", lambda: False)
    assert criu_cache.status() == {"state": "absent"}
    made = criu_cache.ensure()
    assert made["state"] == "made" and criu_cache.KDAT.stat().st_size > 0, made
    assert criu_cache.ensure()["state"] == "kept"

    # a record of another boot: the cache is made again, for this one
    rec = json.loads(criu_cache.RECORD.read_text())
    criu_cache.RECORD.write_text(json.dumps({**rec, "boot_id": "another-boot"}))
    assert criu_cache.status() == {"state": "stale", "differs": ["boot_id"]}
    again = criu_cache.ensure()
    assert again["state"] == "made" and again["boot_id"] == rec["boot_id"], again

    # a file Drums did not write (no record of it): left alone, by ensure and by remove
    saved = criu_cache.RECORD.read_text()
    criu_cache.RECORD.unlink()
    content = criu_cache.KDAT.read_bytes()
    assert criu_cache.ensure()["state"] == "foreign"
    assert criu_cache.status() == {"state": "foreign"}
    assert criu_cache.remove() is False and criu_cache.KDAT.read_bytes() == content

    # one that was replaced after Drums wrote it: also another's
    criu_cache.RECORD.write_text(saved)
    criu_cache.KDAT.write_bytes(content + b"x")
    assert criu_cache.ensure()["state"] == "foreign"
    criu_cache.KDAT.write_bytes(content)

    # purge's remove: Drums' own file and record go
    assert criu_cache.remove() is True
    assert not criu_cache.KDAT.exists() and not criu_cache.RECORD.exists()
    assert criu_cache.status() == {"state": "absent"}
