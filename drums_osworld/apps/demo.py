"""The demo (``make demo``): one task set up once, branched into sibling desktops that diverge.

    python -m drums_osworld.apps.demo [--out DIR] [--siblings N] [--task writer|rename] [--json]

1. boots a desktop (Xvfb, openbox, the guest server) through the gymnasium env and runs the task's
   setup on it (for the Writer task: LibreOffice Writer starts with an empty document);
2. checkpoints it (the desktop keeps running);
3. restores N sibling desktops of that checkpoint at once;
4. drives each sibling with a different scripted action sequence, scores each with the task's
   evaluator (:mod:`drums_osworld.apps.rollouts`), and prints what it did with the timings: cold boot +
   setup against restore;
5. writes a contact sheet of the siblings' final screens (``DIR/contact-sheet.png``) next to the
   rollouts' JSON lines and screenshots;
6. cleans up: every session destroyed, the snapshot deleted, and the daemon stopped (its state
   unmounted) when the demo started it. It uses its own Drums instance (``demo``) so it never
   touches another daemon's sessions.

Needs root, like all of Drums. Exit status 0 when the siblings scored as scripted.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drums_core.config import Instance, check_name
from drums_core.errors import DrumsError, Unavailable
from drums_core.records import json_default

from ..tasks import find_task, load_task

WRITER_TASK = "drums-writer-type-and-save"
RENAME_TASK = "e0df059f-28a6-4169-924f-b9623e7184cc"

_WAIT_FOR_WRITER = (
    "import subprocess\n"
    "for _ in range(60):\n"
    "    if 'LibreOffice Writer' in subprocess.run(['wmctrl', '-l'], capture_output=True, text=True).stdout:\n"
    "        break\n"
    "    time.sleep(1)\n"
    "subprocess.run(['wmctrl', '-a', 'LibreOffice Writer']); time.sleep(0.5)")
_SAVE_AS = ("pyautogui.hotkey('ctrl', 'shift', 's'); time.sleep(3)",
            "import os; pyautogui.hotkey('ctrl', 'a'); pyautogui.write(os.path.expanduser('~/Documents/{name}'), "
            "interval=0.02); time.sleep(0.5); pyautogui.press('enter'); time.sleep(3)")


@dataclass
class Sibling:
    """One sibling's script: what it does, in words and as actions, and the score it should get."""

    name: str
    what: str
    actions: list[str]
    expected: float


def writer_siblings() -> list[Sibling]:
    def type_(text: str) -> str:
        return f"pyautogui.write({text!r}, interval=0.03); time.sleep(0.5)"

    save_as = [_SAVE_AS[0], _SAVE_AS[1].replace("{name}", "drums_note.odt")]
    return [
        Sibling("right-text-save-as", "types 'Drums was here', saves as ~/Documents/drums_note.odt",
                [_WAIT_FOR_WRITER, type_("Drums was here"), *save_as, "DONE"], 1.0),
        Sibling("wrong-text", "types 'Drums were here', saves as ~/Documents/drums_note.odt",
                [_WAIT_FOR_WRITER, type_("Drums were here"), *save_as, "DONE"], 0.0),
        Sibling("right-text-ctrl-s", "types 'Drums was' + ' here', saves with Ctrl+S",
                [_WAIT_FOR_WRITER, type_("Drums was"), type_(" here"),
                 "pyautogui.hotkey('ctrl', 's'); time.sleep(3)", save_as[1], "DONE"], 1.0),
        Sibling("never-saves", "types 'Drums was here' and never saves",
                [_WAIT_FOR_WRITER, type_("Drums was here"), "DONE"], 0.0),
    ]


