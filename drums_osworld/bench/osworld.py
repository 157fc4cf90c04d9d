"""``osworld``: per-rollout reset time through OSWorld's own ``DesktopEnv(provider_name="drums")``.

For each task (the Writer task and OSWorld's ``e0df059f``), two ``DesktopEnv``s side by side, one
per reuse mode, reset in alternation (rotated each rollout):

- ``none``: every rollout reverts to ``init_state`` and runs the task's setup;
- ``post_setup``: the first rollout runs the setup and saves ``post_setup:<task id>``; later
  rollouts restore it and skip the setup.

The time measured is ``env.reset(task_config=task)`` as an agent loop sees it: revert, setup (or
not), and OSWorld's first observation. The first reset of each env is a warm-up (the shared
``init_state`` is booted and saved once per host, ``post_setup`` saves its snapshot) and is
reported apart. After each reset the desktop belongs to the rollout (Drums marks it used), so the
next reset must revert.

OSWorld (``desktop-env==1.0.2``) lives in an interpreter of its own: ``--osworld-python`` (or
``DRUMS_OSWORLD_PYTHON``, default ``/opt/drums/osworld-venv/bin/python``); extra import paths for it
(``DRUMS_OSWORLD_PYTHONPATH``) go before the repository. The rollouts run there, in
``python -m drums_osworld.bench.osworld --worker``, which prints one JSON line per reset.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import common
from ..progress import progress

PROTOTYPE = {"full_reset_s": 2.17, "revert_s": 0.82}
MODES = ["none", "post_setup"]
_MARK = "DRUMS-BENCH-ROLLOUT "


def osworld_python(opts=None) -> Path:
    p = getattr(opts, "osworld_python", None) or os.environ.get("DRUMS_OSWORLD_PYTHON") \
        or "/opt/drums/osworld-venv/bin/python"
    return Path(p)


def _worker_env(insts: dict) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
           and k.lower() not in ("http_proxy", "https_proxy", "all_proxy")}
    extra = os.environ.get("DRUMS_OSWORLD_PYTHONPATH")
    env["PYTHONPATH"] = os.pathsep.join([p for p in (extra, str(common.REPO)) if p])
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    env["PYTHONUNBUFFERED"] = "1"
    main = insts["main"]
    env.update(DRUMS_INSTANCE=main.name, DRUMS_SLOT_BASE=str(main.slot_base), DRUMS_SLOT_COUNT=str(main.slot_count))
    return env


def run_osworld(opts) -> dict:
    py = osworld_python(opts)
    insts = common.instances(opts)
    env = _worker_env(insts)
    if not py.exists():
        raise common.BenchError(f"the osworld suite needs an interpreter with desktop-env 1.0.2: {py} is missing "
                                "(--osworld-python or DRUMS_OSWORLD_PYTHON)")
    probe = subprocess.run([str(py), "-c", "import desktop_env.desktop_env, drums_osworld.provider.registration"],
                           env=env, capture_output=True, text=True, cwd=tempfile.gettempdir(), timeout=600)
    if probe.returncode != 0:
        raise common.BenchError("OSWorld or the drums provider does not import in "
                                f"{py}: {probe.stderr.strip()[-800:]}\n(a checkout's light test venv, built by "
                                "`python tests/osworld_harness.py`, needs its stub modules: "
                                f"DRUMS_OSWORLD_PYTHONPATH={py.parent.parent / 'drums-test-stubs'})")
    rollouts = opts.rounds or (2 if opts.quick else 6)
    tasks = [common.WRITER_TASK, common.OS_TASK]
    rows: list[dict] = []
    with common.BenchInstance(insts["main"]) as bi:
        host = common.host_facts([bi.instance.name])
        bar = progress(len(tasks) * len(MODES) * (rollouts + 1), "osworld", opts.no_progress)
        with tempfile.TemporaryDirectory(prefix="drums-bench-osworld-") as tmp:
            args = json.dumps({"tasks": [str(t) for t in tasks], "modes": MODES, "rollouts": rollouts})
            proc = subprocess.Popen([str(py), "-m", "drums_osworld.bench.osworld", "--worker", args], cwd=tmp,
                                    env=env, stdout=subprocess.PIPE, stderr=open(Path(tmp) / "worker.log", "w"),
                                    text=True)
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.startswith(_MARK):
                    rows.append(json.loads(line[len(_MARK):]))
                    bar.update()
            rc = proc.wait()
            log_tail = (Path(tmp) / "worker.log").read_text()[-3000:]
        bar.close()
        cleanup = bi.stop()
    failures = [r for r in rows if r.get("error")]
    if rc != 0 and not rows:
        raise common.BenchError(f"the OSWorld worker exited with {rc}: {log_tail}")
    table = []
    stats = {}
    for task in tasks:
        tid = task.stem
        for mode in MODES:
            vals = [r["reset"] for r in rows if r["task"] == tid and r["mode"] == mode and r["i"] > 0
                    and not r.get("error")]
            first = [r["reset"] for r in rows if r["task"] == tid and r["mode"] == mode and r["i"] == 0
                     and not r.get("error")]
            st = common.summary(vals)
            stats[f"{tid}/{mode}"] = {"steady": st, "first": first}
            table.append({"task": tid, "reuse": mode, "n": st["n"], "reset p50 s": st["p50"], "reset p95 s": st["p95"],
                          "first reset s": first[0] if first else None})
        n50, p50 = stats[f"{tid}/none"]["steady"]["p50"], stats[f"{tid}/post_setup"]["steady"]["p50"]
        table.append({"task": tid, "reuse": "post_setup / none", "reset p50 s": common.ratio(p50, n50, 3)})
    table.append({"task": "prototype", "reuse": "full reset", "reset p50 s": PROTOTYPE["full_reset_s"]})
    table.append({"task": "prototype", "reuse": "revert", "reset p50 s": PROTOTYPE["revert_s"]})
    summ = {}
    for task in tasks:
        tid = task.stem
        n50, p50 = stats[f"{tid}/none"]["steady"]["p50"], stats[f"{tid}/post_setup"]["steady"]["p50"]
        summ[f"{tid} none p50 s"] = n50
        summ[f"{tid} post_setup p50 s"] = p50
        summ[f"{tid} target post_setup <= none/2 and none < 1.5 s"] = bool(
            n50 is not None and p50 is not None and p50 <= n50 / 2 and n50 < 1.5)
    summ.update({"failures": len(failures), "worker exit": rc, "leaked resources after": cleanup.get("leaked")})
    return {
        "suite": "osworld", "quick": opts.quick, "host": host,
        "params": {"rollouts_per_mode": rollouts, "tasks": [t.stem for t in tasks], "modes": MODES,
                   "python": str(py), "measured": "env.reset(task_config=task), first reset of each env apart"},
        "rollouts": rows, "stats": stats, "failures": failures, "worker_log_tail": log_tail if rc else "",
        "cleanup": cleanup, "summary": summ, "references": {"prototype": PROTOTYPE}, "table": table,
        "plot": {"title": "Per-rollout reset through DesktopEnv(provider_name='drums')", "ylabel": "seconds",
                 "series": {f"{t.stem[:18]} {m}": [r["reset"] for r in rows if r["task"] == t.stem
                                                    and r["mode"] == m and r["i"] > 0 and not r.get("error")]
                            for t in tasks for m in MODES}, "log": True},
    }


# ----------------------------------------------------------------------------------- the worker
def _worker(args: dict) -> int:
    """Runs inside OSWorld's interpreter: the two envs of each task, reset in alternation."""
    import drums_osworld

    drums_osworld.register()
    from desktop_env.desktop_env import DesktopEnv

    from drums_osworld.snapshot import delete_post_setup, set_reuse_mode

    for path in args["tasks"]:
        task = json.loads(Path(path).read_text())
        tid = Path(path).stem
        envs = {}
        try:
            for mode in args["modes"]:
                env = DesktopEnv(provider_name="drums", action_space="pyautogui", require_a11y_tree=False,
                                 cache_dir=str(Path.cwd() / f"cache-{mode}"))
                set_reuse_mode(env, mode)
                envs[mode] = env
            for i in range(args["rollouts"] + 1):
                for mode in common.rotated(list(args["modes"]), i):
                    env = envs[mode]
                    row = {"task": tid, "mode": mode, "i": i}
                    t0 = time.monotonic()
                    try:
                        env.reset(task_config=task)
                        row["reset"] = round(time.monotonic() - t0, 4)
                        row["provider"] = {k: (round(v, 4) if isinstance(v, float) else v)
                                           for k, v in getattr(env.provider, "timings", {}).items()}
                    except Exception as exc:  # noqa: BLE001 - a failed rollout is a figure, not the end
                        row.update(reset=round(time.monotonic() - t0, 4), error=f"{type(exc).__name__}: {exc}"[:1500])
                    print(_MARK + json.dumps(row), flush=True)
        finally:
            for env in envs.values():
                try:
                    env.close()
                except Exception as exc:  # noqa: BLE001 - report and go on closing the others
                    print(f"close failed: {exc}", file=sys.stderr)
            try:
                delete_post_setup(task)
            except Exception as exc:  # noqa: BLE001
                print(f"delete_post_setup failed: {exc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        sys.exit(_worker(json.loads(sys.argv[2])))
    sys.exit("usage: python -m drums_osworld.bench.osworld --worker '<json>'")
