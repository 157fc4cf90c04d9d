# ruff: noqa: F821 - pyautogui and time come from the prefix OSWorld puts before every action
# Helpers every reference-solution action starts with (tests/osworld/test_reference_solutions.py
# prepends this file to each action's code). An action is sent exactly as an agent's is, through
# DesktopEnv.step, so the guest runs
#     python -c "import pyautogui; import time; pyautogui.FAILSAFE = False; <this file><action>"
# Actions wait for states (a window, the focus, a file's content), never for fixed times, and on a
# timeout exit non-zero with the reason and the open windows.
import json
import os
import re
import subprocess

HOME = os.path.expanduser('~')


def sh(*argv, timeout=30):
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout).stdout


def windows():
    return sh('wmctrl', '-lx')


def fail(why):
    raise SystemExit(f'{why}\nactive: {active_title()!r}\nwindows:\n{windows()}')


def wait(pred, timeout, why, step=0.2):
    end = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > end:
            raise SystemExit(f'{why} (waited {timeout} s)\nactive: {active_title()!r}\nwindows:\n{windows()}')
        time.sleep(step)


def find_window(pattern):
    """The id (hex) of the first window whose `wmctrl -lx` line matches the regex ``pattern``."""
    for line in windows().splitlines():
        if re.search(pattern, line):
            return line.split()[0]
    return None


def active_title():
    try:
        return sh('xdotool', 'getactivewindow', 'getwindowname', timeout=10).strip()
    except Exception:  # noqa: BLE001 - only for messages
        return ''


def active_id():
    out = sh('xdotool', 'getactivewindow', timeout=10).strip()
    return int(out) if out.isdigit() else 0


def focus(pattern, timeout=60):
    """Wait for a window matching ``pattern``, raise it and wait until it has the focus."""
    wid = wait(lambda: find_window(pattern), timeout, f'no window matches {pattern!r}')

    def focused():
        if active_id() == int(wid, 16):
            return True
        subprocess.run(['wmctrl', '-ia', wid])
        time.sleep(0.3)
        return active_id() == int(wid, 16)
    wait(focused, 20, f'window {pattern!r} ({wid}) did not take the focus')
    return wid


def wait_active(pattern, timeout=30):
    """Wait until the active window's title matches ``pattern``."""
    return wait(lambda: re.search(pattern, active_title()), timeout,
                f'the active window never matched {pattern!r}')


def geometry(wid):
    """(x, y, width, height) of a window (an id as wmctrl prints it, or an int)."""
    out = sh('xdotool', 'getwindowgeometry', '--shell', str(int(wid, 16) if isinstance(wid, str) else wid))
    g = dict(line.split('=', 1) for line in out.split())
    return int(g['X']), int(g['Y']), int(g['WIDTH']), int(g['HEIGHT'])


def read(path):
    try:
        with open(os.path.expanduser(path), errors='replace') as f:
            return f.read()
    except OSError:
        return ''


def wait_file(path, pattern, timeout=60):
    """Wait until the file's text matches the regex ``pattern``."""
    return wait(lambda: re.search(pattern, read(path), re.M), timeout,
                f'{path} never matched {pattern!r}; it holds: {read(path)[-1500:]!r}')


def wait_json(path, test, timeout, what):
    """Wait until ``test(data)`` is true of the JSON file's content (a partly written file is retried)."""
    def ok():
        try:
            return test(json.loads(read(path)))
        except (ValueError, KeyError, TypeError, AttributeError):
            return False
    return wait(ok, timeout, f'{path}: {what}', 0.5)


def gone(pattern, timeout=60):
    """Wait until no window matches ``pattern``."""
    return wait(lambda: find_window(pattern) is None, timeout, f'a window matching {pattern!r} stayed')


def procs(name):
    return [line for line in sh('pgrep', '-a', '-f', name).splitlines() if line.strip()]


