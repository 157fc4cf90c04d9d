"""Round-trip benchmark of a running guest server (printed, never asserted).

    python -m drums_osworld.guest.bench --url http://169.254.0.2:5000 -n 30

Measures, from the caller's side, the median and 90th percentile of:

- ``GET /screenshot`` (and the server's own grab/encode split, from its reply headers);
- ``POST /execute`` of ``["true"]`` (the server's command overhead);
- ``POST /execute`` of an OSWorld pyautogui action (``python -c "import pyautogui; ..."``), which
  is what every agent step costs.

Each request opens a new connection, as OSWorld's controllers do (``requests.get``/``post``
without a session); ``--keep-alive`` reuses one.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import requests

PYAUTOGUI = ["python", "-c", "import pyautogui; import time; pyautogui.FAILSAFE = False; "
             "pyautogui.position()"]


def _q(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def bench(url: str, n: int = 30, keep_alive: bool = False, actions: int | None = None) -> dict:
    http = requests.Session() if keep_alive else requests
    out: dict[str, dict] = {}

    def run(name: str, count: int, fn) -> None:
        fn()  # warm-up (first X connection, imports, page cache)
        times, extra = [], []
        for _ in range(count):
            t0 = time.perf_counter()
            r = fn()
            times.append((time.perf_counter() - t0) * 1e3)
            if r.status_code != 200:
                raise SystemExit(f"{name}: HTTP {r.status_code}: {r.text[:300]}")
            if "X-Drums-Grab-Ms" in r.headers:
                extra.append((float(r.headers["X-Drums-Grab-Ms"]),
                              float(r.headers["X-Drums-Encode-Ms"]), len(r.content)))
        res = {"n": count, "median_ms": round(statistics.median(times), 1),
               "p90_ms": round(_q(times, 0.9), 1), "min_ms": round(min(times), 1)}
        if extra:
            res["server_grab_median_ms"] = round(statistics.median(e[0] for e in extra), 1)
            res["server_encode_median_ms"] = round(statistics.median(e[1] for e in extra), 1)
            res["png_bytes_median"] = int(statistics.median(e[2] for e in extra))
        out[name] = res

    run("screenshot", n, lambda: http.get(url + "/screenshot", timeout=30))
    run("execute true", n, lambda: http.post(url + "/execute",
                                             json={"command": ["true"], "shell": False},
                                             timeout=60))
    run("execute pyautogui action", actions or max(5, n // 3),
        lambda: http.post(url + "/execute", json={"command": PYAUTOGUI, "shell": False},
                          timeout=90))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m drums_osworld.guest.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:5000")
    p.add_argument("-n", type=int, default=30, help="requests per measurement")
    p.add_argument("--keep-alive", action="store_true", help="reuse one connection")
    a = p.parse_args(argv)
    res = bench(a.url.rstrip("/"), a.n, a.keep_alive)
    for name, r in res.items():
        line = f"{name:26s} median {r['median_ms']:7.1f} ms  p90 {r['p90_ms']:7.1f} ms  (n={r['n']})"
        if "server_grab_median_ms" in r:
            line += (f"  server: grab {r['server_grab_median_ms']} ms, encode "
                     f"{r['server_encode_median_ms']} ms, {r['png_bytes_median']} bytes")
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
