"""CRIU's kernel-feature cache on a host whose /run is no tmpfs (drums_core.host.criu_cache).

CRIU writes ``/run/criu.kdat`` only on a tmpfs but loads it from anywhere: the daemon makes it once
per boot, kernel and CRIU, and CRIU then skips its probes. Shown with the real CRIU: it loads the
file Drums made; a record of another boot makes the file again; a file Drums did not write is left
alone; ``remove`` (purge) deletes only Drums' own. The host's cache is as it was at the end.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from drums_core import config
from drums_core.host import criu_cache

pytestmark = pytest.mark.timeout(120)


def _criu_loads_it(tmp_path: Path) -> bool:
    log = tmp_path / "check.log"
    subprocess.run([str(config.CRIU_BIN), "check", "-v4", "-o", str(log)], capture_output=True, timeout=60,
                   check=False)
    return f"Loaded kdat cache from {criu_cache.KDAT}" in log.read_text(errors="replace")


def test_the_cache_is_made_once_per_boot_and_only_drums_own_is_touched(tmp_path: Path) -> None:
    if criu_cache.status()["state"] == "tmpfs":
        pytest.fail("this host's /run is a tmpfs: CRIU keeps its own cache (the test needs a disk /run)")
    try:
        first = criu_cache.ensure()
        assert first["state"] in ("made", "kept"), first
        assert criu_cache.ensure()["state"] == "kept"
        assert criu_cache.status() == {"state": "kept"}
        assert _criu_loads_it(tmp_path), "CRIU did not load the cache Drums made"

        # a record of another boot: the cache is made again, for this one
        rec = json.loads(criu_cache.RECORD.read_text())
        criu_cache.RECORD.write_text(json.dumps({**rec, "boot_id": "another-boot"}))
        assert criu_cache.status()["state"] == "stale"
        again = criu_cache.ensure()
        assert again["state"] == "made" and again["boot_id"] == rec["boot_id"], again
        assert _criu_loads_it(tmp_path)

        # a file Drums did not write (no record of it): left alone, by ensure and by remove
        saved = criu_cache.RECORD.read_text()
        criu_cache.RECORD.unlink()
        content = criu_cache.KDAT.read_bytes()
        assert criu_cache.ensure()["state"] == "foreign"
        assert criu_cache.remove() is False and criu_cache.KDAT.read_bytes() == content
        criu_cache.RECORD.write_text(saved)

        # purge's remove: Drums' own file and record go
        assert criu_cache.remove() is True
        assert not criu_cache.KDAT.exists() and not criu_cache.RECORD.exists()
        assert criu_cache.status() == {"state": "absent"}
    finally:
        criu_cache.ensure()  # the host as a daemon start leaves it
    assert criu_cache.status() == {"state": "kept"}
