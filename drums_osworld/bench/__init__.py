"""``drums bench <suite>``: the published numbers, reproduced side by side on this machine.

    drums bench branch [--json] [--out DIR] [--quick]
    python -m drums_osworld.bench fanout --quick

Suites (each interleaves its arms in one run, since these machines are noisy and the figure of
merit is a ratio measured side by side; each shows a progress bar on stderr and writes
``<suite>.json``, ``<suite>.md`` and ``<suite>.png`` under ``--out``, default /var/tmp/drums-bench):

=============  ==================================================================================
branch         cold desktop + the Writer task's setup vs restore of its post-setup checkpoint,
               both to agent-ready (window titled LibreOffice Writer, >10% non-blank pixels)
checkpoint     dump time and image size of that desktop, with and without leave-running
memory         PSS per added session over 1..12 sessions: cold, restored, restored + KSM
fanout         1, 4, 8, 16 siblings restored at once: wall time until all are ready and alive
soak           16-way fan-outs until >= 1000 restores: failures (with CRIU's error), leaks after
step           round trip of a gym-like step (pyautogui action + screenshot) and of /screenshot
osworld        per-rollout reset through DesktopEnv(provider_name="drums"): reuse none vs post_setup
osworld-tasks  OSWorld's task set (--tasks DIR) on untouched desktops, reset + evaluate in both reuse
               modes, every task classified (clean, needs app, setup/evaluator error, ...)
profile        where a restore's time goes, phase by phase, inside and outside CRIU
floor          what CRIU's own costs leave: restore with eager vs lazy pages (CPU, PSS), CRIU's
               restore timeline, the 16-way fan-out's CPU floor, a leave-running dump's fixed costs
spill          Writer post-setup restore from the state tmpfs vs spilled to disk (warm, cold)
images         the osworld image against the light default one: size, build time, cold boot, init_state
               restore to agent-ready, PSS per session with Chromium and LibreOffice open
density        osworld desktops (Chromium, GIMP, VLC, Impress open) restored until the host is full:
               desktops held, why it stopped, PSS with and without KSM, inotify and pids per desktop;
               then the others' restores, screenshots and checkpoints with and without a hostile one
restore-costs  CRIU's fixed costs, one lever per arm (the kdat cache: probed vs cached), on both
               images: restore call, CRIU, CPU per restore, leave-running checkpoint
=============  ==================================================================================

``--quick`` shrinks every count for a smoke test. Every suite runs on a daemon instance of its
own (``bench``: slots 300..363; ``--instance`` and ``--slot-base`` choose another), started
fresh and stopped, swept and unmounted afterwards; the JSON says what was left on the host
(``cleanup.leaked``, which must be 0).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from drums_core.records import json_default

SUITES = {
    "branch": ("branch", "run_branch"),
    "checkpoint": ("branch", "run_checkpoint"),
    "memory": ("memory", "run_memory"),
    "fanout": ("fanout", "run_fanout"),
    "soak": ("fanout", "run_soak"),
    "step": ("step", "run_step"),
    "osworld": ("osworld", "run_osworld"),
    "osworld-tasks": ("osworld_tasks", "run_osworld_tasks"),
    "profile": ("profile", "run_profile"),
    "floor": ("floor", "run_floor"),
    "cluster": ("cluster", "run_cluster"),
    "spill": ("spill", "run_spill"),
    "images": ("images", "run_images"),
    "density": ("density", "run_density"),
    "restore-costs": ("restore_costs", "run_restore_costs"),
}

__all__ = ["SUITES", "main", "run_suite"]


def _parser() -> argparse.ArgumentParser:
    from drums_core.cli import UsageParser

    p = UsageParser(prog="drums bench", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("suite", choices=[*SUITES, "all"], help="which suite to run ('all' runs them in turn)")
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    p.add_argument("--out", type=Path, default=None, help="directory for <suite>.json/.md/.png "
                                                          "(default /var/tmp/drums-bench)")
    p.add_argument("--quick", action="store_true", help="small counts: a smoke test, not a measurement")
    p.add_argument("--rounds", type=int, default=None, help="override the suite's repetition count")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--instance", default="bench", help="daemon instance name (default bench; the memory "
                                                       "suite adds <name>-ksm, profile <name>-prof)")
    p.add_argument("--osworld-python", default=None, help="interpreter with desktop-env 1.0.2 for the osworld "
                                                          "suite (default $DRUMS_OSWORLD_PYTHON or "
                                                          "/opt/drums/osworld-venv/bin/python)")
    p.add_argument("--slot-base", type=int, default=300, help="first of the 100 slots the suites may use "
                                                              "(default 300)")
    d = p.add_argument_group("density")
    d.add_argument("--max", type=int, default=None, help="stop filling at N desktops (default: until memory or "
                                                          "a failure stops it; --quick: 3)")
    d.add_argument("--batch", type=int, default=None, help="restores run at once (default 4; --quick: 2)")
    d.add_argument("--reserve-mib", type=float, default=None, help="stop filling when MemAvailable would fall "
                                                                   "under this (default 3072)")
    d.add_argument("--desktop", choices=("openbox", "gnome"), default=None,
                   help="the desktop the applications open on (default openbox; gnome: GNOME Shell)")
    d.add_argument("--hostile-inotify-cap", type=int, default=None,
                   help="the hostile desktop takes at most N inotify instances (default: until refused)")
    d.add_argument("--hostile-pids-cap", type=int, default=None,
                   help="the hostile desktop takes at most N tasks (default: until refused)")
    t = p.add_argument_group("osworld-tasks")
    t.add_argument("--tasks", type=Path, default=None, help="OSWorld's evaluation_examples directory")
    t.add_argument("--image", default=None, help="desktop image (default: the provider's, osworld)")
    t.add_argument("--modes", default=None, help="reuse modes, comma-separated (default none,post_setup)")
    t.add_argument("--domains", default=None, help="only these domains, comma-separated")
    t.add_argument("--limit", type=int, default=None, help="a sample of N tasks, spread over the domains")
    t.add_argument("--only", default=None, help="only these tasks (ids or id prefixes, comma-separated)")
    t.add_argument("--seed", type=int, default=0, help="seed of the --limit sample")
    t.add_argument("--task-timeout", type=float, default=None, help="seconds per task and mode (default 420)")
    t.add_argument("--settle", type=float, default=0.0, help="seconds between reset and evaluate (default 0)")
    t.add_argument("--from-rows", type=Path, default=None, help="report an earlier run's osworld-tasks.json "
                                                                "again (same --tasks/--image/--only), no run")
    t.add_argument("--skip-missing-apps", action="store_true",
                   help="do not run tasks needing an application the image lacks (they are still counted)")
    return p


def run_suite(name: str, opts: argparse.Namespace) -> dict:
    import importlib

    module, func = SUITES[name]
    return getattr(importlib.import_module(f"{__name__}.{module}"), func)(opts)


def main(argv: list[str] | None = None) -> int:
    from . import report
    from . import common
    from .common import DEFAULT_OUT, BenchError

    opts = _parser().parse_args(argv)
    out = opts.out or DEFAULT_OUT
    common.LOG_DIR = Path(out) / "logs"  # each suite's daemon log, moved out of /run/drums when it stops
    names = list(SUITES) if opts.suite == "all" else [opts.suite]
    results = []
    rc = 0
    for name in names:
        try:
            res = run_suite(name, opts)
        except BenchError as exc:
            print(f"drums bench {name}: {exc}", file=sys.stderr)
            rc = 1
            continue
        report.write(res, out)
        results.append(res)
        if res.get("interrupted"):  # a run stopped part way: its report says so, and so does the exit status
            print(f"drums bench {name}: interrupted ({res['interrupted']}); the report has what was measured",
                  file=sys.stderr)
            rc = 1
        if not opts.json:
            print(report.markdown(res))
            print(f"(written: {', '.join(res['files'].values())})\n")
    if opts.json:
        print(json.dumps(results[0] if len(results) == 1 else results, indent=1, default=json_default))
    return rc
