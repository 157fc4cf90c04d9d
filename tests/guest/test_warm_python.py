"""The warm interpreter (drums_osworld.guest.warm_python): a Python command through the guest is a
fork of one zygote, and a client cannot tell it from a new interpreter.

Each program runs twice through the same guest server: as ``["python", "-c", CODE]`` (the warm path)
and as ``exec python -c CODE`` through ``/bin/sh`` (a shell command always starts a new interpreter); the
answers must be equal. Then what a command can do to the zygote from inside: kill it, leave things
running, run long; and that there is only ever one zygote, which ends with the guest.
"""
from __future__ import annotations

import contextlib
import os
import shlex
import signal
import tempfile
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support.guestlib import GuestServer
from tests.support.wait import wait_until

PROGRAMS = {
    "argv and path": ("import sys, os; print(sys.argv, repr(sys.path[0]), os.getcwd() == os.path.expanduser('~'))",
                      ["a", "b c"]),
    "exit code": ("raise SystemExit(3)", []),
    "exit message": ("import sys; sys.exit('bye')", []),
    "exit 256": ("raise SystemExit(256 + 7)", []),
    "traceback": ("def f():\n    1/0\nf()", []),
    "syntax error": ("def f(:", []),
    "killed by a signal": ("import os, signal; print('before', flush=True); os.kill(os.getpid(), signal.SIGTERM)", []),
    "thread joined at exit": ("import threading, time\ndef w():\n    time.sleep(0.3); print('thread done')\n"
                              "threading.Thread(target=w).start(); print('main done')", []),
    "atexit": ("import atexit, sys; atexit.register(lambda: print('at exit')); sys.stdout.write('body\\n')", []),
    "main module": ("import sys; print(__name__, '__file__' in globals(), "
                    "sys.modules['__main__'].__dict__ is globals())", []),
    "own session": ("import os; print(os.getsid(0) == os.getpid(), os.getpgrp() == os.getpid())", []),
    "stdin is empty": ("import sys; print(repr(sys.stdin.read()))", []),
    "big output": ("import sys; sys.stdout.write('x' * 3_000_000); sys.stderr.write('y' * 100_000)", []),
    "stderr and stdout": ("import sys; print('out'); print('err', file=sys.stderr); print('out2')", []),
    "pyautogui": ("import pyautogui; pyautogui.FAILSAFE = False; pyautogui.moveTo(123, 45); "
                  "print(pyautogui.position())", []),
}


def _answer(guest: GuestServer, command, shell: bool) -> tuple:
    r = guest.execute(command, shell=shell)
    body = r.json()
    return r.status_code, body.get("returncode"), body.get("output"), body.get("error")