def rename_siblings() -> list[Sibling]:
    def mv(dst: str) -> str:
        return f"import subprocess; subprocess.run('mv ~/Desktop/todo_list_Jan_1 ~/Desktop/{dst}', shell=True)"

    return [
        Sibling("rename-jan-2", "renames the folder to todo_list_Jan_2", [mv("todo_list_Jan_2"), "DONE"], 1.0),
        Sibling("rename-jan-3", "renames the folder to todo_list_Jan_3", [mv("todo_list_Jan_3"), "DONE"], 0.0),
        Sibling("copy-jan-2", "copies it to todo_list_Jan_2",
                ["import subprocess; subprocess.run('cp -r ~/Desktop/todo_list_Jan_1 ~/Desktop/todo_list_Jan_2', "
                 "shell=True)", "DONE"], 1.0),
        Sibling("gives-up", "declares the task infeasible", ["FAIL"], 0.0),
    ]


def _siblings(kind: str, n: int) -> list[Sibling]:
    base = writer_siblings() if kind == "writer" else rename_siblings()
    return [base[i % len(base)] if i < len(base) else
            Sibling(f"{base[i % len(base)].name}-{i}", base[i % len(base)].what, base[i % len(base)].actions,
                    base[i % len(base)].expected) for i in range(n)]


# --------------------------------------------------------------------------- contact sheet
def _font(size: int) -> Any:
    from PIL import ImageFont

    for path in ("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
                 "/usr/share/fonts/truetype/dejavu/DejaVuSans-Bold.ttf"):
        if os.path.exists(path):
            return ImageFont.truetype(path, size)
    return ImageFont.load_default(size=size)


def divergence_box(images: list[Any], reference: Any = None, cells: int = 8) -> tuple[int, int, int, int] | None:
    """The region (left, top, right, bottom) where same-sized screens differ, or ``None``.

    A pixel counts when it differs between the screens or from ``reference`` (their common start).
    The screen is cut into ``cells`` x ``cells`` blocks; the region covers the busiest block and the
    blocks next to it (transitively) with at least a quarter of its count, half a block around them,
    widened to the screen's shape.
    """
    import numpy as np

    arrays = [np.asarray(im, dtype=np.int16) for im in [*images, reference] if im is not None]
    if len(arrays) < 2 or any(a.shape != arrays[0].shape for a in arrays):
        return None
    stack = np.stack(arrays)
    differs = (stack.max(axis=0) - stack.min(axis=0)).max(axis=-1) > 24
    h, w = differs.shape
    ch, cw = h // cells, w // cells
    counts = differs[: ch * cells, : cw * cells].reshape(cells, ch, cells, cw).sum(axis=(1, 3))
    if counts.max() == 0:
        return None
    busy = counts >= counts.max() / 4
    start = tuple(int(v) for v in np.unravel_index(int(counts.argmax()), counts.shape))
    cluster, todo = {start}, [start]
    while todo:  # the busy blocks connected to the busiest one
        r, c = todo.pop()
        for nr in range(max(0, r - 1), min(cells, r + 2)):
            for nc in range(max(0, c - 1), min(cells, c + 2)):
                if busy[nr, nc] and (nr, nc) not in cluster:
                    cluster.add((nr, nc))
                    todo.append((nr, nc))
    rows, cols = np.array([p[0] for p in cluster]), np.array([p[1] for p in cluster])
    left, right = cols.min() * cw - cw // 2, (cols.max() + 1) * cw + cw // 2
    top, bottom = rows.min() * ch - ch // 2, (rows.max() + 1) * ch + ch // 2
    bw, bh = right - left, bottom - top
    if bw * h > bh * w:   # widen the short side to the screen's aspect ratio
        grow = bw * h // w - bh
        top, bottom = top - grow // 2, bottom + grow - grow // 2
    else:
        grow = bh * w // h - bw
        left, right = left - grow // 2, right + grow - grow // 2
    dx = -left if left < 0 else min(0, w - right)
    dy = -top if top < 0 else min(0, h - bottom)
    left, right, top, bottom = max(0, left + dx), min(w, right + dx), max(0, top + dy), min(h, bottom + dy)
    if (right - left) * (bottom - top) > 0.6 * w * h:
        return None   # the screens differ nearly everywhere: a zoom would show nothing more
    return int(left), int(top), int(right), int(bottom)


