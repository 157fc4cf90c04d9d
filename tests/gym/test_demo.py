"""The demo (``make demo`` runs ``python -m drums_osworld.apps.demo``), end to end, as a user runs it.

It starts its own daemon on its own instance (here a private name and spare slots of this run),
boots and sets up LibreOffice Writer, branches 4 siblings, scores them, writes the contact sheet,
and must leave nothing behind: no session, snapshot, process, mount, link, table or X link of its
instance, and its daemon stopped.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from PIL import Image

from drums_core.client import Client
from drums_core.config import Instance
from drums_core.host.hoststate import instance_leaks

from tests.support.suite import SPARE_SLOTS

REPO = Path(__file__).resolve().parents[2]


def test_demo_end_to_end(drums_instance, tmp_path: Path) -> None:
    # The upper half of this run's spare slots (test_snapshots' fault daemon takes the lower half).
    instance = Instance(name=f"demo-pytest-{os.getpid()}", slot_base=SPARE_SLOTS[8], slot_count=8)
    out = tmp_path / "demo"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRUMS_INSTANCE")}
    try:
        r = subprocess.run([sys.executable, "-m", "drums_osworld.apps.demo", "--out", str(out), "--json",
                            "--instance", instance.name, "--slot-base", str(instance.slot_base),
                            "--slot-count", str(instance.slot_count)],
                           cwd=REPO, env=env, capture_output=True, text=True, timeout=540)
        assert r.returncode == 0, f"stdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-5000:]}"
        result = json.loads(r.stdout)
        said = r.stderr
        for phrase in ("cold boot of a desktop", "the task's setup", "checkpoint", "restore 4 siblings",
                       "cold boot + setup of one desktop", "contact sheet", "drumsd stopped"):
            assert phrase in said, f"the demo did not say {phrase!r}:\n{said}"

        assert result["as_scripted"] and result["scores"] == result["expected"] == [1.0, 0.0, 1.0, 0.0]
        seconds = result["seconds"]
        assert seconds["boot"] > 0 and seconds["setup"] > 0 and seconds["restore_all"] > 0
        assert seconds["demo_total"] < 300, "the demo must finish in a few minutes"

        with Image.open(result["contact_sheet"]) as sheet:
            assert sheet.format == "PNG" and sheet.width >= 1920 and sheet.height >= 1000
        lines = [json.loads(line) for line in Path(result["jsonl"]).read_text().splitlines()]
        finals = [Path(b["screenshots"]["final"]).read_bytes() for b in lines]
        # siblings 0 and 2 end on the same saved document (two ways to type and save it), so their
        # screens may match; the three different outcomes (saved, wrong text, never saved) must not
        assert len({finals[0], finals[1], finals[3]}) == 3, "siblings with different outcomes must differ"

        assert result["cleanup"]["daemon"]["stopped"] and not result["cleanup"]["left_behind"]
        assert Client(instance, autostart=False).daemon_pid() is None
        leaks = instance_leaks(instance)
        assert not any(leaks.values()), f"the demo left {leaks}"
        assert not instance.state_dir.exists()
    finally:
        Client(instance, autostart=False).shutdown(destroy_sessions=True)
        instance.log_file.unlink(missing_ok=True)
