"""``osworld-tasks``: OSWorld's task set on untouched Drums desktops, every task classified.

    drums bench osworld-tasks --tasks ../shared/osworld-tasks [--image NAME] [--limit N]
                              [--domains a,b] [--only ID,...] [--modes none,post_setup] [--task-timeout S]
                              [--settle S] [--from-rows OLD.json]

``--settle S`` waits S seconds between reset and evaluate (default 0: evaluated at once, harsher than
OSWorld's harness, which waits 60 s before the agent's first action); ``--from-rows`` classifies and
reports an earlier run's raw rows again.

Which tasks: the committed list (:mod:`drums_osworld.catalog`); those that need the internet (or a
newer desktop-env) are skipped and counted, VS Code's are reported apart (Debian does not package
VS Code; they run only on an image that has ``code``). Each of the others runs through the real
``DesktopEnv(provider_name="drums")`` (desktop-env 1.0.2, in OSWorld's interpreter: see
:mod:`.osworld_tasks_worker`) in each reuse mode: ``reset(task_config=task)`` on an untouched
desktop, then ``evaluate()`` with no action. In ``post_setup`` mode a task is reset twice, the
second reset served from the state the first saved; its evaluation follows the second.

Classes (first that applies):

``timeout``          the task's budget (``--task-timeout``) ran out
``needs app``        the task needs an application the image lacks (from the image manifest)
``setup error``      a setup step failed (the guest's setup log, or ``reset`` raised)
``evaluator error``  ``evaluate`` or a metric raised, or a getter raised, returned None or logged an
                     error (postconfig failures count here too)
``scores untouched`` the untouched desktop scored more than 0
``clean``            every setup step and getter succeeded, the metric raised nothing, score 0

Infeasible tasks (evaluator ``infeasible``) score without any application: they are counted apart
from the feasible ones. Writes ``osworld-tasks.json`` (every row), ``.md`` (per domain and mode:
the classes, reset time p50, resets served from a saved state) and ``.png``. Progress lines go to
stderr. Before running, the worker's interpreter is checked: no stand-in may replace a module that
a benchmarked getter or metric uses (:mod:`.osworld_reach`).
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from . import common
from .osworld import osworld_python

CLASSES = ("clean", "needs app", "setup error", "evaluator error", "scores untouched", "timeout")
MODES = ("none", "post_setup")
DEFAULT_TASK_TIMEOUT = 420.0
_START, _ROW = "DRUMS-OSWORLD-START ", "DRUMS-OSWORLD-TASK "


def _say(opts: Any, text: str) -> None:
    if not getattr(opts, "no_progress", False):
        print(f"[osworld-tasks] {text}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------- selection
def select(opts: Any) -> dict[str, Any]:
    """The tasks to run and the ones skipped, with reasons."""
    from drums_osworld.catalog import image_fit, load_list, read_tasks

    root = Path(opts.tasks).resolve()  # the worker runs in a scratch directory
    found = {f"{d}/{p.stem}": p for d, p, _ in read_tasks(root)}
    entries = load_list()
    domains = set(opts.domains.split(",")) if getattr(opts, "domains", None) else None
    if domains:
        entries = [e for e in entries if e.domain in domains]
    entries = [e for e in entries if e.key in found]
    lacking = image_fit(entries, opts.image)
    internet = [e for e in entries if not e.offline]
    vs_code = [e for e in entries if e.offline and e.vs_code and "vscode" in lacking.get(e.key, {})]
    run = [e for e in entries if e.offline and e not in vs_code]
    if opts.skip_missing_apps:
        run = [e for e in run if e.key not in lacking]
    only = [x for x in (getattr(opts, "only", None) or "").split(",") if x]
    if only:
        run = [e for e in run if any(e.id.startswith(o) or e.key.startswith(o) for o in only)]
    limit = getattr(opts, "limit", None)
    if limit and limit < len(run):  # a sample that keeps every domain: round robin over shuffled domains
        rng = random.Random(getattr(opts, "seed", 0))
        by_dom: dict[str, list] = defaultdict(list)
        for e in run:
            by_dom[e.domain].append(e)
        for v in by_dom.values():
            rng.shuffle(v)
        picked: list = []
        while len(picked) < limit:
            for d in sorted(by_dom):
                if by_dom[d] and len(picked) < limit:
                    picked.append(by_dom[d].pop())
        run = sorted(picked, key=lambda e: e.key)
    return {"run": run, "paths": {e.key: str(found[e.key]) for e in run}, "internet": internet,
            "vs_code": vs_code, "lacking": lacking, "offline": sum(e.offline for e in entries),
            "total": len(entries)}


# ----------------------------------------------------------------------------------- classification
def relevant_lacking(entry: Any, lacking: dict[str, str]) -> dict[str, str]:
    """The missing applications that count for ``entry``: all of them for a feasible task; for an
    infeasible one (scored without any application) only those its setup starts."""
    if not entry.infeasible:
        return lacking
    return {k: v for k, v in lacking.items() if k in entry.apps.get("setup", [])}


def setup_flagged(row: dict) -> bool:
    """Did the setup of this row fail (the guest's setup log, or ``reset`` raised)?"""
    return bool(row.get("reset_error")) or any(
        r.get("setup") and not r["setup"].get("ok") for r in row.get("resets", []))


def getter_failures(calls: list[dict]) -> list[str]:
    out = []
    for c in calls:
        if c.get("kind") != "getter":
            continue
        if c.get("error"):
            out.append(f"getter {c['name']} raised {c['error']}")
        elif c.get("none"):
            why = f" ({c['log_errors'][0]})" if c.get("log_errors") else ""
            out.append(f"getter {c['name']} returned None{why}")
        elif c.get("log_errors"):
            out.append(f"getter {c['name']} logged: {c['log_errors'][0]}")
    return out


def classify(row: dict, lacking: dict[str, str]) -> tuple[str, str]:
    """(class, reason) of one (task, mode) row of the worker."""
    if row.get("timeout"):
        return "timeout", row["timeout"]
    if lacking:
        return "needs app", "the image lacks " + "; ".join(f"{k}: {v}" for k, v in lacking.items())
    bad_setup = [r["setup"] for r in row.get("resets", []) if r.get("setup") and not r["setup"].get("ok")]
    if row.get("reset_error"):
        return "setup error", f"reset raised {row['reset_error']}"
    if bad_setup:
        issues = bad_setup[-1].get("issues") or []
        text = "; ".join(f"step {i['step'] + 1 if i.get('step') is not None else '?'} ({i.get('type')}): "
                         f"{i.get('error')}" for i in issues[:3]) or bad_setup[-1].get("read_error") or "failed"
        return "setup error", text
    if row.get("evaluate_error"):
        return "evaluator error", f"evaluate raised {row['evaluate_error']}"
    metric_errors = [c for c in row.get("calls", []) if c.get("kind") == "metric" and c.get("error")]
    if metric_errors:
        return "evaluator error", f"metric {metric_errors[0]['name']} raised {metric_errors[0]['error']}"
    post = row.get("postconfig")
    if post and not post.get("ok"):
        issues = post.get("issues") or []
        return "evaluator error", "postconfig: " + ("; ".join(i.get("error", "") for i in issues[:2]) or "failed")
    getters = getter_failures(row.get("calls", []))
    if getters:
        return "evaluator error", "; ".join(getters[:2])
    if row.get("score") not in (0, 0.0):
        return "scores untouched", f"score {row.get('score')} with no action"
    return "clean", ""


# ----------------------------------------------------------------------------------- running
def _check_interpreter(py: Path, env: dict, getters: list[str], metrics: list[str]) -> dict:
    probe = subprocess.run([str(py), "-m", "drums_osworld.bench.osworld_reach",
                            json.dumps({"getters": getters, "metrics": metrics})],
                           env=env, capture_output=True, text=True, cwd=tempfile.gettempdir(), timeout=600)
    if probe.returncode != 0:
        raise common.BenchError(f"cannot inspect OSWorld in {py}: {probe.stderr.strip()[-800:]}")
    reach = json.loads(probe.stdout)
    if reach["conflicts"]:
        raise common.BenchError(
            "modules that benchmarked getters or metrics use are not installed in "
            f"{py}: {', '.join(reach['conflicts'])} (used by "
            + "; ".join(f"{m}: {', '.join(reach['reached'][m])}" for m in reach["conflicts"])
            + "); install them: python tests/osworld_harness.py --evaluators")
    return reach


def _worker_env(insts: dict) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
           and k.lower() not in ("http_proxy", "https_proxy", "all_proxy")}
    env["PYTHONPATH"] = str(common.REPO)  # no test stubs: the real evaluator modules only
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    env["PYTHONUNBUFFERED"] = "1"
    main = insts["main"]
    env.update(DRUMS_INSTANCE=main.name, DRUMS_SLOT_BASE=str(main.slot_base), DRUMS_SLOT_COUNT=str(main.slot_count))
    return env


