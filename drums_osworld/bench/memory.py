"""``memory``: what each added desktop costs, cold against restored, with and without KSM.

Three arms, each trial running all three in rotated order; in each arm Writer desktops (the
Writer task's post-setup state) are added one at a time up to 12, and after each addition (and a
settle pause) the PSS of every process of every one of the arm's sessions is summed. The figure
is the least-squares slope of that sum over the number of sessions: memory per added session.

- ``cold``: cold desktop + the task's setup, each;
- ``restored``: restores of the post-setup checkpoint;
- ``restored+ksm``: the same on a daemon started with ``prctl(PR_SET_MEMORY_MERGE, 1)`` (inherited
  by everything it launches and by every process CRIU forks from its ``criu swrk`` child), with
  ``/sys/kernel/mm/ksm/run=1`` during this arm only. After each addition the arm waits until
  ``ksmd`` has completed two more full scans, so each point is what KSM converges to. ``ksmd``'s
  CPU time over the arm and its steady-state share of a core at 12 sessions are the honest cost.
  KSM's previous settings are put back afterwards (merged pages are unmerged first, ``run=2``).

PSS divides pages shared with *any* process on the host, so other desktops running on the machine
(other daemons) shift the level a little; the slope is what matters. Its anonymous and file-backed
parts and the host's ``MemAvailable`` are recorded next to it as cross-checks (USS is recorded but
is no measure of growth: a file page private to the first desktop becomes shared when a second
desktop maps it).
"""
from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from drums_core.errors import DrumsError

from . import common
from ..progress import progress
from .common import BenchInstance, ratio, rotated, slope, summary

KSM = Path("/sys/kernel/mm/ksm")
KSM_KEYS = ("run", "pages_to_scan", "sleep_millisecs")
PROTOTYPE_MIB_PER_SESSION = 238.5


def _rollup(pid: int) -> dict:
    out = {}
    try:
        for line in open(f"/proc/{pid}/smaps_rollup"):
            parts = line.split()
            if len(parts) >= 2 and parts[0].endswith(":") and parts[1].isdigit():
                out[parts[0][:-1]] = int(parts[1])
    except OSError:
        pass
    return out


def _meminfo(key: str = "MemAvailable") -> int:
    for line in open("/proc/meminfo"):
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def measure(client, sessions: list[dict]) -> dict:
    """Sums over every process of ``sessions`` (KiB)."""
    tot = {"pss": 0, "pss_anon": 0, "pss_file": 0, "private": 0, "processes": 0}
    for s in sessions:
        for p in client.processes(s["id"]):
            r = _rollup(p["pid"])
            tot["pss"] += r.get("Pss", 0)
            tot["pss_anon"] += r.get("Pss_Anon", 0)
            tot["pss_file"] += r.get("Pss_File", 0)
            tot["private"] += r.get("Private_Clean", 0) + r.get("Private_Dirty", 0)
            tot["processes"] += 1
    tot["mem_available"] = _meminfo()
    return tot


# ----------------------------------------------------------------------------------- KSM
def ksm_read(key: str) -> str:
    return (KSM / key).read_text().strip()


def ksm_write(key: str, value) -> None:
    (KSM / key).write_text(f"{value}\n")


def ksmd_pid() -> int | None:
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if open(f"/proc/{name}/comm").read().strip() == "ksmd":
                    return int(name)
            except OSError:
                continue
    return None


def cpu_seconds(pid: int | None) -> float:
    if pid is None:
        return 0.0
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def ksm_lock(path: str = "/run/drums-bench-ksm.lock"):
    """A host-wide lock for the suites that switch KSM on (memory, density): two of them at once
    would each find the other's KSM running, or put settings back under the other."""
    import fcntl

    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def wait_full_scans(n: int, timeout: float) -> bool:
    start = int(ksm_read("full_scans"))
    deadline = time.monotonic() + timeout
    while int(ksm_read("full_scans")) < start + n:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


