"""``floor``: what CRIU's own costs leave of the 100-millisecond branch on this machine.

One in-process :class:`~drums_core.session.supervisor.Supervisor` (the ``profile`` instance's slots),
one Writer desktop after its task's setup, one post-setup snapshot; then, side by side:

- **restore, eager vs lazy pages**, rounds interleaved (arms take turns going first): the restore
  call to agent-ready, and the CPU the restore cost: CRIU's own (with its helpers, from this
  process's reaped-children counters) plus the restored tasks' (their counters start at zero on
  restore, and the restorer fills their memory in their own context). The lazy arm
  restores with ``lazy_pages`` and a ``criu lazy-pages`` server over the same images: the call
  returns before the memory has arrived. Under the containment of a session (its tasks live in a
  user namespace without ``CAP_SYS_PTRACE`` over the host) the restorer may only open a userfaultfd
  when the host allows unprivileged ones (``vm.unprivileged_userfaultfd = 1``). This suite never
  changes that setting: with it at 0 the lazy arm records CRIU's refusal and stops.
  After a lazy restore the suite waits until the page server has sent everything, takes one
  screenshot (an agent's first action) and then measures PSS, as the issue asks.
- **CRIU's own timeline** of one eager restore at log level 4 (kernel-feature probing, network
  namespace, mounts, tasks), the figures behind the restore floor.
- **fan-out floor**: 16 restores need at least 16 x the CPU of one, spread over this host's CPUs.
- **checkpoint that keeps the desktop running**: ``checkpoint(leave_running=True)`` calls and CRIU's
  dump alone, then one level-4 dump split into the fixed work before the first task, each task's
  fixed part (seize, parasite, files) and its pages, and the namespaces: ``floor without pages`` is
  what a dump that wrote no memory at all would still cost (level 4 logs ~40k lines, so its absolute
  figures are higher than at the engine's level 2; its split is what counts).
"""
from __future__ import annotations

import contextlib
import os
import resource
import subprocess
import time
from pathlib import Path

from . import common, inprocess
from ..progress import progress
from .common import rotated, summary
from .profile import criu_timeline, dump_timeline

LAZY_SYSCTL = Path("/proc/sys/vm/unprivileged_userfaultfd")
FANOUT = 16


def _lazy_allowed() -> bool:
    try:
        return LAZY_SYSCTL.read_text().strip() == "1"
    except OSError:
        return False