def _run_worker(py: Path, env: dict, todo: list, sel: dict, modes: list[str], opts: Any, absent: list[str],
                rows: list[dict], log_path: Path, t_start: float, total: int) -> dict | None:
    """Run the worker over ``todo`` until it ends; returns the (task, mode) it was on if it died."""
    args = {"tasks": [{"key": e.key, "path": sel["paths"][e.key]} for e in todo], "modes": modes, "image": opts.image,
            "timeout": opts.task_timeout, "absent": absent, "settle": float(getattr(opts, "settle", 0) or 0)}
    current = None
    with tempfile.TemporaryDirectory(prefix="drums-bench-osworld-tasks-") as tmp, open(log_path, "a") as log:
        proc = subprocess.Popen([str(py), "-m", "drums_osworld.bench.osworld_tasks_worker", json.dumps(args)],
                                cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=log, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(_START):
                msg = json.loads(line[len(_START):])
                if "key" in msg:
                    current = msg
            elif line.startswith(_ROW):
                row = json.loads(line[len(_ROW):])
                rows.append(row)
                current = None
                entry = next(e for e in todo if e.key == row["key"])
                kind, why = classify(row, relevant_lacking(entry, sel["lacking"].get(row["key"], {})))
                _say(opts, f"{len(rows)}/{total} {row['key'][:48]} {row['mode']}: {kind}"
                           f"{' (' + why[:100] + ')' if why else ''}, {row.get('seconds', 0):.1f} s "
                           f"[{time.monotonic() - t_start:.0f} s so far]")
        rc = proc.wait()
    if current is not None or rc != 0:
        return current or {"rc": rc}
    return None


def run_osworld_tasks(opts: Any) -> dict:
    py = osworld_python(opts)
    if not py.exists():
        raise common.BenchError(f"osworld-tasks needs an interpreter with desktop-env 1.0.2: {py} is missing")
    if not getattr(opts, "tasks", None):
        raise common.BenchError("osworld-tasks needs --tasks DIR (OSWorld's evaluation_examples layout)")
    from drums_osworld.desktop import DEFAULT_IMAGE

    opts.image = getattr(opts, "image", None) or DEFAULT_IMAGE  # the provider's default image
    opts.task_timeout = float(getattr(opts, "task_timeout", None) or DEFAULT_TASK_TIMEOUT)
    opts.skip_missing_apps = bool(getattr(opts, "skip_missing_apps", False))
    modes = [m for m in (getattr(opts, "modes", None) or ",".join(MODES)).split(",") if m]
    if not set(modes) <= set(MODES):
        raise common.BenchError(f"--modes takes {', '.join(MODES)}")
    if opts.quick and not getattr(opts, "limit", None):
        opts.limit = 3
    try:
        sel = select(opts)
    except (OSError, ValueError) as exc:
        raise common.BenchError(str(exc)) from exc
    run = sel["run"]
    if getattr(opts, "from_rows", None):  # classify and report an earlier run's raw rows again
        prev = json.loads(Path(opts.from_rows).read_text())
        keys = {r["key"] for r in prev["rows"]}
        sel["run"] = [e for e in run if e.key in keys]
        rows = [{k: v for k, v in r.items() if k not in ("class", "reason", "domain", "infeasible")}
                for r in prev["rows"]]
        return _result(opts, sel, rows, list(prev["params"]["modes"]), prev["host"], prev["cleanup"], prev["reach"],
                       float(prev["summary"]["wall time s"]), prev["params"]["python"])
    _say(opts, f"{sel['total']} tasks: {len(sel['internet'])} skipped (need the internet or a newer desktop-env), "
               f"{len(sel['vs_code'])} vs_code reported apart (no VS Code in image {opts.image}), "
               f"{len(run)} to run x {len(modes)} modes on image {opts.image}")
    insts = common.instances(opts)
    env = _worker_env(insts)
    tasks_json = {e.key: json.loads(Path(sel["paths"][e.key]).read_text()) for e in run}
    from drums_osworld.catalog.rules import evaluator_funcs, getter_configs

    getters = sorted({g["type"] for t in tasks_json.values() for g in getter_configs(t)})
    metrics = sorted({f for t in tasks_json.values() for f in evaluator_funcs(t)})
    reach = _check_interpreter(py, env, getters, metrics)
    rows: list[dict] = []
    t_start = time.monotonic()
    out_dir = Path(opts.out or common.DEFAULT_OUT)
    out_dir.mkdir(parents=True, exist_ok=True)
    log_path = out_dir / "osworld-tasks-worker.log"
    log_path.write_text("")
    with common.BenchInstance(insts["main"]) as bi:
        host = common.host_facts([bi.instance.name])
        todo = list(run)
        total = len(run) * len(modes)
        while todo:
            died = _run_worker(py, env, todo, sel, modes, opts, reach["absent"], rows, log_path, t_start, total)
            done_keys = {(r["key"], r["mode"]) for r in rows}
            if died is not None and "key" in died:
                rows.append({"key": died["key"], "mode": died["mode"], "resets": [], "calls": [],
                             "timeout": "the worker died or hung on this task (see osworld-tasks-worker.log)"})
                done_keys.add((died["key"], died["mode"]))
            elif died is not None:
                raise common.BenchError(f"the OSWorld worker exited with {died.get('rc')}: "
                                        f"{log_path.read_text()[-2000:]}")
            todo = [e for e in todo if any((e.key, m) not in done_keys for m in modes)]
        cleanup = bi.stop()
    return _result(opts, sel, rows, modes, host, cleanup, reach, time.monotonic() - t_start, str(py))


# ----------------------------------------------------------------------------------- the report
def _result(opts: Any, sel: dict, rows: list[dict], modes: list[str], host: dict, cleanup: dict, reach: dict,
            wall: float, py: str) -> dict:
    entries = {e.key: e for e in sel["run"]}
    for r in rows:
        e = entries[r["key"]]
        r["domain"], r["infeasible"] = e.domain, e.infeasible
        r["class"], r["reason"] = classify(r, relevant_lacking(e, sel["lacking"].get(r["key"], {})))
        r["setup_flagged"] = setup_flagged(r)
        ok_resets = [x["seconds"] for x in r.get("resets", []) if not x.get("error")]
        r["reset_seconds"] = ok_resets[-1] if ok_resets else None
        r["served_from_saved_state"] = any(x.get("from_saved_state") for x in r.get("resets", []))
    table = []
    stats: dict[str, Any] = {}
    domains = sorted({r["domain"] for r in rows})
    for mode in modes:
        for dom in [*domains, "all"]:
            rs = [r for r in rows if r["mode"] == mode and (dom == "all" or r["domain"] == dom)]
            feas = [r for r in rs if not r["infeasible"]]
            inf = [r for r in rs if r["infeasible"]]
            c = Counter(r["class"] for r in feas)
            resets = [r["reset_seconds"] for r in rs if r["reset_seconds"] is not None]
            st = common.summary(resets)
            row = {"domain": dom, "mode": mode, "run": len(rs), "feasible": len(feas),
                   "clean": c["clean"], "clean %": round(100.0 * c["clean"] / len(feas), 1) if feas else None}
            row.update({k: c[k] for k in CLASSES[1:]})
            row["infeasible clean"] = f"{sum(r['class'] == 'clean' for r in inf)}/{len(inf)}"
            row["setup flagged"] = sum(r["setup_flagged"] for r in rs)
            row["reset p50 s"] = st["p50"]
            row["reset p95 s"] = st["p95"]
            if mode == "post_setup":
                row["from saved state"] = f"{sum(r['served_from_saved_state'] for r in rs)}/{len(rs)}"
            table.append(row)
            stats[f"{mode}/{dom}"] = {"classes": dict(c), "infeasible": dict(Counter(r["class"] for r in inf)),
                                      "reset": st}
    skipped_internet = len(sel["internet"])
    summary = {
        "image": opts.image, "tasks in the set": sel["total"], "offline (committed list)": sel["offline"],
        "skipped: need the internet or a newer desktop-env": skipped_internet,
        "vs_code reported apart": len(sel["vs_code"]), "run": len(sel["run"]),
        "needing an app the image lacks": sum(1 for e in sel["run"] if e.key in sel["lacking"]),
        "wall time s": round(wall, 1), "stand-ins (absent, reached by no benchmarked task)": reach["absent"],
        "leaked resources after": cleanup.get("leaked"),
    }
    for mode in modes:
        a = stats.get(f"{mode}/all", {})
        feas = sum(a.get("classes", {}).values())
        summary[f"{mode}: clean feasible"] = f"{a.get('classes', {}).get('clean', 0)}/{feas}"
    notes = [f"{skipped_internet} tasks skipped: they need the internet or a getter/metric newer than desktop-env "
             "1.0.2 (reasons per task in drums_osworld/catalog/osworld_offline.json)",
             f"{len(sel['vs_code'])} vs_code tasks reported apart: VS Code is not packaged for Debian and image "
             f"{opts.image} has no `code`: " + ", ".join(e.id[:8] for e in sel["vs_code"])]
    series = {}
    for mode in modes:
        for dom in domains:
            rs = [r for r in rows if r["mode"] == mode and r["domain"] == dom]
            series[f"{dom} {mode}"] = {k: sum(1 for r in rs if r["class"] == k) for k in CLASSES}
    return {
        "suite": "osworld-tasks", "quick": bool(opts.quick), "host": host,
        "params": {"tasks": str(opts.tasks), "image": opts.image, "modes": modes, "task_timeout_s": opts.task_timeout,
                   "settle_s": float(getattr(opts, "settle", 0) or 0),
                   "limit": getattr(opts, "limit", None), "domains": getattr(opts, "domains", None),
                   "python": py, "skip_missing_apps": opts.skip_missing_apps,
                   "measured": "reset(task_config) on an untouched desktop, then evaluate() with no action"},
        "rows": sorted(rows, key=lambda r: (r["domain"], r["key"], r["mode"])),
        "vs_code": [{"key": e.key, "class": "vs_code", "reason": "VS Code is not packaged for Debian: "
                     + "; ".join(sel["lacking"].get(e.key, {}).values())} for e in sel["vs_code"]],
        "skipped": [{"key": e.key, "reasons": [x["code"] + ": " + x["reason"] for x in e.exclusions]}
                    for e in sel["internet"]],
        "stats": stats, "reach": reach, "cleanup": cleanup, "summary": summary, "notes": notes, "table": table,
        "plot": {"kind": "stacked", "title": f"OSWorld tasks on untouched desktops (image {opts.image})",
                 "ylabel": "tasks", "series": series, "classes": list(CLASSES)},
    }