def contact_sheet(tiles: list[tuple[bytes | str | Path | None, list[str], float | None]], header: list[str],
                  path: str | Path, tile_width: int = 960, columns: int = 2, zoom: bool = True,
                  reference: bytes | str | Path | None = None) -> Path:
    """A PNG grid of screenshots, each with caption lines and a border coloured by its score.

    With ``zoom``, each tile also shows, magnified in its lower right corner, the region where the
    screens differ from each other and from ``reference`` (the same region on every tile).
    """
    import io

    from PIL import Image, ImageDraw

    def load(source: bytes | str | Path | None) -> Any:
        if source is None:
            return None
        data = source if isinstance(source, bytes) else Path(source).read_bytes()
        with Image.open(io.BytesIO(data)) as img:
            return img.convert("RGB")

    images = [load(source) for source, _, _ in tiles]
    ratio = next((im.height / im.width for im in images if im is not None), 9 / 16)
    tile_h = int(tile_width * ratio)
    pad, border, caption_h, line_h = 16, 6, 64, 28
    columns = max(1, min(columns, len(tiles)))
    rows = (len(tiles) + columns - 1) // columns
    header_h = pad + line_h * len(header) + pad
    width = pad + columns * (tile_width + 2 * border + pad)
    height = header_h + rows * (tile_h + 2 * border + caption_h + pad) + pad
    sheet = Image.new("RGB", (width, height), (32, 34, 38))
    draw = ImageDraw.Draw(sheet)
    big, small = _font(22), _font(18)
    box = divergence_box(images, load(reference)) if zoom else None
    for i, line in enumerate(header):
        draw.text((pad, pad + i * line_h), line, fill=(235, 235, 235), font=big if i == 0 else small)
    for k, ((_, caption, score), im) in enumerate(zip(tiles, images, strict=True)):
        r, c = divmod(k, columns)
        x = pad + c * (tile_width + 2 * border + pad)
        y = header_h + r * (tile_h + 2 * border + caption_h + pad)
        colour = (60, 60, 60) if score is None else ((46, 160, 67) if score >= 1.0 else (200, 55, 55))
        draw.rectangle([x, y, x + tile_width + 2 * border - 1, y + tile_h + 2 * border - 1], fill=colour)
        if im is not None:
            sheet.paste(im.resize((tile_width, tile_h), Image.LANCZOS), (x + border, y + border))
            if box is not None:
                iw = tile_width // 2
                ih = int(iw * (box[3] - box[1]) / (box[2] - box[0]))
                inset = im.crop(box).resize((iw, ih), Image.LANCZOS)
                ix, iy = x + border + tile_width - iw - 8, y + border + tile_h - ih - 8
                draw.rectangle([ix - 3, iy - 3, ix + iw + 2, iy + ih + 2], fill=colour)
                sheet.paste(inset, (ix, iy))
        for j, line in enumerate(caption[:2]):
            draw.text((x, y + tile_h + 2 * border + 6 + j * 26), line, fill=(235, 235, 235),
                      font=big if j == 0 else small)
    out = Path(path)
    sheet.save(out, optimize=True)
    return out


# --------------------------------------------------------------------------- daemon
class _Daemon:
    """The demo's drumsd: used if running, else started here and stopped (and its state unmounted) at the end."""

    def __init__(self, instance: Instance) -> None:
        from drums_core.client import Client

        self.instance = instance
        self.client = Client(instance)
        self.started = False
        try:
            Client(instance, autostart=False).ping()
        except Unavailable:
            self.client.start_daemon()
            self.started = True

    def stop(self) -> dict[str, Any]:
        if not self.started:
            return {"stopped": False}
        from drums_core.sweep import sweep_instance

        self.client.shutdown(destroy_sessions=True)
        unmounted = sweep_instance(self.instance)["unmounted"]
        return {"stopped": True, "unmounted": unmounted, "log": str(self.instance.log_file)}


