"""The worker of ``drums bench osworld-tasks``: runs inside OSWorld's interpreter (desktop-env 1.0.2).

    python -m drums_osworld.bench.osworld_tasks_worker '<json>'

For each task and each reuse mode: ``env.reset(task_config=task)`` on an untouched desktop (in
``post_setup`` mode twice: the first reset sets up and saves, the second is served from the saved
state), then ``env.evaluate()`` with no action. Every getter and metric OSWorld resolves is the real
one, wrapped only to record what it did: raised, returned None, logged an error. One JSON line per
(task, mode) on stdout after ``DRUMS-OSWORLD-TASK ``; ``DRUMS-OSWORLD-START `` before each task.

No stand-in replaces a module a benchmarked getter or metric uses: modules that are not installed
get an *absent* module (:mod:`.osworld_reach`) only after the static check found that no
benchmarked task reaches them; touching one raises ``ImportError`` naming it.
"""
from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

TASK_MARK = "DRUMS-OSWORLD-TASK "
START_MARK = "DRUMS-OSWORLD-START "
_TEXT = 400


class TaskTimeout(Exception):
    pass


def _short(v: Any, n: int = _TEXT) -> str:
    s = str(v)
    return s if len(s) <= n else s[: n - 3] + "..."


class _Recorder(logging.Handler):
    """ERROR records of OSWorld's loggers while a getter or metric runs, attributed to it."""

    def __init__(self) -> None:
        super().__init__(level=logging.ERROR)
        self.current: dict | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if self.current is not None and len(self.current["log_errors"]) < 5:
            with contextlib.suppress(Exception):
                self.current["log_errors"].append(_short(f"{record.name}: {record.getMessage()}", 300))


_REC = _Recorder()
_CALLS: list[dict] = []


def _wrap(kind: str, name: str, fn):
    @functools.wraps(fn)
    def recorded(*args: Any, **kwargs: Any):
        call = {"kind": kind, "name": name, "error": None, "none": False, "log_errors": []}
        _CALLS.append(call)
        outer, _REC.current = _REC.current, call
        t0 = time.monotonic()
        try:
            out = fn(*args, **kwargs)
            call["none"] = out is None
            if kind == "metric":
                call["value"] = out if isinstance(out, (int, float, bool)) else _short(out, 80)
            return out
        except TaskTimeout:
            raise
        except BaseException as exc:
            call["error"] = _short(f"{type(exc).__name__}: {exc}")
            call["where"] = _short("".join(traceback.format_tb(exc.__traceback__)[-2:]), 600)
            raise
        finally:
            call["seconds"] = round(time.monotonic() - t0, 3)
            _REC.current = outer

    return recorded


def _instrument() -> None:
    from desktop_env.evaluators import getters, metrics

    for mod, kind, prefix in ((getters, "getter", "get_"), (metrics, "metric", "")):
        for name in dir(mod):
            fn = getattr(mod, name)
            if callable(fn) and name.startswith(prefix) and not name.startswith("_") \
                    and not isinstance(fn, type) and getattr(fn, "__module__", "").startswith("desktop_env"):
                setattr(mod, name, _wrap(kind, name[len(prefix):], fn))
    logging.getLogger().addHandler(_REC)


def _on_alarm(signum, frame):  # noqa: ARG001
    raise TaskTimeout("the task's time budget ran out")


def _report(env: Any) -> dict | None:
    r = getattr(env.provider, "setup_report", None)
    return r.to_json() if r is not None else None


