"""OSWorld's own client code (desktop-env 1.0.2) driving the guest server.

``PythonController``, ``SetupController`` and the evaluator getters run unmodified in the test-only
venv of ``tests/support/osworld_harness.py`` (heavy optional imports stubbed) and talk to the server on
127.0.0.1. Nothing here reaches beyond loopback: the one ``download`` step is served from OSWorld's
own host-side cache, the way a pre-seeded cache works offline.
"""
from __future__ import annotations

import json
import os
import shutil
import textwrap
import time
import uuid

import pytest
from tests.support.osworld_harness import ensure_osworld_venv, run_osworld

PRELUDE = """
import io, json, logging, os, sys, time, types, uuid
logging.basicConfig(level=logging.WARNING)
from desktop_env.controllers.python import PythonController
PORT = int(os.environ["GUEST_PORT"])
pc = PythonController(vm_ip="127.0.0.1", server_port=PORT)
pc.retry_interval = 0.2   # keep the error paths (3 retries) quick
"""


@pytest.fixture(scope="module")
def osworld_venv():
    try:
        return ensure_osworld_venv()
    except Exception as exc:  # noqa: BLE001 - no PyPI mirror, no venv: say so
        pytest.fail(f"OSWorld test venv unavailable: {exc}")


def _run(guest, snippet: str, **env) -> dict:
    return run_osworld(PRELUDE + textwrap.dedent(snippet), env={"GUEST_PORT": str(guest.port), **env},
                       timeout=600)


def test_python_controller(osworld_venv, guest):
    (guest.home / "Desktop" / "note.txt").write_text("from the guest\n")
    out = _run(guest, """
        from PIL import Image
        shot = pc.get_screenshot()
        img = Image.open(io.BytesIO(shot))
        res = {"png": shot[:8] == b"\\x89PNG\\r\\n\\x1a\\n", "size": list(img.size)}
        res["platform"] = pc.get_vm_platform()
        res["exec"] = pc.execute_python_command("print(1 + 1)")
        res["screen"] = pc.get_vm_screen_size()
        res["desktop"] = pc.get_vm_desktop_path()
        res["tree"] = pc.get_vm_directory_tree(res["desktop"])
        res["file"] = pc.get_file(res["desktop"] + "/note.txt").decode()
        res["missing_file"] = pc.get_file("/no/such/file")
        res["terminal"] = pc.get_terminal_output()
        at = pc.get_accessibility_tree()
        res["at_head"] = at[:14]
        # The parser OSWorld's agents use on the tree must accept it.
        from mm_agents.accessibility_tree_wrap.heuristic_retrieve import filter_nodes
        import xml.etree.ElementTree as ET
        filter_nodes(ET.fromstring(at))
        res["run_python"] = pc.run_python_script("print('py', 6 * 7)")
        res["run_bash"] = pc.run_bash_script("echo bash-ok; pwd", timeout=20)
        emit(res)
    """)
    assert out["png"] and out["size"] == [1920, 1080]
    assert out["platform"] == "Linux"
    assert out["exec"]["returncode"] == 0 and out["exec"]["output"] == "2\n"
    assert out["screen"] == {"width": 1920, "height": 1080}
    assert out["desktop"] == str(guest.home / "Desktop")
    assert {"type": "file", "name": "note.txt"} in out["tree"]["children"]
    assert out["file"] == "from the guest\n"
    assert out["missing_file"] is None
    assert out["terminal"] is None
    assert out["at_head"] == "<desktop-frame"
    assert out["run_python"]["status"] == "success" and out["run_python"]["output"] == "py 42\n"
    assert out["run_bash"]["returncode"] == 0
    assert out["run_bash"]["output"] == f"bash-ok\n{guest.home}\n"


