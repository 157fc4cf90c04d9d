"""The X display as the guest server sees it: one shared connection, screenshots, the pointer.

All X traffic goes through :class:`XConnection`, which holds a single python-xlib connection
behind a lock and reopens it once when it broke (X restarted, or a restore handed back a dead
socket). A screenshot is one ``GetImage`` of the root window in ZPixmap format, converted by
Pillow without copying pixel by pixel, with the XFixes cursor image composited at the pointer,
and encoded as PNG by :func:`encode_png` (the "Up" filter for every row, computed with numpy, and
zlib level 1): about 15 ms for a text-heavy 1920x1080 screen, where Pillow's PNG encoder with
``compress_level=1`` spends about 50 ms choosing a filter per row, for files of the same size.
"""
from __future__ import annotations

import os
import struct
import threading
import time
import zlib
from collections.abc import Callable
from typing import TypeVar

import numpy as np
from PIL import Image
from Xlib import X
from Xlib import display as xdisplay
from Xlib import error as xerror

T = TypeVar("T")

# python-xlib raises a mix of its own and OS errors when the server goes away.
_CONNECTION_ERRORS = (xerror.ConnectionClosedError, xerror.DisplayError, OSError, EOFError)


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def encode_png(img: Image.Image, level: int = 1) -> bytes:
    """An 8-bit RGB PNG of ``img``: filter type 2 ("Up") on every row, zlib ``level``."""
    a = np.asarray(img.convert("RGB") if img.mode != "RGB" else img, dtype=np.uint8)
    h, w = a.shape[0], a.shape[1]
    rows = a.reshape(h, w * 3)
    raw = np.empty((h, w * 3 + 1), dtype=np.uint8)
    raw[:, 0] = 2
    raw[0, 1:] = rows[0]
    np.subtract(rows[1:], rows[:-1], out=raw[1:, 1:])  # uint8 arithmetic wraps, as PNG wants
    idat = zlib.compress(memoryview(raw).cast("B"), level)
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", idat)
            + _png_chunk(b"IEND", b""))


class DisplayUnavailable(RuntimeError):
    """The X server cannot be reached (not started yet, or gone)."""


def _arrow_cursor() -> tuple[Image.Image, int, int]:
    """A plain 12x19 arrow, used when XFixes cannot tell us the real cursor."""
    rows = [
        "X...........",
        "XX..........",
        "XoX.........",
        "XooX........",
        "XoooX.......",
        "XooooX......",
        "XoooooX.....",
        "XooooooX....",
        "XoooooooX...",
        "XooooooooX..",
        "XoooooooooX.",
        "XooooooXXXXX",
        "XoooXooX....",
        "XooXXooX....",
        "XoX..XooX...",
        "XX...XooX...",
        "X.....XooX..",
        "......XooX..",
        ".......XX...",
    ]
    px = np.zeros((len(rows), len(rows[0]), 4), dtype=np.uint8)
    for y, row in enumerate(rows):
        for x, ch in enumerate(row):
            if ch == "X":
                px[y, x] = (0, 0, 0, 255)
            elif ch == "o":
                px[y, x] = (255, 255, 255, 255)
    return Image.fromarray(px, "RGBA"), 0, 0