class _LazyRestores:
    """While active, the engine's CRIU restores run with ``lazy_pages`` and a page server of their own."""

    def __init__(self, criu_mod) -> None:
        self.criu = criu_mod
        self.orig = criu_mod._call
        self.active = False
        self.servers: list[tuple[subprocess.Popen, float, Path]] = []

    def __enter__(self) -> "_LazyRestores":
        def call(kind, opts, work_dir, timeout, *args, **kwargs):
            if kind == "restore" and self.active:
                self._serve(opts.images_dir, Path(work_dir))
                opts.lazy_pages = True
            return self.orig(kind, opts, work_dir, timeout, *args, **kwargs)

        self.criu._call = call
        return self

    def __exit__(self, *exc: object) -> None:
        self.criu._call = self.orig
        for proc, _, _ in self.servers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    def _serve(self, images_dir: str, work_dir: Path) -> None:
        from drums_core.config import CRIU_BIN

        sock = work_dir / "lazy-pages.socket"
        proc = subprocess.Popen([str(CRIU_BIN), "lazy-pages", "-D", images_dir, "-W", str(work_dir),
                                 "-o", "lazy-pages.log", "-v2"], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.servers.append((proc, time.monotonic(), work_dir))
        deadline = time.monotonic() + 10
        while not sock.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise common.BenchError("criu lazy-pages did not start: " + _tail(work_dir / "lazy-pages.log"))
            time.sleep(0.001)

    def wait_last(self, timeout: float = 60.0) -> float:
        """Seconds from the page server's start until it had sent every page and exited."""
        proc, t0, work_dir = self.servers[-1]
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            proc.kill()
            proc.wait()
            raise common.BenchError("the lazy page server did not finish: "
                                    + _tail(work_dir / "lazy-pages.log")) from exc
        return time.monotonic() - t0


def _tail(path: Path, n: int = 400) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return "(no log)"


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _tasks_cpu(init_pid: int) -> float:
    """CPU seconds the session's processes have used since they were (re)born: a restored task
    starts with zero counters, so right after a restore this is the restore's work done in the tasks
    (the restorer maps and fills their memory)."""
    from drums_core.session.processes import session_processes

    tck = os.sysconf("SC_CLK_TCK")
    total = 0
    for p in session_processes(init_pid):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / tck


def _first_error(exc: BaseException) -> str:
    lines = (getattr(exc, "detail", None) or {}).get("criu_log", []) if isinstance(
        getattr(exc, "detail", None), dict) else []
    return next((ln for ln in lines if "uffd" in ln or "userfaultfd" in ln), str(exc))[:300]


def run_floor(opts) -> dict:
    from drums_core.session import criu

    n = opts.rounds or (2 if opts.quick else 20)
    n_dumps = 2 if opts.quick else 10
    inst = common.instances(opts)["profile"]
    host = {**common.host_facts([inst.name]), "unprivileged_userfaultfd": _lazy_allowed()}
    arms = ["eager", "lazy"]
    rows: dict[str, list[dict]] = {a: [] for a in arms}
    refused: dict[str, str] = {}
    failures: list[dict] = []
    dump_calls: list[float] = []
    dump_criu: list[float] = []
    cleanup: dict = {}
    bar = progress(2 + 2 * n + n_dumps, "floor", opts.no_progress)
    try:
        with inprocess.supervisor(inst, cleanup) as sup, _LazyRestores(criu) as lazy:
            snap = inprocess.writer_snapshot(sup, "floor")
            bar.update()
            for i in range(n):
                for arm in rotated(arms, i):
                    bar.update()
                    if arm not in refused:
                        _restore_arm(sup, snap, arm, lazy, host, rows, refused, failures)
            with inprocess.criu_level4(criu, "restore") as logs:  # CRIU's own timeline of one restore
                [r] = sup.restore(snap.id)
            timeline = criu_timeline(logs[0]) if logs else {}
            # checkpoints that keep the desktop running: at the engine's log level, then one at level 4
            with inprocess.dump_seconds(criu) as seen:
                for i in range(n_dumps):
                    t0 = time.perf_counter()
                    sup.checkpoint(r.id, name=f"floor-lr{i}", leave_running=True)
                    dump_calls.append(time.perf_counter() - t0)
                    bar.update()
            dump_criu.extend(seen)
            with inprocess.criu_level4(criu, "dump") as dump_logs:
                sup.checkpoint(r.id, name="floor-lr-v4", leave_running=True)
            dump_split = dump_timeline(dump_logs[0]) if dump_logs else {}
            sup.destroy(r.id)
            bar.update()
    finally:
        bar.close()
    return _report(opts, host, inst.name, n, rows, refused, failures, timeline, dump_calls, dump_criu,
                   dump_split, cleanup)


def _restore_arm(sup, snap, arm: str, lazy: _LazyRestores, host: dict, rows: dict, refused: dict,
                 failures: list) -> None:
    """One restore of ``arm`` to agent-ready, with its CPU, PSS after one action and liveness."""
    lazy.active = arm == "lazy"
    cpu0 = _children_cpu()
    t0 = time.perf_counter()
    try:
        [r] = sup.restore(snap.id)
    except Exception as exc:  # noqa: BLE001 - a failed restore is a figure of its arm
        if arm == "lazy" and not host["unprivileged_userfaultfd"]:
            refused[arm] = _first_error(exc)
        else:
            failures.append({"arm": arm, "error": common.error_record(exc)})
        return
    finally:
        lazy.active = False
    call = time.perf_counter() - t0
    criu_cpu = _children_cpu() - cpu0  # CRIU and the helpers it ran, reaped by now
    row = {"call": call, "criu_cpu": criu_cpu, "cpu_at_return": criu_cpu + _tasks_cpu(r.init_pid),
           "steps": dict(r.timings.get("steps", {}))}
    if arm == "lazy":
        row["all_pages_in"] = lazy.wait_last()
    common.ready_state(r.display)  # one action: a screenshot
    row["cpu_after_action"] = criu_cpu + _tasks_cpu(r.init_pid)
    row["pss_mib"] = sup.memory(r.id)["pss_kib"] / 1024
    row["liveness"] = str(sup.wait_live(r.id, timeout=30).liveness)
    rows[arm].append(row)
    sup.destroy(r.id)


def _ms(x: float | None) -> float | None:
    return None if x is None else round(x * 1e3, 1)


def _report(opts, host, instance, n, rows, refused, failures, timeline, dump_calls, dump_criu, dump_split,
            cleanup) -> dict:
    stats = {}
    for arm, rs in rows.items():
        stats[arm] = {
            "call_s": summary([r["call"] for r in rs]),
            "criu_s": summary([r["steps"].get("criu", 0.0) for r in rs]),
            "cpu_at_return_s": summary([r["cpu_at_return"] for r in rs if r["cpu_at_return"] is not None]),
            "cpu_after_action_s": summary([r["cpu_after_action"] for r in rs if r["cpu_after_action"] is not None]),
            "pss_mib": summary([r["pss_mib"] for r in rs]),
            "all_pages_in_s": summary([r["all_pages_in"] for r in rs if "all_pages_in" in r]),
            "not_live": sum(1 for r in rs if r["liveness"] != "ok"),
        }
    eager = stats["eager"]
    cpus = os.cpu_count() or 1
    cpu1 = eager["cpu_at_return_s"]["p50"]
    fan_floor = None if cpu1 is None else FANOUT * cpu1 / cpus
    table = []
    for arm in rows:
        st = stats[arm]
        table.append({"arm": f"restore, {arm} pages", "n": st["call_s"]["n"],
                      "call p50 ms": _ms(st["call_s"]["p50"]), "call p95 ms": _ms(st["call_s"]["p95"]),
                      "criu p50 ms": _ms(st["criu_s"]["p50"]), "CPU p50 ms": _ms(st["cpu_at_return_s"]["p50"]),
                      "all pages in p50 ms": _ms(st["all_pages_in_s"]["p50"]),
                      "PSS after one action p50 MiB": None if st["pss_mib"]["p50"] is None
                      else round(st["pss_mib"]["p50"], 1),
                      "refused": refused.get(arm, "")})
    table.append({"arm": "checkpoint(leave_running) call", "n": len(dump_calls),
                  "call p50 ms": _ms(summary(dump_calls)["p50"]), "call p95 ms": _ms(summary(dump_calls)["p95"]),
                  "criu p50 ms": _ms(summary(dump_criu)["p50"])})
    share = None
    if dump_split.get("end"):
        share = round(dump_split["floor without pages"] / dump_split["end"], 3)
    return {
        "suite": "floor", "quick": opts.quick, "host": host,
        "params": {"rounds": n, "instance": instance, "fanout": FANOUT, "in_process_supervisor": True},
        "rows": rows, "stats": stats, "refused": refused, "failures": failures,
        "criu_restore_timeline_ms": timeline, "checkpoint_leave_running_s": summary(dump_calls),
        "criu_dump_s": summary(dump_criu), "criu_dump_split_ms": dump_split, "cleanup": cleanup,
        "summary": {
            "restore call p50 ms (eager)": _ms(eager["call_s"]["p50"]),
            "restore call p50 ms (lazy)": _ms(stats["lazy"]["call_s"]["p50"]),
            "lazy arm refused": refused.get("lazy"),
            "restore CPU p50 ms (eager)": _ms(cpu1),
            f"fan-out floor: {FANOUT} x CPU / {cpus} CPUs, ms": _ms(fan_floor),
            "CRIU restore timeline ms (level 4)": {k: v for k, v in timeline.items() if k != "helper commands"},
            "checkpoint(leave_running) call p50 ms": _ms(summary(dump_calls)["p50"]),
            "criu dump p50 ms": _ms(summary(dump_criu)["p50"]),
            "dump without pages, level 4, ms (before the first task + tasks' fixed parts + namespaces)":
                dump_split.get("floor without pages"),
            "dump share without pages (level 4)": share,
            "restores failed": len(failures),
            "leaked resources after": cleanup.get("leaked"),
        },
        "table": table,
        "plot": {"title": "Restore: eager vs lazy pages", "ylabel": "milliseconds",
                 "series": {f"{arm} call": [r["call"] * 1e3 for r in rs] for arm, rs in rows.items() if rs}},
    }