# --- the accessibility tree (AT-SPI), as an agent that observes a11y_tree finds what to click
def _nodes(node, depth=0):
    yield node
    if depth >= 60:
        return
    try:
        children = list(node)
    except Exception:  # noqa: BLE001 - a node that went away while walking
        return
    for child in children:
        if child is not None:
            yield from _nodes(child, depth + 1)


def _extents(node):
    import pyatspi
    try:
        e = node.queryComponent().getExtents(pyatspi.DESKTOP_COORDS)
    except Exception:  # noqa: BLE001 - not a component, or gone
        return None
    return (e.x, e.y, e.width, e.height) if e.width > 0 and e.height > 0 else None


def _focused(node):
    import pyatspi
    try:
        return node.getState().contains(pyatspi.STATE_FOCUSED)
    except Exception:  # noqa: BLE001
        return False


def find_node(app, name, role=None, timeout=30, focused=False):
    """Wait for a node with a visible extent in the application whose name matches the regex ``app``,
    with a name matching the regex ``name`` (and role name ``role``, and having the focus when
    ``focused``); return (node, extents)."""
    import pyatspi
    seen = []

    def look():
        seen.clear()
        for a in pyatspi.Registry.getDesktop(0):
            if a is None or not re.search(app, a.name or ''):
                continue
            for n in _nodes(a):
                try:
                    nname, nrole = n.name or '', n.getRoleName()
                except Exception:  # noqa: BLE001
                    continue
                if re.search(name, nname) and (role is None or nrole == role):
                    if focused and not _focused(n):
                        continue
                    ext = _extents(n)
                    seen.append((nrole, nname, ext))
                    if ext:
                        return n, ext
        return None
    what = f'{"focused " if focused else ""}{role or "node"} named {name!r}'
    return wait(look, timeout, f'no visible {what} in {app!r} (matched: {seen[:5]})', 0.5)