class XConnection:
    """A lazily opened, lock-protected connection to one X display."""

    def __init__(self, name: str | None = None) -> None:
        self.name = name or os.environ.get("DISPLAY") or ":0"
        self._lock = threading.RLock()
        self._d: xdisplay.Display | None = None
        self._xfixes = False
        self._arrow = _arrow_cursor()

    # -- connection management -------------------------------------------------------------
    def _open(self) -> xdisplay.Display:
        try:
            d = xdisplay.Display(self.name)
        except _CONNECTION_ERRORS + (xerror.XError,) as exc:
            raise DisplayUnavailable(f"cannot open X display {self.name}: {exc}") from exc
        self._xfixes = False
        try:
            if d.has_extension("XFIXES"):
                # XFixes requests are refused until the client has announced its version.
                d.xfixes_query_version()
                self._xfixes = True
        except (xerror.XError, AttributeError):
            self._xfixes = False
        return d

    def close(self) -> None:
        with self._lock:
            if self._d is not None:
                try:
                    self._d.close()
                except Exception:  # noqa: BLE001 - closing a broken connection may fail any way
                    pass
                self._d = None

    def run(self, fn: Callable[[xdisplay.Display], T]) -> T:
        """Call ``fn(display)`` under the lock; reconnect once if the connection is broken."""
        with self._lock:
            for attempt in (0, 1):
                if self._d is None:
                    self._d = self._open()
                try:
                    return fn(self._d)
                except _CONNECTION_ERRORS as exc:
                    self.close()
                    if attempt:
                        raise DisplayUnavailable(f"X display {self.name} went away: {exc}") from exc
        raise AssertionError("unreachable")

    # -- simple queries ----------------------------------------------------------------------
    def screen_size(self) -> tuple[int, int]:
        def q(d: xdisplay.Display) -> tuple[int, int]:
            s = d.screen()
            return int(s.width_in_pixels), int(s.height_in_pixels)

        return self.run(q)

    def pointer(self) -> tuple[int, int]:
        def q(d: xdisplay.Display) -> tuple[int, int]:
            p = d.screen().root.query_pointer()
            return int(p.root_x), int(p.root_y)

        return self.run(q)

    # -- screenshots -------------------------------------------------------------------------
    def _cursor(self, d: xdisplay.Display) -> tuple[Image.Image, int, int, int, int] | None:
        """(image, x, y, xhot, yhot) of the current cursor, or None when it cannot be read."""
        if not self._xfixes:
            return None
        try:
            c = d.xfixes_get_cursor_image(d.screen().root)
        except (xerror.XError, AttributeError):
            return None
        w, h = int(c.width), int(c.height)
        if w <= 0 or h <= 0 or len(c.cursor_image) < w * h:
            return None
        argb = np.asarray(c.cursor_image[: w * h], dtype=np.uint32).reshape(h, w)
        a = (argb >> 24) & 0xFF
        rgba = np.empty((h, w, 4), dtype=np.uint8)
        # XFixes pixels are premultiplied ARGB; undo the premultiplication for Pillow.
        safe = np.where(a == 0, 1, a)
        for i, shift in enumerate((16, 8, 0)):
            ch = (argb >> shift) & 0xFF
            rgba[..., i] = np.where(a == 0, 0, np.minimum(255, ch * 255 // safe))
        rgba[..., 3] = a
        return Image.fromarray(rgba, "RGBA"), int(c.x), int(c.y), int(c.xhot), int(c.yhot)

    def grab(self, with_cursor: bool = True) -> Image.Image:
        """The whole root window as an RGB image, with the cursor drawn when asked."""

        def g(d: xdisplay.Display) -> tuple[Image.Image, tuple | None]:
            root = d.screen().root
            geo = root.get_geometry()
            w, h = int(geo.width), int(geo.height)
            raw = root.get_image(0, 0, w, h, X.ZPixmap, 0xFFFFFFFF)
            data = raw.data if isinstance(raw.data, (bytes, bytearray)) else bytes(raw.data)
            bpp = len(data) * 8 // (w * h) if w and h else 0
            if bpp == 32:
                img = Image.frombuffer("RGB", (w, h), data, "raw", "BGRX", 0, 1)
            elif bpp == 24:
                img = Image.frombuffer("RGB", (w, h), data, "raw", "BGR", 0, 1)
            elif bpp == 16:
                img = Image.frombuffer("RGB", (w, h), data, "raw", "BGR;16", 0, 1)
            else:
                raise DisplayUnavailable(f"unsupported X pixel format ({bpp} bits per pixel)")
            cur = None
            if with_cursor:
                cur = self._cursor(d)
                if cur is None:
                    p = root.query_pointer()
                    arrow, xh, yh = self._arrow
                    cur = (arrow, int(p.root_x), int(p.root_y), xh, yh)
            return img, cur

        img, cur = self.run(g)
        if cur is not None:
            cimg, x, y, xhot, yhot = cur
            if img.readonly:  # a view of the X reply's buffer; paste needs a private copy
                img = img.copy()
            img.paste(cimg, (x - xhot, y - yhot), cimg)
        return img

    def screenshot_png(self, with_cursor: bool = True) -> tuple[bytes, dict]:
        """PNG bytes of the screen plus timings in milliseconds (grab, encode)."""
        t0 = time.perf_counter()
        img = self.grab(with_cursor)
        t1 = time.perf_counter()
        png = encode_png(img)
        t2 = time.perf_counter()
        return png, {
            "grab_ms": round((t1 - t0) * 1e3, 1),
            "encode_ms": round((t2 - t1) * 1e3, 1),
            "width": img.width,
            "height": img.height,
        }
