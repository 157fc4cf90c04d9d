"""``images``: the ``osworld`` desktop image against the engine's light ``default`` image, side by side.

For each image, in one run on one daemon instance:

- **size, packages, files, build time**, from the image's manifest (``<store>/<name>/manifest.json``;
  ``du`` of the rootfs when the manifest has no size). The build time is the one the last build
  recorded, not measured here. ``osworld`` is derived from ``default``: its build copies
  ``default``'s tree and installs on top, so its own build time excludes ``default``'s build, and
  its size includes its own full copy of ``default``'s tree (``cp -a``; no reflinks on ext4).
- **cold boot** of an OSWorld desktop (:func:`drums_osworld.desktop.desktop_spec` with the guest
  server): the create call (the daemon returns when the guest's port answers), then the guest
  answering ``GET /screenshot``, then ``libreoffice --writer`` launched through the guest to
  agent-ready (the guest answers, and a window titled ``LibreOffice Writer`` is mapped with more
  than 10% of the pixels non-blank: :func:`common.wait_agent_ready`). A bare desktop's screen is
  uniform (its non-blank share is recorded), so only an application window makes "not blank" hold;
  Writer is in both images.
- **restore of init_state**: one bare desktop per image, checkpointed right after boot as the
  provider's ``init_state`` is (``leave_running=False``), restored each round until the guest
  answers ``GET /screenshot`` (a bare desktop has no window: its screen is blank by construction).
- **restore of the apps state**: one desktop per image with the applications open (below),
  checkpointed (``leave_running=False``), restored each round to agent-ready (Writer mapped, >10%
  non-blank, guest answering).
- **PSS per session** (the sum of ``Pss`` in ``/proc/<pid>/smaps_rollup`` over the session's
  processes, as the memory suite measures it) with the applications open: on ``osworld``
  ``google-chrome --remote-debugging-port=1337`` (with OSWorld's ``socat`` to 9222) and
  ``libreoffice --writer``; on ``default``, which has no Chromium, LibreOffice Writer alone.
  Measured on each cold desktop with Writer alone up (the same application on both images), with
  all the windows up, and after one action (a screenshot and a click through the guest); on each
  restored sibling of the apps state after its restore and after one action; and on each restored
  bare desktop.

Rounds interleave everything: each round runs the three arms in rotated order, and within each
arm both images, the first one alternating. Ratios are osworld/default.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path

from drums_core.errors import DrumsError

from . import common
from ..progress import progress
from .common import BenchInstance, ratio, rotated, summary
from .memory import measure

IMAGES = ("default", "osworld")
ARMS = ("cold", "restore init_state", "restore apps")
WRITER = ["libreoffice", "--writer"]
CHROME = ["google-chrome", "--remote-debugging-port=1337"]  # as OSWorld's Chrome tasks start it
SOCAT = ["socat", "tcp-listen:9222,fork", "tcp:localhost:1337"]
CHROME_TITLE = "Chromium"  # Debian's Chromium behind the google-chrome wrapper: "New Tab - Chromium"
CLICK = (960, 600)
PSS_KEYS = ("pss", "pss_anon", "pss_file", "private")


# ----------------------------------------------------------------------------------- image facts
def _du_bytes(path: Path) -> int | None:
    try:
        out = subprocess.run(["du", "-sxB1", str(path)], capture_output=True, text=True, timeout=600, check=True)
        return int(out.stdout.split()[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def image_facts(name: str) -> dict:
    """What the image's manifest says (and what its rootfs holds of the applications measured)."""
    from drums_core.host import images

    try:
        m = images.check_usable(name)
    except DrumsError as exc:
        raise common.BenchError(f"image {name!r} is not usable: {exc}") from exc
    root = images.rootfs_path(name)
    size, size_from = m.size_bytes, "manifest size_bytes (allocated blocks of the rootfs)"
    if not size:
        size, size_from = _du_bytes(root), "du -sxB1 of the rootfs (the manifest records no size)"
    current = None
    with contextlib.suppress(DrumsError):  # an image without a built-in spec: unknown
        current = images.up_to_date(images.builtin_spec(name)) is not None
    derived = m.base != images.DEBIAN_BASE
    facts = {"name": name, "content": m.content_hash[:12], "base": m.base, "derived": derived,
             "size_bytes": size, "size_from": size_from, "packages": len(m.packages), "files": m.files_count,
             "build_seconds": m.build_seconds, "built_at": m.built_at, "shift_seconds": m.shift_seconds,
             "matches_spec_and_base": current,
             "apps": {"libreoffice": os.path.lexists(root / "usr/bin/libreoffice"),
                      "chromium": os.path.lexists(root / "usr/bin/chromium"),
                      "google-chrome": os.path.lexists(root / "usr/local/bin/google-chrome")}}
    if derived:
        base = images.get(m.base)
        facts["base_built_at"] = base.built_at
        facts["base_rebuilt_since"] = base.built_at > m.built_at
    return facts