def test_pyautogui_action_changes_screen(osworld_venv, guest):
    out = _run(guest, """
        from desktop_env.controllers.setup import SetupController
        sc = SetupController(vm_ip="127.0.0.1", server_port=PORT, cache_dir=os.getcwd())
        ok = sc.setup([
            {"type": "launch", "parameters": {"command": ["xterm", "-xrm", "*allowTitleOps: false",
                                                           "-title", "compat typing",
                                                          "-geometry", "80x20+100+100"]}},
            {"type": "sleep", "parameters": {"seconds": 1.5}},
            {"type": "activate_window", "parameters": {"window_name": "compat typing"}},
        ])
        before = pc.get_screenshot()
        r = pc.execute_python_command("pyautogui.typewrite('echo osworld-compat'); "
                                      "pyautogui.press('enter')")
        time.sleep(0.5)
        after = pc.get_screenshot()
        sc._close_window_setup("compat typing")
        emit({"setup": ok, "rc": r["returncode"], "changed": before != after})
    """)
    assert out == {"setup": True, "rc": 0, "changed": True}
    guest.wait_window("compat typing", present=False)


def test_setup_controller_and_getters(osworld_venv, guest, tmp_path):
    local = tmp_path / "local-upload.txt"
    local.write_text("uploaded by SetupController\n")
    url = "http://127.0.0.1:9/osworld-cache-only.txt"   # never fetched: the cache has it
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    cached = cache_dir / f"{uuid.uuid5(uuid.NAMESPACE_URL, url)}_cached.txt"
    cached.write_text("served from the host cache\n")
    doc_name = f"compat-{uuid.uuid4().hex[:8]}"
    use_lo = shutil.which("libreoffice") is not None
    doc_path = str(guest.home / "Desktop" / (doc_name + (".rtf" if use_lo else "")))
    steps = [
        {"type": "execute", "parameters": {
            "command": ["bash", "-c",
                        "mkdir -p ~/setup && echo {SCREEN_WIDTH}x{SCREEN_HEIGHT} > ~/setup/size.txt"],
            "stdout": "exec.out"}},
        {"type": "command", "parameters": {"command": "echo hello-from-command", "shell": True,
                                           "stdout": "command.out"}},
        {"type": "upload_file", "parameters": {"files": [{"local_path": str(local),
                                                          "path": "~/setup/uploaded.txt"}]}},
        {"type": "download", "parameters": {"files": [{"url": url,
                                                       "path": str(guest.home / "setup" / "cached.txt")}]}},
        {"type": "launch", "parameters": {"command": ["xterm", "-xrm", "*allowTitleOps: false",
                                                      "-title", "compat setup win"]}},
        {"type": "sleep", "parameters": {"seconds": 1}},
        {"type": "activate_window", "parameters": {"window_name": "compat setup win",
                                                   "strict": True}},
    ]
    if use_lo:
        with open(doc_path, "w") as f:
            f.write(r"{\rtf1\ansi OSWorld open step.}")
        steps.append({"type": "open", "parameters": {"path": doc_path}})
    else:
        steps.append({"type": "open", "parameters": {"path": "xterm"}})
    t0 = time.monotonic()
    out = _run(guest, f"""
        from desktop_env.controllers.setup import SetupController
        from desktop_env.evaluators import getters
        steps = json.loads({json.dumps(json.dumps(steps))})
        sc = SetupController(vm_ip="127.0.0.1", server_port=PORT, cache_dir={str(cache_dir)!r})
        ok = sc.setup(steps)
        env = types.SimpleNamespace(vm_ip="127.0.0.1", server_port=PORT, controller=pc,
                                    cache_dir={str(tmp_path / "getters")!r})
        os.makedirs(env.cache_dir, exist_ok=True)
        res = {{"setup": ok}}
        res["exec_out"] = open(os.path.join({str(cache_dir)!r}, "exec.out")).read()
        res["command_out"] = open(os.path.join({str(cache_dir)!r}, "command.out")).read()
        res["size"] = getters.get_vm_command_line(env, {{"command": ["cat", "~/setup/size.txt"]}})
        res["uploaded"] = getters.get_vm_command_line(
            env, {{"command": "cat ~/setup/uploaded.txt", "shell": True}})
        res["cmd_error"] = getters.get_vm_command_error(
            env, {{"command": "echo oops >&2", "shell": True}})
        p = getters.get_vm_file(env, {{"path": "~/setup/cached.txt", "dest": "cached.txt"}})
        res["vm_file"] = open(p).read()
        res["vm_file_missing"] = getters.get_vm_file(env, {{"path": "/no/such", "dest": "x"}})
        res["screen"] = getters.get_vm_screen_size(env, {{}})
        res["window"] = getters.get_vm_window_size(env, {{"app_class_name": "XTerm"}})
        res["listing"] = getters.get_list_directory(env, {{"path": "{guest.home}/setup"}})
        res["terminal"] = getters.get_vm_terminal_output(env, {{}})
        res["at"] = getters.get_accessibility_tree(env)[:14]
        sc._close_window_setup("compat setup win", strict=True)
        emit(res)
    """)
    print(f"SetupController run with getters: {time.monotonic() - t0:.1f} s")
    assert out["setup"] is True
    assert out["exec_out"] == "" and out["command_out"] == "hello-from-command\n"
    assert out["size"] == "1920x1080\n"
    assert out["uploaded"] == "uploaded by SetupController\n"
    assert out["cmd_error"] == "oops\n"
    assert out["vm_file"] == "served from the host cache\n"
    assert out["vm_file_missing"] is None
    assert out["screen"] == {"width": 1920, "height": 1080}
    assert out["window"]["width"] > 0 and out["window"]["height"] > 0
    names = {c["name"] for c in out["listing"]["children"]}
    assert {"size.txt", "uploaded.txt", "cached.txt"} <= names
    assert out["terminal"] is None and out["at"] == "<desktop-frame"
    guest.wait_window("compat setup win", present=False)
    if use_lo:
        guest.wait_window(doc_name)
        guest.post("/setup/close_window", json={"window_name": doc_name})
        guest.wait_window(doc_name, timeout=30, present=False)
    else:
        guest.post("/setup/close_window", json={"window_name": "xterm", "strict": True})