def _zygotes(guest: GuestServer) -> list[int]:
    """The guest's warm interpreters: its children whose command line runs warm_python.serve."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read(4096)
        except OSError:
            continue
        if ppid == guest.proc.pid and b"warm_python" in cmd:
            found.append(int(pid))
    return found


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_a_warm_command_answers_as_a_new_interpreter(guest: GuestServer, name: str) -> None:
    code, args = PROGRAMS[name]
    warm = _answer(guest, ["python", "-c", code, *args], shell=False)
    cold = _answer(guest, "exec python -c " + " ".join(shlex.quote(a) for a in [code, *args]), shell=True)
    assert warm == cold, f"{name}: warm {warm!r:.600}\ncold {cold!r:.600}"
    assert _zygotes(guest), "the command did not go through a warm interpreter"


def test_commands_are_forks_of_one_zygote_and_each_has_its_own_randomness(guest: GuestServer) -> None:
    guest.execute(["python", "-c", "pass"])
    zygote = _zygotes(guest)
    assert len(zygote) == 1, zygote
    seen = set()
    for _ in range(5):
        status, rc, out, _ = _answer(guest, ["python", "-c", "import os, random; print(os.getppid(), random.random())"],
                                     shell=False)
        parent, draw = out.split()
        assert (status, rc, int(parent)) == (200, 0, zygote[0])
        seen.add(draw)
    assert len(seen) == 5, f"forked commands drew the same random numbers: {seen}"
    assert _zygotes(guest) == zygote


def test_a_script_through_run_python_is_warm_and_reports_its_own_file(guest: GuestServer) -> None:
    code = textwrap.dedent("""
        import os, sys
        here = os.path.dirname(__file__)
        print(os.path.basename(sys.argv[0]) == os.path.basename(__file__), __name__, sys.path[0] == here)
        raise ValueError('from the script')
    """)
    r = guest.post("/run_python", json={"code": code})
    body = r.json()
    assert body["status"] == "error", body
    lines = (body.get("message") or "") + (body.get("output") or "") + (body.get("error") or "")
    assert "True __main__ True" in lines and "ValueError: from the script" in lines, body
    assert 'File "/' in lines and "warm_python" not in lines, f"the traceback shows the zygote's frames: {lines}"


def test_parallel_commands_each_get_their_own_answer(guest: GuestServer) -> None:
    def one(i: int) -> tuple:
        return _answer(guest, ["python", "-c", f"import time, sys; time.sleep(0.3); print({i}); sys.exit({i})"],
                       shell=False)

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(one, range(8)))
    assert answers == [(200, i, f"{i}\n", "") for i in range(8)]


def test_a_timeout_kills_the_command_and_its_group(guest: GuestServer) -> None:
    t0 = time.monotonic()
    r = guest.execute(["python", "-c", "import os, subprocess, time; p = subprocess.Popen(['sleep', '300']); "
                       "print(os.getpid(), p.pid, flush=True); time.sleep(300)"], timeout=2)
    assert r.status_code == 500 and "timed out after 2 seconds" in r.json()["message"], r.text
    command, sleeper = (int(p) for p in r.json()["output"].split())
    assert time.monotonic() - t0 < 60
    for pid in (command, sleeper):  # both of the command's group: killed (gone, or a zombie until reaped)
        wait_until(lambda pid=pid: _state(pid) in ("", "Z"), 10, f"{pid} of the timed-out command to die")
    assert _answer(guest, ["python", "-c", "print('after')"], shell=False) == (200, 0, "after\n", "")


def test_a_command_that_kills_the_zygote_fails_alone_and_the_next_one_starts_another(guest: GuestServer) -> None:
    guest.execute(["python", "-c", "pass"])
    [before] = _zygotes(guest)
    # it may kill the zygote before the zygote said its pid: the command then fails, and it is never
    # run again the old way (once, under load, that second run killed the guest, its parent then)
    mark = tempfile.mktemp(prefix="drums-warm-kill-")
    code = f"import os, signal; open({mark!r}, 'a').write('ran;'); os.kill(os.getppid(), signal.SIGKILL)"
    try:
        status, rc, out, err = _answer(guest, ["python", "-c", code], shell=False)
        assert status == 500 or rc != 0, (status, rc, out, err)
        with open(mark) as f:
            assert f.read() == "ran;", "the command ran more than once"
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(mark)
    assert _answer(guest, ["python", "-c", "print('again')"], shell=False) == (200, 0, "again\n", "")
    after = _zygotes(guest)
    assert len(after) == 1 and after != [before], (before, after)
    assert not os.path.exists(f"/proc/{before}"), "the killed zygote was not reaped"


def test_a_command_that_leaves_a_daemon_returns_and_the_daemon_is_its_own(guest: GuestServer) -> None:
    """A command that starts something detached returns when its output ends, as a new interpreter's
    would; what it left does not hold the zygote."""
    code = ("import os, subprocess; p = subprocess.Popen(['sleep', '301'], stdin=subprocess.DEVNULL, "
            "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True); print(p.pid)")
    status, rc, out, err = _answer(guest, ["python", "-c", code], shell=False)
    try:
        assert (status, rc, err) == (200, 0, ""), (status, rc, out, err)
        assert _answer(guest, ["python", "-c", "print('next')"], shell=False) == (200, 0, "next\n", "")
        assert _state(int(out)) not in ("", "Z"), "the command's detached child did not outlive it"
    finally:
        if out.strip().isdigit():
            os.kill(int(out), signal.SIGKILL)


def test_the_zygote_ends_with_its_guest(xserver) -> None:
    g = GuestServer(xserver.display).start()
    try:
        assert _answer(g, ["python", "-c", "print(1)"], shell=False) == (200, 0, "1\n", "")
        [zygote] = _zygotes(g)
    finally:
        g.proc.kill()
        g.proc.wait()
        g.stop()
    wait_until(lambda: not os.path.exists(f"/proc/{zygote}") or _state(zygote) == "Z", 10,
               "the zygote to end after its guest")


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""
