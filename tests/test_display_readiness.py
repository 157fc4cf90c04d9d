"""The engine's agent-ready screen test (``display.nonblank_exceeds``) against the full count.

A real Xvfb; python-xlib fills rectangles of known area on the root window, so the share of
pixels that differ from the top-left one is known exactly. The early-exit test must give the same
answer as counting every pixel (``nonblank_fraction_raw``), on both sides of the threshold.
"""
from __future__ import annotations

import pytest
from Xlib import display as xdisplay

from drums_core.session import display
from tests.support.local_guest import LocalDesktop

W, H = 640, 480


@pytest.fixture(scope="module")
def xconn():
    desk = LocalDesktop(W, H, first_display=960)
    d = xdisplay.Display(desk.display)
    try:
        yield d
    finally:
        d.close()
        desk.close()


def _paint(d, rects):
    root = d.screen().root
    cmap = d.screen().default_colormap
    bg = root.create_gc(foreground=cmap.alloc_color(0, 0, 0).pixel)
    fg = root.create_gc(foreground=cmap.alloc_color(65535, 65535, 65535).pixel)
    root.fill_rectangle(bg, 0, 0, W, H)
    for x, y, w, h in rects:
        root.fill_rectangle(fg, x, y, w, h)
    d.sync()


@pytest.mark.parametrize("rects,share", [
    ([], 0.0),                                     # blank
    ([(0, H - 48, W, 48)], 0.1),                   # exactly 10%: not more than 10%
    ([(0, H - 49, W, 49)], 49 / H),                # just over 10%, all at the bottom (read last)
    ([(10, 10, 20, 20)], 400 / (W * H)),           # a small mark near the top
    ([(0, 100, W, 300)], 300 / H),                 # most of the screen
])
@pytest.mark.parametrize("threshold", [0.0001, 0.1, 0.5])
def test_nonblank_exceeds_agrees_with_the_full_count(xconn, rects, share, threshold):
    _paint(xconn, rects)
    full = display.nonblank_fraction_raw(xconn)
    assert full == pytest.approx(share)
    answer, seen_share = display.nonblank_exceeds(xconn, threshold)
    assert answer == (full > threshold)
    assert 0.0 <= seen_share <= 1.0


def test_nonblank_exceeds_stops_early_on_a_covered_screen(xconn):
    _paint(xconn, [(0, 1, W, H - 1)])  # all but the first row differs from the top-left pixel
    reads = []
    root = xconn.screen().root
    orig = type(root).get_image

    def counting(self, *a, **k):
        reads.append(a[3])
        return orig(self, *a, **k)

    type(root).get_image = counting
    try:
        answer, _ = display.nonblank_exceeds(xconn, 0.1)
    finally:
        type(root).get_image = orig
    assert answer is True
    assert sum(reads) < H / 2, f"read {sum(reads)} of {H} rows to decide"


def test_a_snapshot_window_whose_title_changed_is_found_by_its_id(xconn):
    """A restore waits for the snapshot's first window: by its title, or by its X id, since the title
    may have changed by the time the restored application runs on (Chromium's 'Untitled' tab became
    'New Tab' after a restore, which then waited 120 s for a title that never came back)."""
    from drums_core.errors import Unavailable

    _paint(xconn, [(0, 100, W, 300)])
    root = xconn.screen().root
    win = root.create_window(10, 10, 100, 80, 0, xconn.screen().root_depth)
    win.set_wm_name("New Tab - Chromium")
    win.map()
    xconn.sync()
    number = int(xconn.get_display_name().rsplit(":", 1)[1].split(".")[0])
    try:
        seen = display.wait_ready(number, "Untitled - Chromium", 2.0, expect_ids=[win.id])
        assert seen["window"] == "New Tab - Chromium", seen
        with pytest.raises(Unavailable) as exc:  # the title alone: never found
            display.wait_ready(number, "Untitled - Chromium", 0.5)
        assert exc.value.reason == "NOT_READY"
        with pytest.raises(Unavailable):  # another window's id does not stand for it
            display.wait_ready(number, "Untitled - Chromium", 0.5, expect_ids=[win.id + 1])
    finally:
        win.destroy()
        xconn.sync()