# ----------------------------------------------------------------------------------- one desktop
def _pss(client, session: dict) -> dict:
    m = measure(client, [session])
    return {**{k: round(m[k] / 1024, 1) for k in PSS_KEYS}, "processes": m["processes"]}


def _bare_nonblank(session: dict) -> float:
    """Non-blank share of a desktop's screen (no window needed), as the daemon counts it."""
    from Xlib import display as xdisplay

    from drums_core.session import display

    d = xdisplay.Display(f":{common.route(session)}")
    try:
        return round(display.nonblank_fraction_raw(d), 4)
    finally:
        d.close()


def _open_chrome(desk) -> float:
    """Chromium as OSWorld's Chrome tasks start it, until its window is up; seconds."""
    t0 = time.monotonic()
    desk.guest.launch(CHROME)
    desk.guest.launch(SOCAT)
    return common.wait_agent_ready(common.route(desk.session), t0, title=CHROME_TITLE)["seconds"]


def _action(desk, i: int) -> float:
    """One agent action: a screenshot and a click (OSWorld's pyautogui form); seconds."""
    t0 = time.monotonic()
    desk.guest.screenshot()
    r = desk.guest.run_python(f"pyautogui.click({CLICK[0] + 3 * i}, {CLICK[1]})")
    if r.returncode not in (0, None):
        raise common.BenchError(f"the click failed in {desk.id}: {r.error or r.output}")
    return round(time.monotonic() - t0, 4)


def _apps_open(desk, image: str, chrome: bool, settle: float, i: int) -> dict:
    """PSS with Writer up (already open), then with the image's other applications up, and after an action."""
    time.sleep(settle)
    row: dict = {"pss_writer": _pss(desk.client, desk.session)}  # the same application set on both images
    if chrome:
        row["chrome_window_s"] = round(_open_chrome(desk), 4)
        time.sleep(settle)
        row["pss_windows_up"] = _pss(desk.client, desk.session)
    else:
        row["pss_windows_up"] = row["pss_writer"]
    row["action_s"] = _action(desk, i)
    time.sleep(settle)
    row["pss_after_action"] = _pss(desk.client, desk.session)
    return row


def cold(client, image: str, chrome: bool, settle: float, i: int) -> dict:
    from drums_osworld.desktop import Desktop, desktop_spec

    t0 = time.monotonic()
    desk = Desktop(client, client.create(desktop_spec(image=image)))
    try:
        t_create = time.monotonic() - t0
        desk.guest.screenshot()
        t_guest = time.monotonic() - t0
        desk.guest.launch(WRITER)
        ready = common.wait_agent_ready(common.route(desk.session), t0)
        row = {"create": round(t_create, 4), "guest": round(t_guest, 4), "ready": round(ready["seconds"], 4),
               "nonblank": ready["nonblank"],
               "daemon": desk.session.get("timings", {})}
        row.update(_apps_open(desk, image, chrome, settle, i))
        return row
    finally:
        with contextlib.suppress(DrumsError):
            desk.close()


def apps_checkpoint(client, image: str, chrome: bool, settle: float) -> dict:
    """A desktop with the image's applications open, checkpointed (the session is consumed)."""
    from drums_osworld.desktop import Desktop, desktop_spec

    desk = Desktop(client, client.create(desktop_spec(image=image)))
    try:
        t0 = time.monotonic()
        desk.guest.launch(WRITER)
        common.wait_agent_ready(common.route(desk.session), t0)
        if chrome:
            _open_chrome(desk)
        time.sleep(settle)
        return desk.checkpoint(name=f"apps-{image}", leave_running=False)
    finally:
        with contextlib.suppress(DrumsError):
            desk.close()