def _one(env: Any, task: dict, mode: str, budget: float, settle: float = 0.0) -> dict:
    from drums_osworld.snapshot import delete_post_setup

    row: dict[str, Any] = {"mode": mode, "resets": []}
    _CALLS.clear()
    signal.alarm(max(1, int(budget)))
    phase = "reset"
    try:
        for _ in range(2 if mode == "post_setup" and task.get("config") else 1):
            t0 = time.monotonic()
            try:
                env.reset(task_config=task)
                err = None
            except TaskTimeout:
                raise
            except Exception as exc:  # noqa: BLE001 - a failed reset is a result
                err = _short(f"{type(exc).__name__}: {exc}", 800)
            timings = dict(getattr(env.provider, "timings", {}))
            row["resets"].append({"seconds": round(time.monotonic() - t0, 3), "error": err,
                                  "from_saved_state": bool(timings.get("from_saved_state")),
                                  "saved_post_setup": "saved_post_setup" in timings,
                                  "setup": _report(env)})
            if err is not None:
                row["reset_error"] = err
                break
        if "reset_error" not in row:
            if settle > 0:  # an agent's first action comes later (OSWorld's harness waits 60 s)
                phase = "settle"
                time.sleep(settle)
            phase = "evaluate"
            t0 = time.monotonic()
            try:
                row["score"] = float(env.evaluate())
            except TaskTimeout:
                raise
            except Exception as exc:  # noqa: BLE001 - an evaluator that raises is a result
                row["evaluate_error"] = _short(f"{type(exc).__name__}: {exc}", 800)
            row["evaluate_seconds"] = round(time.monotonic() - t0, 3)
            post = [r.to_json() for phase_, r in getattr(env.provider, "setup_reports", []) if phase_ == "postconfig"]
            if post:
                row["postconfig"] = post[-1]
    except TaskTimeout as exc:
        row["timeout"] = f"{exc} during {phase} ({budget:.0f} s)"
    finally:
        signal.alarm(0)
        row["calls"] = list(_CALLS)
        if mode == "post_setup":
            with contextlib.suppress(Exception):
                row["deleted_post_setup"] = len(delete_post_setup(task))
    return row


def _new_env(mode: str, image: str, workdir: Path):
    from desktop_env.desktop_env import DesktopEnv

    from drums_osworld.snapshot import set_reuse_mode

    env = DesktopEnv(provider_name="drums", path_to_vm=f"drums://{image}", action_space="pyautogui",
                     require_a11y_tree=False, cache_dir=str(workdir / f"cache-{mode}"))
    set_reuse_mode(env, mode)
    return env


def main(args: dict) -> int:
    from . import osworld_reach

    stand_ins = osworld_reach.install_absent(args.get("absent") or [])
    import drums_osworld

    drums_osworld.register()
    _instrument()
    signal.signal(signal.SIGALRM, _on_alarm)
    workdir = Path.cwd()
    envs: dict[str, Any] = {}
    print(START_MARK + json.dumps({"ready": True, "stand_ins": stand_ins}), flush=True)
    try:
        for item in args["tasks"]:
            task = json.loads(Path(item["path"]).read_text())
            for mode in args["modes"]:
                print(START_MARK + json.dumps({"key": item["key"], "mode": mode}), flush=True)
                t0 = time.monotonic()
                try:
                    if mode not in envs:
                        envs[mode] = _new_env(mode, args["image"], workdir)
                    row = _one(envs[mode], task, mode, float(args["timeout"]), float(args.get("settle") or 0))
                except Exception as exc:  # noqa: BLE001 - the env itself broke: record, start a new one
                    row = {"mode": mode, "reset_error": _short(f"{type(exc).__name__}: {exc}", 800), "resets": [],
                           "env_broke": True}
                if (row.get("timeout") or row.get("env_broke")) and mode in envs:
                    with contextlib.suppress(Exception):
                        envs.pop(mode).close()
                row.update(key=item["key"], seconds=round(time.monotonic() - t0, 3))
                print(TASK_MARK + json.dumps(row, default=str), flush=True)
    finally:
        for env in envs.values():
            with contextlib.suppress(Exception):
                env.close()
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=os.environ.get("DRUMS_BENCH_LOG", "WARNING"), stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if len(sys.argv) != 2:
        sys.exit("usage: python -m drums_osworld.bench.osworld_tasks_worker '<json>'")
    sys.exit(main(json.loads(sys.argv[1])))