def click_node(app, name, role=None, timeout=30, button='left'):
    """Click the centre of the node ``find_node`` finds."""
    _, (x, y, w, h) = find_node(app, name, role, timeout)
    pyautogui.click(x + w // 2, y + h // 2, button=button)
    return x + w // 2, y + h // 2


def retry(act, check, tries, why):
    """Do ``act`` then wait briefly for ``check``, up to ``tries`` times (a key pressed while the
    application is still starting can be lost); fail with ``why``."""
    last = ['']

    def probe():
        # a check that fails by itself (find_node's own short wait) is one more poll of the 3 s,
        # not the end of this try
        try:
            return check()
        except SystemExit as exc:
            last[0] = str(exc).split('\n', 1)[0]
            return None
    for _ in range(tries):
        act()
        try:
            value = wait(probe, 3, why, 0.2)
        except SystemExit:
            continue
        return value
    fail(f'{why} (tried {tries} times; the last check: {last[0]})')


# Chromium's AT-SPI application name and the end of its window titles (Chromium, or Google Chrome
# where the image names it as on OSWorld's VM).
CHROME = r'^(Chromium|Google Chrome)$'
CHROME_WINDOW = r' - (Chromium|Google Chrome)$'


def chrome_open(url, title):
    """In the Chromium window: the address bar (ctrl+l), ``url``, Enter; wait for a window title."""
    focus(CHROME_WINDOW)
    retry(lambda: pyautogui.hotkey('ctrl', 'l'),
          lambda: find_node(CHROME, '^Address and search bar$', 'entry', 1, focused=True), 10,
          'the address bar never took the focus')
    pyautogui.write(url, interval=0.02)
    pyautogui.press('enter')
    wait_active(title, 30)


def node_states(app, name, role=None, timeout=30):
    """The state names (``focused``, ``expanded``, ``checked``, ...) of the node ``find_node`` finds."""
    node, _ = find_node(app, name, role, timeout)
    return states_of(node)


def states_of(node):
    import pyatspi
    try:
        return {pyatspi.stateToString(s) for s in node.getState().getStates()}
    except Exception:  # noqa: BLE001 - gone meanwhile
        return set()


# --- the screen, for applications without an accessibility tree (GIMP is GTK 2)
def grab(region):
    """A screenshot of ``region`` (x, y, width, height) through Pillow (pyautogui.screenshot needs
    gnome-screenshot or scrot)."""
    from PIL import ImageGrab
    x, y, w, h = region
    return ImageGrab.grab(bbox=(x, y, x + w, y + h)).convert('RGB')


def changed(before, region, share=0.05):
    """True once more than ``share`` of the region's pixels differ from the image ``before``."""
    from PIL import ImageChops
    diff = ImageChops.difference(before, grab(region)).convert('L').point(lambda v: 255 if v > 24 else 0)
    return diff.histogram()[255] > share * before.width * before.height


def busy(region):
    """The grey-level standard deviation of ``region`` (0 for an empty, uniform area)."""
    from PIL import ImageStat
    return ImageStat.Stat(grab(region).convert('L')).stddev[0]


def steady(probe, quiet=1.0, timeout=30, why='it kept changing'):
    """Wait until ``probe()`` returns the same truthy value for ``quiet`` seconds; return it."""
    last, since = None, time.monotonic()
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = probe()
        if value != last:
            last, since = value, time.monotonic()
        elif value and time.monotonic() - since >= quiet:
            return value
        time.sleep(0.1)
    fail(f'{why} (waited {timeout} s; last {last!r})')


TERMINAL = r'gnome-terminal-server\.Gnome-terminal '


def terminal():
    """Open a terminal the way OSWorld's tasks do (ctrl+alt+t), wait until it has the focus and its
    shell shows a prompt (its text in the AT-SPI tree ends with '$')."""
    retry(lambda: pyautogui.hotkey('ctrl', 'alt', 't'), lambda: find_window(TERMINAL), 5,
          'ctrl+alt+t opened no terminal')
    focus(TERMINAL)

    def prompt():
        try:
            node, _ = find_node('^gnome-terminal-server$', '', 'terminal', 1)
            text = node.queryText()
            return text.getText(0, -1).rstrip().endswith('$')
        except Exception:  # noqa: BLE001 - not there yet
            return False
    wait(prompt, 30, 'the terminal never showed a prompt')


def exists(app, name, role=None):
    """Whether ``find_node`` finds the node right now."""
    try:
        find_node(app, name, role, 0)
        return True
    except SystemExit:
        return False


def find_nodes(app, name, role=None):
    """Every visible node ``find_node`` would consider, as (node, extents), right now."""
    import pyatspi
    out = []
    for a in pyatspi.Registry.getDesktop(0):
        if a is None or not re.search(app, a.name or ''):
            continue
        for n in _nodes(a):
            try:
                if re.search(name, n.name or '') and (role is None or n.getRoleName() == role):
                    ext = _extents(n)
                    if ext:
                        out.append((n, ext))
            except Exception:  # noqa: BLE001 - gone meanwhile
                continue
    return out


def click_at(ext, clicks=1):
    x, y, w, h = ext
    pyautogui.click(x + w // 2, y + h // 2, clicks=clicks, interval=0.1)


def inside(ext, box):
    """Whether extents ``ext`` lie within ``box`` (both x, y, width, height)."""
    return box[0] <= ext[0] and box[1] <= ext[1] and ext[0] + ext[2] <= box[0] + box[2] \
        and ext[1] + ext[3] <= box[1] + box[3]


def calm(main, popups, quiet=2.0, timeout=120):
    """Wait until the window ``main`` (a `wmctrl -lx` regex) is up and stays active for ``quiet``
    seconds, closing any window matching ``popups`` (first-start dialogs) on the way."""
    end = time.monotonic() + timeout
    since = None
    while time.monotonic() < end:
        popup = find_window(popups)
        if popup:
            subprocess.run(['wmctrl', '-ic', popup])
            since = None
        elif (wid := find_window(main)) and active_id() == int(wid, 16):
            since = since or time.monotonic()
            if time.monotonic() - since >= quiet:
                return wid
        else:
            if wid:
                subprocess.run(['wmctrl', '-ia', wid])
            since = None
        time.sleep(0.2)
    fail(f'{main!r} never stayed active for {quiet} s')
