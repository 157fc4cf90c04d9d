"""``step``: what one agent step costs on a Drums desktop, excluding the step's pause.

On a Writer desktop restored from the task's post-setup checkpoint, interleaved request by
request (each arm in turn, rotated each round), every request on a new connection as OSWorld's
``PythonController`` makes them:

- ``screenshot``: ``GET /screenshot`` (the server's grab and PNG-encode split from its headers);
- ``execute true``: ``POST /execute`` of ``["true"]`` (the server's command overhead);
- ``action``: ``POST /execute`` of an OSWorld pyautogui action (``python -c "import pyautogui; ...
  pyautogui.moveTo(x, y)"``);
- ``step``: ``DesktopEnv.step`` for the ``pyautogui`` action space without its ``pause``: the
  action, then the observation (screenshot);
- ``step+a11y``: the same with the accessibility tree (``require_a11y_tree=True``, OSWorld's default);
- ``daemon screenshot``: the daemon's own screenshot over its unix socket (no guest involved).
"""
from __future__ import annotations

import json
import time

import requests

from drums_core.errors import DrumsError

from . import common
from ..progress import progress
from .common import BenchInstance, rotated, summary

PREFIX = "import pyautogui; import time; pyautogui.FAILSAFE = False; "


def _post_execute(base: str, command: list[str]) -> requests.Response:
    r = requests.post(base + "/execute", headers={"Content-Type": "application/json"},
                      data=json.dumps({"command": command, "shell": False}), timeout=90)
    r.raise_for_status()
    return r


def _screenshot(base: str) -> requests.Response:
    r = requests.get(base + "/screenshot", timeout=30)
    r.raise_for_status()
    if r.content[:8] != b"\x89PNG\r\n\x1a\n":
        raise common.BenchError(f"/screenshot returned {len(r.content)} bytes that are not PNG")
    return r


def _a11y(base: str) -> requests.Response:
    r = requests.get(base + "/accessibility", timeout=60)
    r.raise_for_status()
    return r


def run_step(opts) -> dict:
    n = opts.rounds or (3 if opts.quick else 30)
    arms = ["screenshot", "execute true", "action", "step", "step+a11y", "daemon screenshot"]
    samples: dict[str, list[float]] = {a: [] for a in arms}
    server_split: list[tuple[float, float, int]] = []
    failures: list[dict] = []
    with BenchInstance(common.instances(opts)["main"]) as bi:
        c = bi.client
        host = common.host_facts([bi.instance.name])
        bar = progress(1 + n * len(arms), "step", opts.no_progress)
        snap = common.writer_checkpoint(c)
        r = common.restore_ready(c, snap["id"])
        sess = r["sessions"][0]
        base = f"http://{sess['address']}:5000"
        bar.update()
        _screenshot(base)  # warm-up: the guest's first X connection and imports
        _post_execute(base, ["python", "-c", PREFIX + "pyautogui.position()"])
        _a11y(base)
        for i in range(n):
            x, y = 300 + 7 * (i % 50), 400 + 5 * (i % 40)
            action = ["python", "-c", PREFIX + f"pyautogui.moveTo({x}, {y})"]
            for arm in rotated(arms, i):
                try:
                    t0 = time.perf_counter()
                    if arm == "screenshot":
                        resp = _screenshot(base)
                        dt = time.perf_counter() - t0
                        if "X-Drums-Grab-Ms" in resp.headers:
                            server_split.append((float(resp.headers["X-Drums-Grab-Ms"]),
                                                 float(resp.headers["X-Drums-Encode-Ms"]), len(resp.content)))
                    elif arm == "execute true":
                        _post_execute(base, ["true"])
                        dt = time.perf_counter() - t0
                    elif arm == "action":
                        _post_execute(base, action)
                        dt = time.perf_counter() - t0
                    elif arm == "step":
                        _post_execute(base, action)
                        _screenshot(base)
                        dt = time.perf_counter() - t0
                    elif arm == "step+a11y":
                        _post_execute(base, action)
                        _screenshot(base)
                        _a11y(base)
                        dt = time.perf_counter() - t0
                    else:
                        c.screenshot(sess["id"])
                        dt = time.perf_counter() - t0
                    samples[arm].append(dt)
                except (requests.RequestException, DrumsError, common.BenchError) as exc:
                    failures.append({"arm": arm, "i": i, "type": type(exc).__name__, "message": str(exc)[:500]})
                bar.update()
        bar.close()
        common.destroy_all(c, r["sessions"])
        cleanup = bi.stop()
    stats = {a: summary(v) for a, v in samples.items()}
    ms = {a: {k: (round(v * 1e3, 1) if isinstance(v, float) and k != "n" else v) for k, v in st.items()}
          for a, st in stats.items()}
    split = {}
    if server_split:
        split = {"server grab ms p50": summary([s[0] for s in server_split])["p50"],
                 "server encode ms p50": summary([s[1] for s in server_split])["p50"],
                 "png bytes p50": summary([s[2] for s in server_split])["p50"]}
    table = [{"arm": a, "n": ms[a]["n"], "p50 ms": ms[a]["p50"], "p95 ms": ms[a]["p95"], "mean ms": ms[a]["mean"],
              "min ms": ms[a]["min"]} for a in arms]
    return {
        "suite": "step", "quick": opts.quick, "host": host,
        "params": {"n": n, "arms": arms, "action": "pyautogui.moveTo(x, y) through POST /execute",
                   "connections": "a new connection per request, as OSWorld's PythonController"},
        "stats_ms": ms, "server_screenshot": split, "failures": failures, "cleanup": cleanup,
        "summary": {"step p50 ms": ms["step"]["p50"], "step+a11y p50 ms": ms["step+a11y"]["p50"],
                    "screenshot p50 ms": ms["screenshot"]["p50"], "action p50 ms": ms["action"]["p50"],
                    **split, "failures": len(failures), "leaked resources after": cleanup.get("leaked")},
        "table": table,
        "plot": {"title": "One agent step on a Drums desktop (pause excluded)", "ylabel": "milliseconds",
                 "series": {a: [x * 1e3 for x in samples[a]] for a in arms}, "log": True},
    }