def init_checkpoint(client, image: str) -> dict:
    """The image's bare desktop, checkpointed right after boot, as the provider makes ``init_state``."""
    from drums_osworld.desktop import Desktop, desktop_spec

    desk = Desktop(client, client.create(desktop_spec(image=image)))
    try:
        return desk.checkpoint(name=f"init_state-{image}", leave_running=False)
    finally:
        with contextlib.suppress(DrumsError):
            desk.close()


def restored(client, snap: dict, apps: bool, settle: float, i: int) -> tuple[dict, list[dict]]:
    """Restore one sibling to agent-ready; then (untimed) its PSS, and with ``apps`` one action and PSS again."""
    from drums_osworld.desktop import Desktop

    t0 = time.monotonic()
    (desk,) = Desktop.restore(client, snap["id"])
    try:
        t_call = time.monotonic() - t0
        row: dict = {"call": round(t_call, 4)}
        if apps:
            ready = common.wait_agent_ready(common.route(desk.session), t0)
            row["nonblank"] = ready["nonblank"]
        desk.guest.screenshot()
        row["ready"] = round(time.monotonic() - t0, 4)
        row["daemon"] = desk.session.get("timings", {})
        if apps:
            time.sleep(settle)
            row["pss_restored"] = _pss(client, desk.session)
            row["action_s"] = _action(desk, i)
            time.sleep(settle)
            row["pss_after_action"] = _pss(client, desk.session)
        else:
            row["nonblank_bare"] = _bare_nonblank(desk.session)
            row["pss_restored"] = _pss(client, desk.session)
        return row, common.liveness(client, [desk.session])
    finally:
        with contextlib.suppress(DrumsError):
            desk.close()


# ----------------------------------------------------------------------------------- the suite
def _snap_facts(instance, snap: dict) -> dict:
    return {"id": snap["id"], "size_mib": round(snap["size"] / 2**20, 1),
            "images_mib": round(common.snapshot_images_bytes(instance, snap["id"]) / 2**20, 1),
            "dump_s": snap.get("dump_seconds"), "processes": len(snap.get("processes") or [])}


def run_images(opts) -> dict:
    rounds = opts.rounds or (1 if opts.quick else 5)
    settle = 1.0 if opts.quick else 3.0
    facts = {name: image_facts(name) for name in IMAGES}
    chrome = {name: bool(facts[name]["apps"]["google-chrome"]) for name in IMAGES}
    if not all(facts[n]["apps"]["libreoffice"] for n in IMAGES):
        raise common.BenchError(f"LibreOffice missing from an image: {[(n, facts[n]['apps']) for n in IMAGES]}")
    rows: dict[str, dict[str, list[dict]]] = {a: {n: [] for n in IMAGES} for a in ARMS}
    failures: list[dict] = []
    live_failures: list[dict] = []
    snaps: dict[str, dict[str, dict]] = {"init_state": {}, "apps": {}}
    with BenchInstance(common.instances(opts)["main"]) as bi:
        c = bi.client
        host = common.host_facts([bi.instance.name])
        bar = progress(2 * len(IMAGES) + rounds * len(ARMS) * len(IMAGES), "images", opts.no_progress)
        made: list[str] = []
        try:
            for name in IMAGES:
                snap = init_checkpoint(c, name)
                made.append(snap["id"])
                snaps["init_state"][name] = _snap_facts(bi.instance, snap)
                bar.update()
            for name in IMAGES:
                snap = apps_checkpoint(c, name, chrome[name], settle)
                made.append(snap["id"])
                snaps["apps"][name] = _snap_facts(bi.instance, snap)
                bar.update()
            for i in range(rounds):
                for arm in rotated(list(ARMS), i):
                    for name in rotated(list(IMAGES), i):
                        try:
                            if arm == "cold":
                                row = cold(c, name, chrome[name], settle, i)
                            else:
                                which = "apps" if arm == "restore apps" else "init_state"
                                row, bad = restored(c, snaps[which][name], which == "apps", settle, i)
                                live_failures += [{"arm": arm, "image": name, "round": i, **b} for b in bad]
                            rows[arm][name].append({"round": i, **row})
                        except (DrumsError, common.BenchError) as exc:
                            failures.append({"arm": arm, "image": name, "round": i, **common.error_record(exc)})
                        bar.update()
                        done = rows["cold"]
                        bar.set_postfix_str(" ".join(f"cold {n}={summary(r['ready'] for r in done[n])['p50']}s"
                                                     for n in IMAGES if done[n]))
        finally:
            bar.close()
            for sid in made:
                with contextlib.suppress(DrumsError):
                    c.delete_snapshot(sid)
        cleanup = bi.stop()
    return _result(opts, rounds, settle, host, facts, chrome, snaps, rows, failures, live_failures, cleanup)