def test_recording_through_controller(osworld_venv, guest, tmp_path):
    if shutil.which("ffmpeg") is None:
        pytest.fail("ffmpeg not installed")
    dest = tmp_path / "recording.mp4"
    out = _run(guest, f"""
        pc.start_recording()
        pc.execute_python_command("pyautogui.moveTo(200, 200); pyautogui.moveTo(900, 700, 0.5)")
        time.sleep(0.5)
        pc.end_recording({str(dest)!r})
        emit(os.path.getsize({str(dest)!r}))
    """)
    assert out > 1000
    assert dest.read_bytes()[4:8] == b"ftyp"


def test_setup_failure_surfaces(osworld_venv, guest):
    """A failing `open` step makes SetupController.setup raise, as with OSWorld's own guest."""
    out = _run(guest, """
        from desktop_env.controllers.setup import SetupController
        sc = SetupController(vm_ip="127.0.0.1", server_port=PORT, cache_dir=os.getcwd())
        try:
            sc.setup([{"type": "open", "parameters": {"path": "/no/such/document.docx"}}])
            emit("no error")
        except Exception as e:
            emit(str(e))
    """)
    assert "Setup step 1 failed" in out and "404" in out


def test_guest_reply_shapes_are_json_where_parsed(guest):
    """The replies OSWorld's code parses with .json(), checked byte for byte on the wire."""
    r = guest.post("/execute", json={"command": ["printf", "x"], "shell": False})
    assert r.content == b'{"error":"","output":"x","returncode":0,"status":"success"}\n'
    r = guest.post("/screen_size")
    assert r.content == b'{"height":1080,"width":1920}\n'
    r = guest.get("/terminal")
    assert json.loads(r.content)["output"] is None and json.loads(r.content)["status"] == "success"
    assert os.path.basename(guest.post("/desktop_path").json()["desktop_path"]) == "Desktop"