def _leftovers(client: Any, sessions: list[str], state: str | None) -> list[str]:
    """What the demo made that still exists: its sessions and its snapshot."""
    from drums_core.errors import NotFound

    alive = {s["id"] for s in client.list()}
    left = [f"session {sid}" for sid in sessions if sid in alive]
    if state is not None:
        try:
            client.snapshot(state)
            left.append(f"snapshot {state}")
        except NotFound:
            pass
    return left


# --------------------------------------------------------------------------- the demo
def run_demo(out_dir: str | Path, *, kind: str = "writer", siblings: int = 4, instance: Instance | None = None,
             say: Any = print) -> dict[str, Any]:
    """Run the demo; returns what it measured (also printed through ``say``)."""
    import gymnasium

    from ..gym import env as gym_env  # noqa: F401 - registers drums/Desktop-v0
    from .rollouts import Script, run_rollouts

    t_demo = time.monotonic()
    instance = instance or Instance(name="demo", slot_base=400, slot_count=16)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    task = load_task(find_task(WRITER_TASK if kind == "writer" else RENAME_TASK), require_drums_support=True)
    plan = _siblings(kind, siblings)
    say(f"Drums demo: one task set up once, then branched into {siblings} sibling desktops that diverge.")
    say(f"task {task.id}: {task.instruction}")
    daemon = _Daemon(instance)
    say(f"daemon: {'started' if daemon.started else 'using the running'} drumsd for instance "
        f"{instance.name!r}" + (" (stopped again at the end)" if daemon.started else ""))
    client = daemon.client
    result: dict[str, Any] = {"task": task.id, "instance": instance.name, "out": str(out)}
    env = report = None
    state = None
    try:
        env = gymnasium.make("drums/Desktop-v0", task=task, client=client, pause=0.5, max_steps=None)
        obs, info = env.reset(seed=0)
        boot_s, setup_s = info["seconds"].get("boot", 0.0), info["seconds"].get("setup", 0.0)
        def timed(label: str, seconds: float) -> None:
            say(f"{label:<64}{seconds:7.2f} s")

        timed("[1/5] cold boot of a desktop (Xvfb, openbox, guest server)", boot_s)
        timed(f"[2/5] the task's setup ({len(task.config)} steps"
              f"{': LibreOffice Writer starts' if kind == 'writer' else ''})", setup_s)
        state = f"drums-demo-{uuid.uuid4().hex[:8]}"
        saved = env.unwrapped.save_state(state)
        timed(f"[3/5] checkpoint {state} (the desktop keeps running)", saved["seconds"])
        say(f"[4/5] restore {siblings} siblings of it at once, then [5/5] drive and score each:")
        for i, s in enumerate(plan):
            say(f"      sibling {i}: {s.what}")
        report = run_rollouts(task, state, [Script(s.name, s.actions) for s in plan], out_dir=out, client=client,
                              pause=0.5, progress=sys.stderr.isatty())
        say("")
        say(report.table())
        restore_s = report.timings["restore"]
        ready = [b.timings["ready"] for b in report.branches if "ready" in b.timings]
        cold = boot_s + setup_s
        say("")
        say(f"cold boot + setup of one desktop: {boot_s:.2f} + {setup_s:.2f} = {cold:.2f} s")
        say(f"restore of {siblings} siblings at once:  {restore_s:.2f} s ({restore_s / siblings:.2f} s per desktop, "
            f"{cold / max(restore_s, 1e-6):.1f}x faster than one cold setup, "
            f"{siblings * cold / max(restore_s, 1e-6):.1f}x faster than {siblings})")
        if ready:
            say(f"each sibling was ready {min(ready):.2f}-{max(ready):.2f} s after the restore began (daemon side)")
        tiles = [(b.screenshots.get("final"),
                  [f"sibling {b.branch}: score {'-' if b.score is None else f'{b.score:g}'}"
                   f"{'  (error)' if b.error else ''}", plan[b.branch].what], b.score)
                 for b in report.branches]
        header = [f"Drums: {siblings} siblings restored at once from one checkpoint of task {task.id}",
                  f"cold boot + setup {cold:.2f} s (boot {boot_s:.2f} s, setup {setup_s:.2f} s); checkpoint "
                  f"{saved['seconds']:.2f} s; restore of all {siblings} {restore_s:.2f} s",
                  f"instruction: {task.instruction[:150]}"]
        start = next((b.screenshots.get("start") for b in report.branches if b.screenshots.get("start")), None)
        sheet = contact_sheet(tiles, header, out / "contact-sheet.png", reference=start)
        say(f"contact sheet of the siblings' final screens: {sheet}")
        say(f"per-branch JSON lines and screenshots: {out / 'rollouts.jsonl'}")
        expected = [s.expected for s in plan]
        result.update({
            "seconds": {"boot": boot_s, "setup": setup_s, "cold_total": cold, "checkpoint": saved["seconds"],
                        "restore_all": restore_s, "restore_per_sibling": restore_s / siblings,
                        "branch_ready": ready},
            "scores": report.scores, "expected": expected, "siblings": [s.name for s in plan],
            "contact_sheet": str(sheet), "jsonl": str(out / "rollouts.jsonl"),
            "as_scripted": report.scores == expected and report.ok,
        })
    finally:
        sessions = [env.unwrapped.session_id] if env is not None and env.unwrapped.session_id else []
        if env is not None:
            env.close()
        left = _leftovers(client, sessions + [b.session for b in getattr(report, "branches", []) if b.session],
                          state)
        stopped = daemon.stop()
        result["cleanup"] = {"daemon": stopped, "left_behind": left}
        say("cleanup: sessions destroyed, snapshot deleted"
            + (f", drumsd stopped and its state unmounted (log: {stopped['log']})" if stopped.get("stopped")
               else ", drumsd left running as it was")
            + (f"; LEFT BEHIND: {left}" if left else ""))
    result["seconds"]["demo_total"] = time.monotonic() - t_demo
    say(f"demo finished in {result['seconds']['demo_total']:.1f} s"
        + ("" if result.get("as_scripted") else " -- the siblings did NOT score as scripted"))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m drums_osworld.apps.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "drums-demo"),
                        help="output directory (default: %(default)s)")
    parser.add_argument("--siblings", type=int, default=4, help="how many siblings (default 4)")
    parser.add_argument("--task", choices=("writer", "rename"), default="writer",
                        help="LibreOffice Writer (default) or the OSWorld folder-rename task")
    parser.add_argument("--instance", default="demo", help="Drums instance for the demo's daemon (default demo)")
    parser.add_argument("--slot-base", type=int, default=400)
    parser.add_argument("--slot-count", type=int, default=16)
    parser.add_argument("--json", action="store_true", help="print a JSON summary at the end")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("the demo needs root: Drums creates namespaces, mounts and veth links and runs CRIU "
              "(run `make demo` as root)", file=sys.stderr)
        return 2
    if not 1 <= args.siblings <= args.slot_count - 1:
        parser.error(f"--siblings must be 1..{args.slot_count - 1}")
    instance = Instance(name=check_name(args.instance, "instance"), slot_base=args.slot_base,
                        slot_count=args.slot_count)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, filename=str(Path(args.out) / "demo.log"),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        result = run_demo(args.out, kind=args.task, siblings=args.siblings, instance=instance,
                          say=(lambda *a, **k: print(*a, file=sys.stderr, **k)) if args.json else print)
    except DrumsError as exc:
        print(f"demo failed: {exc.code}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result, indent=1, default=json_default))
    return 0 if result.get("as_scripted") else 1


if __name__ == "__main__":
    sys.exit(main())