def _stat(rows: list[dict], *path: str) -> dict:
    vals = []
    for r in rows:
        v = r
        for k in path:
            v = v.get(k) if isinstance(v, dict) else None
        if isinstance(v, (int, float)):
            vals.append(float(v))
    return summary(vals)


def _reseed_gaps(rows: list[dict]) -> list[float]:
    """Seconds a restore spent in the daemon's reseed (from the network wired to the guest's hook answering)."""
    out = []
    for r in rows:
        d = r.get("daemon") or {}
        if isinstance(d.get("reseed"), (int, float)) and isinstance(d.get("network"), (int, float)):
            out.append(round(d["reseed"] - d["network"], 4))
    return out


def _result(opts, rounds, settle, host, facts, chrome, snaps, rows, failures, live_failures, cleanup) -> dict:
    d, o = IMAGES
    stats = {arm: {n: {} for n in IMAGES} for arm in ARMS}
    for n in IMAGES:
        cold_rows = rows["cold"][n]
        stats["cold"][n] = {k: _stat(cold_rows, k) for k in ("create", "guest", "ready", "action_s")}
        for when in ("pss_writer", "pss_windows_up", "pss_after_action"):
            for k in PSS_KEYS:
                stats["cold"][n][f"{when}.{k}"] = _stat(cold_rows, when, k)
        for arm in ("restore init_state", "restore apps"):
            rr = rows[arm][n]
            stats[arm][n] = {k: _stat(rr, k) for k in ("call", "ready")}
            for when in ("pss_restored", "pss_after_action"):
                for k in PSS_KEYS:
                    stats[arm][n][f"{when}.{k}"] = _stat(rr, when, k)
            stats[arm][n]["daemon.criu"] = _stat(rr, "daemon", "criu")
            stats[arm][n]["reseed_gap"] = summary(_reseed_gaps(rr))

    def row(figure: str, a, b, digits: int = 3, **extra) -> dict:
        return {"figure": figure, d: a, o: b, f"{o}/{d}": ratio(b, a, digits), **extra}

    def p50(arm: str, key: str) -> tuple:
        return stats[arm][d][key]["p50"], stats[arm][o][key]["p50"]

    gib = {n: round(facts[n]["size_bytes"] / 2**30, 3) if facts[n]["size_bytes"] else None for n in IMAGES}
    apps_label = {n: ("Chromium + Writer" if chrome[n] else "Writer only (no Chromium)") for n in IMAGES}
    n_of = {arm: min(stats[arm][n]["ready"]["n"] for n in IMAGES) for arm in ARMS}
    table = [
        row("image size on disk, GiB", gib[d], gib[o]),
        row("packages", facts[d]["packages"], facts[o]["packages"]),
        row("files", facts[d]["files"], facts[o]["files"]),
        row("recorded build time of the last build, s", facts[d]["build_seconds"], facts[o]["build_seconds"]),
        row("cold: create call (guest port open), p50 s", *p50("cold", "create"), n=n_of["cold"]),
        row("cold: guest answers /screenshot, p50 s", *p50("cold", "guest"), n=n_of["cold"]),
        row("cold: + Writer to agent-ready, p50 s", *p50("cold", "ready"), n=n_of["cold"]),
        row("cold: + Writer to agent-ready, p95 s", stats["cold"][d]["ready"]["p95"],
            stats["cold"][o]["ready"]["p95"], n=n_of["cold"]),
        row("init_state snapshot, MiB", snaps["init_state"].get(d, {}).get("size_mib"),
            snaps["init_state"].get(o, {}).get("size_mib")),
        row("restore init_state to guest answering, p50 s", *p50("restore init_state", "ready"),
            n=n_of["restore init_state"]),
        row("restore init_state to guest answering, p95 s", stats["restore init_state"][d]["ready"]["p95"],
            stats["restore init_state"][o]["ready"]["p95"], n=n_of["restore init_state"]),
        row(f"apps state ({d}: {apps_label[d]}; {o}: {apps_label[o]}) snapshot, MiB",
            snaps["apps"].get(d, {}).get("size_mib"), snaps["apps"].get(o, {}).get("size_mib")),
        row("restore apps state to agent-ready, p50 s", *p50("restore apps", "ready"), n=n_of["restore apps"]),
        row("restore apps state to agent-ready, p95 s", stats["restore apps"][d]["ready"]["p95"],
            stats["restore apps"][o]["ready"]["p95"], n=n_of["restore apps"]),
        row("PSS, restored bare desktop, p50 MiB", *p50("restore init_state", "pss_restored.pss")),
        row("PSS, cold + Writer only (both images), p50 MiB", *p50("cold", "pss_writer.pss")),
        row("PSS anon, cold + Writer only (both images), p50 MiB", *p50("cold", "pss_writer.pss_anon")),
        row("PSS, cold + apps (default: Writer only), windows up, p50 MiB", *p50("cold", "pss_windows_up.pss")),
        row("PSS, cold + apps, after one action, p50 MiB", *p50("cold", "pss_after_action.pss")),
        row("PSS anon, cold + apps, after one action, p50 MiB", *p50("cold", "pss_after_action.pss_anon")),
        row("USS, cold + apps, after one action, p50 MiB", *p50("cold", "pss_after_action.private")),
        row("PSS, restored apps sibling, after restore, p50 MiB", *p50("restore apps", "pss_restored.pss")),
        row("PSS, restored apps sibling, after one action, p50 MiB", *p50("restore apps", "pss_after_action.pss")),
        row("PSS anon, restored apps sibling, after one action, p50 MiB",
            *p50("restore apps", "pss_after_action.pss_anon")),
    ]
    for r in table:
        r.setdefault("n", None)
    derived = facts[o]
    build_note = (f"Build times are the ones the last builds recorded in their manifests, not measured in this "
                  f"run: {d} built {facts[d]['built_at']} in {facts[d]['build_seconds']} s from "
                  f"{facts[d]['base']}; {o} built {derived['built_at']} in {derived['build_seconds']} s "
                  + (f"derived from {derived['base']} (copying its tree, then its own packages and commands): its "
                       f"build time excludes {derived['base']}'s own build, and its size includes its own copy of "
                       f"{derived['base']}'s tree." if derived["derived"] else f"from {derived['base']}."))
    if derived.get("base_rebuilt_since"):
        build_note += (f" {derived['base']} was rebuilt ({derived['base_built_at']}) after {o} was built: {o} "
                       f"was derived from an earlier build of it"
                       + (" and no longer matches its spec and base (a rebuild would make it again)."
                          if derived["matches_spec_and_base"] is False else "."))
    notes = [
        build_note,
        "Cold boot: the create call returns when the guest's port answers; agent-ready adds the guest answering "
        "GET /screenshot and `libreoffice --writer` launched through the guest until a window titled "
        f"'{common.WRITER_TITLE}' is mapped with > {common.READY_FRACTION:.0%} non-blank pixels. A bare desktop's "
        "screen is uniform (largest non-blank share measured on the restored bare desktops: "
        + ", ".join(f"{n} {_stat(rows['restore init_state'][n], 'nonblank_bare')['max']}" for n in IMAGES)
        + "), so 'screenshot not blank' needs an application window; Writer is in both images.",
        "init_state: the bare desktop checkpointed right after boot (leave_running=False), as the OSWorld "
        "provider makes it; restored until the guest answers GET /screenshot (its screen is blank by construction).",
        f"Apps state: {d}: {apps_label[d]}; {o}: {apps_label[o]} (`{' '.join(CHROME)}` plus OSWorld's "
        f"`{' '.join(SOCAT)}`, opened after Writer is up). {d} has no Chromium, so its apps figures are LibreOffice "
        "Writer's alone and their ratios compare different application sets; the 'Writer only' rows (measured on "
        "each cold desktop before Chromium is opened) compare the same application on both images.",
        "PSS: sum of Pss over the session's processes (smaps_rollup), measured after a settle of "
        f"{settle:.0f} s once the windows are up, and again {settle:.0f} s after one action (a guest screenshot and "
        "a pyautogui click). PSS divides shared pages among every process on the host that maps them, other "
        "sessions of the same image included (each image has its own copy of its files, so the two images share "
        "no file pages); PSS anon and USS do not depend on other sessions. A restored sibling's file-backed "
        "pages are faulted in lazily, so its PSS is lower than a cold desktop's until it touches them.",
        f"{rounds} rounds per arm and image (modest: a shared 2-core machine with other helpers' tests running), "
        "interleaved: each round runs the arms in rotated order and both images in each, alternating which "
        "goes first.",
    ]
    summ = {
        "size ratio osworld/default": ratio(facts[o]["size_bytes"], facts[d]["size_bytes"], 2),
        "osworld size over default, GiB": (round((facts[o]["size_bytes"] - facts[d]["size_bytes"]) / 2**30, 3)
                                           if facts[o]["size_bytes"] and facts[d]["size_bytes"] else None),
        "cold to agent-ready p50 s (default, osworld)": list(p50("cold", "ready")),
        "cold to agent-ready ratio": ratio(*reversed(p50("cold", "ready")), 2),
        "restore init_state p50 s (default, osworld)": list(p50("restore init_state", "ready")),
        "restore init_state ratio": ratio(*reversed(p50("restore init_state", "ready")), 2),
        "restore apps state p50 s (default, osworld)": list(p50("restore apps", "ready")),
        "PSS cold + apps after action p50 MiB (default, osworld)": list(p50("cold", "pss_after_action.pss")),
        "PSS cold + apps ratio": ratio(*reversed(p50("cold", "pss_after_action.pss")), 2),
        "PSS restored sibling after action p50 MiB (default, osworld)":
            list(p50("restore apps", "pss_after_action.pss")),
        "PSS cold + Writer only p50 MiB (default, osworld)": list(p50("cold", "pss_writer.pss")),
        "PSS cold + Writer only ratio": ratio(*reversed(p50("cold", "pss_writer.pss")), 2),
        "restores whose reseed call took > 0.9 s": sum(
            1 for arm in ("restore init_state", "restore apps") for n in IMAGES
            for g in _reseed_gaps(rows[arm][n]) if g > 0.9),
        "restores": sum(len(rows[arm][n]) for arm in ("restore init_state", "restore apps") for n in IMAGES),
        "failures": len(failures), "liveness failures": len(live_failures),
        "leaked resources after": cleanup.get("leaked"),
    }
    if summ["restores whose reseed call took > 0.9 s"]:
        notes.append("Some restores spent about 1 s in the daemon's reseed (from the network wired to the guest's "
                     "reseed hook answering: stats.<arm>.<image>.reseed_gap); 1 s is "
                     "the kernel's first retransmission interval (a lost first SYN or ARP request), which such "
                     "restores pay on top of their figures.")
    series = {}
    for arm, key, label in (("cold", "guest", "cold: guest"), ("cold", "ready", "cold: Writer ready"),
                            ("restore init_state", "ready", "restore init_state"),
                            ("restore apps", "ready", "restore apps")):
        for n in IMAGES:
            series[f"{label} ({n})"] = [r[key] for r in rows[arm][n] if key in r]
    return {
        "suite": "images", "quick": opts.quick, "host": host,
        "params": {"rounds": rounds, "settle_s": settle, "images": list(IMAGES), "arms": list(ARMS),
                   "apps": apps_label, "chrome": CHROME, "socat": SOCAT, "writer": WRITER, "click": list(CLICK),
                   "agent_ready": f"guest answers GET /screenshot, and (with Writer) a mapped window titled "
                                  f"'{common.WRITER_TITLE}' with > {common.READY_FRACTION:.0%} non-blank pixels"},
        "images": facts, "snapshots": snaps, "rows": rows, "stats": stats,
        "summary": summ, "failures": failures, "liveness_failures": live_failures, "cleanup": cleanup,
        "table": table, "notes": notes,
        "plot": {"title": "default vs osworld image: cold boot and restores to agent-ready", "ylabel": "seconds",
                 "series": series, "log": True},
    }
