"""The guest server inside a real session: checkpointed with a connection open, restored twice.

Shows issue 6's in-session items: a checkpoint taken while a client holds an idle connection and
while a request is in flight succeeds; both restored siblings answer /screenshot at once; their
/drums/reseed draws differ; and the host-side round trips over the veth are printed (not asserted).
"""
from __future__ import annotations

import socket
import statistics
import threading
import time

import requests

from drums_osworld.desktop import GUEST_PORT, desktop_spec

from tests.support.wait import wait_until


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_checkpoint_with_open_connection_and_two_siblings(client):
    s = client.create(desktop_spec())
    base = f"http://{s['address']}:{GUEST_PORT}"
    idle = socket.create_connection((s["address"], GUEST_PORT), timeout=5)  # accepted, never used
    slow_result: dict = {}

    def in_flight():
        try:
            slow_result["r"] = requests.post(base + "/execute", json={"command": "sleep 3; echo late", "shell": True},
                                             timeout=30)
        except requests.RequestException as exc:  # the checkpoint ends this session under the request
            slow_result["error"] = exc

    t = threading.Thread(target=in_flight)
    t.start()
    # the checkpoint is to catch the request in flight: its command runs in the session by then
    wait_until(lambda: client.exec(s["id"], ["pgrep", "-f", "sleep 3; echo late"])["returncode"] == 0, 10,
               "the slow request's command to run in the session", every=0.1)
    try:
        snap = client.checkpoint(s["id"])
    finally:
        idle.close()
        t.join()
    assert "error" in slow_result or slow_result["r"].status_code == 200
    a, b = client.restore(snap["id"], count=2)
    try:
        draws = []
        for sib in (a, b):
            url = f"http://{sib['address']}:{GUEST_PORT}"
            r = requests.get(url + "/screenshot", timeout=10)
            assert r.status_code == 200 and _png_size(r.content) == (1920, 1080)
            draws.append(requests.post(url + "/drums/reseed", timeout=10).json()["draw"])
        assert draws[0] != draws[1], draws
        assert a["timings"].get("reseed_draw") != b["timings"].get("reseed_draw")
        # host-side round trips over the veth, printed for the record
        url = f"http://{a['address']}:{GUEST_PORT}"
        shots, execs = [], []
        with requests.Session() as http:
            http.trust_env = False
            for _ in range(20):
                t0 = time.perf_counter()
                http.get(url + "/screenshot", timeout=10).raise_for_status()
                shots.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                http.post(url + "/execute", json={"command": ["true"], "shell": False}, timeout=10).raise_for_status()
                execs.append(time.perf_counter() - t0)
        print(f"\nguest over veth: /screenshot median {statistics.median(shots) * 1000:.1f} ms, "
              f"/execute median {statistics.median(execs) * 1000:.1f} ms (n=20)")
    finally:
        client.destroy(a["id"])
        client.destroy(b["id"])
        client.delete_snapshot(snap["id"])