class KsmArm(contextlib.AbstractContextManager):
    """KSM on (with a faster scan rate) for the arm's duration; the host's settings back afterwards."""

    def __init__(self, saved: dict, pages_to_scan: int, sleep_ms: int) -> None:
        self.saved, self.pages_to_scan, self.sleep_ms = saved, pages_to_scan, sleep_ms

    def __enter__(self):
        ksm_write("pages_to_scan", self.pages_to_scan)
        ksm_write("sleep_millisecs", self.sleep_ms)
        ksm_write("run", 1)
        return self

    def __exit__(self, *exc):
        ksm_write("run", 2)  # unmerge everything this arm merged
        deadline = time.monotonic() + 60
        while int(ksm_read("pages_shared")) and time.monotonic() < deadline:
            time.sleep(0.1)
        for k in KSM_KEYS:
            ksm_write(k, self.saved[k])
        return False


# ----------------------------------------------------------------------------------- the suite
def run_memory(opts) -> dict:
    with ksm_lock():  # the density suite switches KSM too: one at a time
        return _run_memory(opts)


def _run_memory(opts) -> dict:
    trials = opts.rounds or (1 if opts.quick else 3)
    top = 2 if opts.quick else 12
    settle = 0.5 if opts.quick else 1.0
    ksm_timeout = 15.0 if opts.quick else 90.0
    pages_to_scan, sleep_ms = 2000, 20
    arms = ["cold", "restored", "restored+ksm"]
    curves: dict[str, list[list[dict]]] = {a: [] for a in arms}
    ksm_cost: list[dict] = []
    failures: list[dict] = []
    if not KSM.is_dir():
        raise common.BenchError("this kernel has no KSM (/sys/kernel/mm/ksm)")
    saved = {k: ksm_read(k) for k in KSM_KEYS}
    if saved["run"] != "0":
        raise common.BenchError(f"KSM is already running on this host (run={saved['run']}): the cold and "
                                "restored arms would not be what they say")
    insts = common.instances(opts)
    main = BenchInstance(insts["main"])
    ksm_bi = BenchInstance(insts["ksm"], ksm=True)
    try:
        main.start()
        ksm_bi.start()
        host = common.host_facts([main.instance.name, ksm_bi.instance.name])
        steps = trials * len(arms) * top
        bar = progress(2 + steps, "memory", opts.no_progress)
        snap = common.writer_checkpoint(main.client)
        bar.update()
        ksm_snap = common.writer_checkpoint(ksm_bi.client)
        bar.update()
        kpid = ksmd_pid()
        for t in range(trials):
            for arm in rotated(arms, t):
                bi = ksm_bi if arm == "restored+ksm" else main
                c = bi.client
                sessions: list[dict] = []
                points: list[dict] = []
                ctx = KsmArm(saved, pages_to_scan, sleep_ms) if arm == "restored+ksm" else contextlib.nullcontext()
                try:
                    with ctx:
                        cpu0, wall0 = cpu_seconds(kpid), time.monotonic()
                        for k in range(1, top + 1):
                            if arm == "cold":
                                sessions.append(common.boot_writer(c)["session"])
                            else:
                                sid = ksm_snap["id"] if arm == "restored+ksm" else snap["id"]
                                sessions += common.restore_ready(c, sid)["sessions"]
                            time.sleep(settle)
                            converged = None
                            if arm == "restored+ksm":
                                converged = wait_full_scans(2, ksm_timeout)
                            m = measure(c, sessions)
                            m.update(sessions=k, converged=converged)
                            if arm == "restored+ksm":
                                m.update(pages_sharing=int(ksm_read("pages_sharing")),
                                         pages_shared=int(ksm_read("pages_shared")))
                            points.append(m)
                            bar.update()
                        if arm == "restored+ksm":
                            cpu1, wall1 = cpu_seconds(kpid), time.monotonic()
                            time.sleep(2.0 if opts.quick else 5.0)
                            cpu2, wall2 = cpu_seconds(kpid), time.monotonic()
                            ksm_cost.append({"trial": t, "ksmd_cpu_s": round(cpu1 - cpu0, 2),
                                             "arm_wall_s": round(wall1 - wall0, 1),
                                             "ksmd_share_of_core_during_arm": round((cpu1 - cpu0) / (wall1 - wall0), 3),
                                             "ksmd_share_of_core_steady": round((cpu2 - cpu1) / (wall2 - wall1), 3),
                                             "pages_to_scan": pages_to_scan, "sleep_millisecs": sleep_ms})
                        common.destroy_all(c, sessions)
                        sessions = []
                except (DrumsError, common.BenchError) as exc:
                    failures.append({"arm": arm, "trial": t, **common.error_record(exc)})
                finally:
                    common.destroy_all(c, sessions)
                curves[arm].append(points)
        bar.close()
    finally:
        cleanups = {main.instance.name: main.stop(), ksm_bi.instance.name: ksm_bi.stop()}
        with contextlib.suppress(OSError):  # whatever happened, the host's KSM settings go back
            if ksm_read("run") != saved["run"]:
                ksm_write("run", 2 if saved["run"] == "0" else saved["run"])
                time.sleep(0.5)
                for k in KSM_KEYS:
                    ksm_write(k, saved[k])
    slopes: dict[str, dict[str, list[float]]] = {}
    for arm in arms:
        slopes[arm] = {}
        for metric in ("pss", "private", "pss_anon", "pss_file"):
            vals = []
            for pts in curves[arm]:
                if len(pts) >= 2:
                    s = slope([p["sessions"] for p in pts], [p[metric] / 1024 for p in pts])
                    if s is not None:
                        vals.append(round(s, 2))
            slopes[arm][metric] = vals
        mem = []
        for pts in curves[arm]:
            if len(pts) >= 2:
                s = slope([p["sessions"] for p in pts], [-p["mem_available"] / 1024 for p in pts])
                if s is not None:
                    mem.append(round(s, 2))
        slopes[arm]["host_mem_available_drop"] = mem
    mean = {a: summary(slopes[a]["pss"])["mean"] for a in arms}
    table = [{"arm": a, "trials": len(slopes[a]["pss"]), "PSS MiB/session (mean)": mean[a],
              "PSS per trial": slopes[a]["pss"], "PSS anon MiB/session": summary(slopes[a]["pss_anon"])["mean"],
              "PSS file MiB/session": summary(slopes[a]["pss_file"])["mean"],
              "host MemAvailable drop MiB/session": summary(slopes[a]["host_mem_available_drop"])["mean"],
              "vs cold": ratio(mean[a], mean["cold"], 3)} for a in arms]
    table.append({"arm": "prototype (cold and restored)", "PSS MiB/session (mean)": PROTOTYPE_MIB_PER_SESSION})
    within = None
    if mean["cold"] and mean["restored"]:
        within = round(abs(mean["restored"] - mean["cold"]) / mean["cold"], 4)
    saving = None
    if mean["restored"] and mean["restored+ksm"] is not None:
        saving = round(1 - mean["restored+ksm"] / mean["restored"], 4)
    return {
        "suite": "memory", "quick": opts.quick, "host": host,
        "params": {"trials": trials, "sessions": top, "settle_s": settle, "arms": arms,
                   "ksm": {"pages_to_scan": pages_to_scan, "sleep_millisecs": sleep_ms,
                           "wait": "2 full scans after each addition", "host_settings_before": saved}},
        "curves": curves, "slopes_mib_per_session": slopes, "ksm_cost": ksm_cost,
        "summary": {"cold PSS MiB/session": mean["cold"], "restored PSS MiB/session": mean["restored"],
                    "restored+ksm PSS MiB/session": mean["restored+ksm"],
                    "restored vs cold (relative difference)": within,
                    "target restored within 5% of cold": bool(within is not None and within <= 0.05),
                    "KSM saving vs restored": saving,
                    "ksmd share of a core, during arm (mean)": summary(
                        [k["ksmd_share_of_core_during_arm"] for k in ksm_cost])["mean"],
                    "ksmd share of a core, steady at max sessions (mean)": summary(
                        [k["ksmd_share_of_core_steady"] for k in ksm_cost])["mean"],
                    "failures": len(failures),
                    "leaked resources after": sum(c.get("leaked") or 0 for c in cleanups.values())},
        "failures": failures, "cleanup": cleanups,
        "table": table,
        "plot": {"title": "Memory of n Writer desktops (sum of PSS)", "ylabel": "MiB", "kind": "line",
                 "xlabel": "sessions",
                 "series": {f"{a} #{i + 1}": [p["pss"] / 1024 for p in pts]
                            for a in arms for i, pts in enumerate(curves[a])},
                 "x": {f"{a} #{i + 1}": [p["sessions"] for p in pts] for a in arms for i, pts in enumerate(curves[a])}},
    }
