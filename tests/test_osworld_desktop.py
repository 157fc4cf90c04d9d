"""The OSWorld desktop's own services, in real sessions (issue 15).

On every desktop: ``import pyautogui`` prints nothing (the X authority is valid), so OSWorld reads
``vm_platform`` as exactly ``Linux``, fresh and in a restored sibling whose hostname was reseeded.
On the ``osworld`` image: PulseAudio, ``timedatectl``, the GNOME settings, Chromium as
``google-chrome`` with its DevTools port forwarded to 9222 by socat (checkpointed and restored),
VLC's web interface on 8080, a terminal on ctrl+alt+t, and the other applications' windows.
"""
from __future__ import annotations

import time

import pytest
import requests

from drums_osworld.desktop import desktop_spec
from drums_osworld.guest_client import GuestClient

PLATFORM = "import pyautogui, platform; print(platform.system())"


def _guest(session: dict) -> GuestClient:
    return GuestClient(session["address"], 5000, timeout=120.0)


def _destroy(client, sessions) -> None:
    for s in sessions:
        client.destroy(s["id"])


def test_import_pyautogui_prints_nothing_fresh_and_restored(client):
    s = client.create(desktop_spec())
    made = [s]
    try:
        r = _guest(s).execute(["python", "-c", PLATFORM])
        assert (r.output, r.error, r.returncode) == ("Linux\n", "", 0)
        snap = client.checkpoint(s["id"], leave_running=False)
        made = client.restore(snap["id"], count=2)
        names = set()
        for sib in made:
            g = _guest(sib)
            r = g.execute(["python", "-c", PLATFORM])
            assert (r.output, r.error, r.returncode) == ("Linux\n", "", 0)
            names.add(g.execute(["hostname"]).output)
        assert len(names) == 2, names  # the siblings were reseeded, and still need no X warning
    finally:
        _destroy(client, made)
    client.delete_snapshot(snap["id"])
