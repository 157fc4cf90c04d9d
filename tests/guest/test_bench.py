"""Runs the round-trip benchmark against the test server and prints it (nothing is asserted
about the numbers). A full-screen xterm full of text makes the screenshot a realistic one."""
from __future__ import annotations

import subprocess
import sys

from tests.support.guestlib import REPO


def test_bench_prints_round_trips(guest):
    guest.post("/setup/launch", json={
        "command": ["xterm", "-xrm", "*allowTitleOps: false", "-title", "bench text", "-geometry", "236x75+0+0", "-e",
                    "bash", "-c", "ls -lR /usr/lib/python3* | head -2000; sleep 120"]})
    guest.wait_window("bench text")
    r = subprocess.run([sys.executable, "-m", "drums_osworld.guest.bench", "--url", guest.url,
                        "-n", "20"], capture_output=True, text=True, cwd=str(REPO), timeout=600)
    print("\n" + r.stdout)
    assert r.returncode == 0, r.stderr
    assert "screenshot" in r.stdout and "execute pyautogui action" in r.stdout
    guest.post("/setup/close_window", json={"window_name": "bench text"})
    guest.wait_window("bench text", present=False)
