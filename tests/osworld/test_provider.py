"""``DesktopEnv(provider_name="drums")`` with the real desktop-env 1.0.2: registration, the provider
interface as DesktopEnv calls it, closing, reclaiming after a kill, screen size and the shared
``init_state``, and the ``python -m drums_osworld.apps.run`` launcher.

Each test names the acceptance item of issue 7 it shows.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import textwrap
import time

import pytest

from tests.support.osworldlib import REPO, watchdog_pids
from tests.support.wait import WaitTimeout, wait_until

E0DF = "os/e0df059f-28a6-4169-924f-b9623e7184cc.json"


def test_registration_is_cheap_idempotent_and_complete(osworld):
    """``import drums_osworld`` imports no OSWorld and registers once desktop_env is imported (or at
    once when it already is); both factory bindings are patched; register() is idempotent; other
    provider names behave as before."""
    out = osworld.run('''
        import drums_osworld
        from drums_osworld.provider import registration as R
        import desktop_env.providers as P, desktop_env.desktop_env as DE
        R.register(); R.register(); drums_osworld.register()
        res = {"registered": R.is_registered(),
               "both_factories": [P.create_vm_manager_and_provider.__drums__,
                                  DE.create_vm_manager_and_provider.__drums__],
               "wrapped_once": [not getattr(getattr(DE.DesktopEnv, n).__drums_original__, "__drums__", False)
                                for n in ("__init__", "reset", "_start_emulator")]}
        m, p = P.create_vm_manager_and_provider("drums", None)
        m2, p2 = DE.create_vm_manager_and_provider(" Drums ", "r1")
        res["factory_types"] = [type(m).__name__, type(p).__name__, type(p2).__name__, p2.region]
        from desktop_env.providers.base import Provider, VMManager
        res["abcs"] = [isinstance(p, Provider), isinstance(m, VMManager)]
        res["vm_path"] = m.get_vm_path(os_type="Ubuntu", region=None, screen_size=(1920, 1080))
        for label, fn in (("factory", lambda: P.create_vm_manager_and_provider("no-such-provider", None)),
                          ("env", lambda: DesktopEnv(provider_name="no-such-provider"))):
            try:
                fn()
            except NotImplementedError as e:
                res[label] = str(e)
        try:
            DesktopEnv(provider_name="drums", os_type="Windows")
        except Exception as e:
            res["windows"] = type(e).__name__
        emit(res)
    ''')
    assert out["registered"] and out["both_factories"] == [True, True] and out["wrapped_once"] == [True] * 3
    assert out["factory_types"] == ["DrumsVMManager", "DrumsProvider", "DrumsProvider", "r1"]
    assert out["abcs"] == [True, True]
    assert out["vm_path"] == "drums://osworld"
    assert out["factory"] == out["env"] == "no-such-provider not implemented!"
    assert out["windows"] == "InvalidArgument"

    script = osworld.script('''
        import sys
        import drums_osworld
        from drums_osworld.provider import registration as R
        before = sorted(m for m in sys.modules if m.startswith("desktop_env"))
        heavy = sorted(m for m in ("requests", "drums_osworld.provider.provider", "drums_core.client")
                       if m in sys.modules)
        import desktop_env.desktop_env
        emit({"before": before, "heavy": heavy, "after": R.is_registered()})
    ''', prelude=False)
    out = osworld.run("", argv=[str(osworld.venv / "bin/python"), str(script)])
    assert out == {"before": [], "heavy": [], "after": True}

    script = osworld.script('''
        import desktop_env.desktop_env as DE
        was = getattr(DE.create_vm_manager_and_provider, "__drums__", False)
        import drums_osworld  # desktop_env is already imported: registers at once
        from drums_osworld.provider import registration as R
        emit({"was": was, "now": R.is_registered()})
    ''', prelude=False)
    out = osworld.run("", argv=[str(osworld.venv / "bin/python"), str(script)])
    assert out == {"was": False, "now": True}


def test_e0df059f_reset_evaluate_act_revert(osworld, client):
    """Acceptance 1: DesktopEnv(provider_name="drums", action_space="pyautogui"); reset(e0df059f);
    evaluate() 0.0; a correct pyautogui action through step; evaluate() 1.0; reset again reverts
    (a new session) and evaluate() is 0.0 again."""
    out = osworld.run(f'''
        task = load_task({E0DF!r})
        t0 = time.monotonic()
        env = DesktopEnv(provider_name="drums", action_space="pyautogui")
        res = {{"construct_s": time.monotonic() - t0, "provider_name": env.provider_name, "path": env.path_to_vm,
               "used_at_start": env.is_environment_used, "ip": env.provider.get_ip_address(env.path_to_vm),
               "vm_ip": env.vm_ip, "port": env.server_port}}
        first = env.provider.desktop.id
        t0 = time.monotonic()
        obs = env.reset(task_config=task)
        res["first_reset_s"] = time.monotonic() - t0
        res["obs"] = {{k: type(v).__name__ for k, v in obs.items()}}
        res["png"] = obs["screenshot"][:8] == b"\\x89PNG\\r\\n\\x1a\\n"
        res["same_session_after_first_reset"] = env.provider.desktop.id == first
        res["before"] = env.evaluate()
        # pyautogui-space code as an agent emits it (the guest runs `python -c "import pyautogui; ...; <code>"`)
        action = ("import subprocess, os; pyautogui.moveTo(960, 540); "
                  "subprocess.run(['mv', os.path.expanduser('~/Desktop/todo_list_Jan_1'), "
                  "os.path.expanduser('~/Desktop/todo_list_Jan_2')], check=True)")
        _, reward, done, info = env.step(action, pause=0.2)
        res["step"] = [reward, done, info]
        res["after"] = env.evaluate()
        used = env.provider.desktop.id
        t0 = time.monotonic()
        env.reset(task_config=task)
        res["revert_reset_s"] = time.monotonic() - t0
        res["timings"] = dict(env.provider.timings)
        res["new_session"] = env.provider.desktop.id != used
        res["after_revert"] = env.evaluate()
        res["listing"] = guest_sh(env, "ls ~/Desktop")
        res["vm_screen_size"] = env.vm_screen_size
        env.close()
        env.close()  # idempotent
        emit(res)
    ''')
    print(json.dumps(out, indent=1))
    assert out["provider_name"] == "drums" and out["path"] == "drums://osworld"
    assert out["used_at_start"] is False
    assert out["ip"] == f"{out['vm_ip']}:5000:9222:8006:8080" and out["vm_ip"].startswith("169.254.")
    assert out["obs"]["screenshot"] == "bytes" and out["png"]
    assert out["same_session_after_first_reset"], "the first reset of a clean env must not revert"
    assert out["before"] == 0.0
    assert out["step"] == [0, False, {}]
    assert out["after"] == 1.0
    assert out["new_session"], "a reset after acting must revert to a new session"
    assert out["after_revert"] == 0.0
    assert out["listing"].split() == ["todo_list_Jan_1"]
    assert out["vm_screen_size"] == {"width": 1920, "height": 1080}
    assert client.list() == []


def test_save_state_revert_and_close_leave_nothing(osworld, client):
    """save_state = checkpoint leaving the desktop running (same session and address);
    revert_to_snapshot(name) then start restores it (init_state when nothing was saved under the
    name); acceptance 5a: close() leaves no session,
    private snapshot, lease or watchdog behind."""
    before = {s["id"] for s in client.snapshots()}
    out = osworld.run(f'''
        env = DesktopEnv(provider_name="drums", action_space="pyautogui")
        env.reset(task_config=load_task({E0DF!r}))
        sid, ip = env.provider.desktop.id, env.vm_ip
        guest_sh(env, "echo before-save > ~/marker")
        env._save_state("mid")
        res = {{"same_after_save": [env.provider.desktop.id == sid, env.vm_ip == ip],
               "marker_after_save": guest_sh(env, "cat ~/marker")}}
        env.step("open(__import__('os').path.expanduser('~/after'), 'w').write('x')", pause=0)
        env.snapshot_name = "mid"
        env.reset()                                   # a revert to the private state
        res["after_revert"] = guest_sh(env, "ls ~/Desktop; cat ~/marker; ls ~/after 2>&1 | grep -c 'No such'")
        env.snapshot_name = "never-saved"            # nothing saved under it: init_state
        env.step("pass", pause=0)
        env.reset()
        res["unsaved"] = [env.provider.session_snapshot == env.provider.resolve("init_state"),
                          guest_sh(env, "ls ~/Desktop; ls ~/marker 2>&1 | grep -c 'No such'")]
        env.close()
        emit(res)
    ''')
    assert out["same_after_save"] == [True, True]
    assert out["marker_after_save"] == "before-save\n"
    assert out["after_revert"].split() == ["todo_list_Jan_1", "before-save", "1"]
    assert out["unsaved"] == [True, "1\n"], out["unsaved"]
    assert client.list() == []
    new = [s for s in client.snapshots() if s["id"] not in before and s["name"] != "init_state"]
    assert new == [], f"close() left snapshots: {new}"
    assert osworld.lease_files() == []


KEEP_ALIVE = f'''
    from drums_osworld.snapshot import branch
    env = DesktopEnv(provider_name="drums", action_space="pyautogui")
    env.reset(task_config=load_task({E0DF!r}))
    sibs = branch(env, 2, "mid")                  # 3 sessions and a private snapshot
    print("READY " + json.dumps([env.provider.desktop.id] + [s.provider.desktop.id for s in sibs]), flush=True)
    time.sleep(3600)
'''


def _start_holder(osworld) -> tuple[subprocess.Popen, list[str]]:
    proc = osworld.popen(KEEP_ALIVE)
    lines = [""]

    def ready_or_gone() -> bool:  # readline blocks until a line (or the end of the output)
        lines.append(proc.stdout.readline())
        return lines[-1].startswith("READY ") or (not lines[-1] and proc.poll() is not None)

    with contextlib.suppress(WaitTimeout):  # judged just below
        wait_until(ready_or_gone, 300, "the DesktopEnv process's READY line", every=0)
    line = lines[-1]
    if not line.startswith("READY "):
        proc.kill()
        pytest.fail(f"the DesktopEnv process did not get ready: {line!r} {proc.stderr.read()[-3000:]}")
    return proc, json.loads(line.split(" ", 1)[1])


def _private_snapshots(client) -> list[dict]:
    return [s for s in client.snapshots() if ":env:" in str(s.get("scope"))]


def test_killed_desktopenv_sessions_are_reclaimed(osworld, client, drums_instance):
    """Acceptance 5b: the sessions of a DesktopEnv process killed with SIGKILL are reclaimed: by its
    watchdog at once; when the watchdog was killed too, by the lease sweep
    (``python -m drums_osworld.provider.leases --reap``, also run by the next provider start)."""
    # 1. The owner dies: its watchdog destroys its sessions and deletes its private snapshot.
    proc, sessions = _start_holder(osworld)
    live = {s["id"] for s in client.list()}
    assert set(sessions) <= live and len(sessions) == 3
    assert len(_private_snapshots(client)) == 1
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    t0 = time.monotonic()
    wait_until(lambda: not ({s["id"] for s in client.list()} & set(sessions)), 60,
               "the watchdog to reclaim the killed process's sessions", every=0.1)
    took = time.monotonic() - t0
    print(f"watchdog reclaimed {len(sessions)} sessions {took:.2f}s after the SIGKILL")
    wait_until(lambda: not _private_snapshots(client) and not osworld.lease_files(), 30,
               "the private snapshot and the leases to go", every=0.1)

    # 2. Owner and watchdog both die: the sessions stay until the sweep reclaims them.
    proc, sessions = _start_holder(osworld)
    dogs = [p for p in watchdog_pids(drums_instance)
            if str(proc.pid).encode() in open(f"/proc/{p}/cmdline", "rb").read().split(b"\0")]
    assert len(dogs) == 1, dogs
    os.kill(dogs[0], signal.SIGKILL)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    time.sleep(2)  # an absence, nothing to wait on: a reclaim that should not happen would show by now
    assert set(sessions) <= {s["id"] for s in client.list()}, "nothing should have reclaimed them yet"
    assert len(osworld.lease_files()) == 6  # 3 sessions + the private snapshot, held by each of the 3 envs
    out = subprocess.run([str(osworld.venv / "bin/python"), "-m", "drums_osworld.provider.leases", "--reap",
                          "--instance", drums_instance.name, "--slot-base", str(drums_instance.slot_base),
                          "--slot-count", str(drums_instance.slot_count)],
                         env=osworld.env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    print("sweep:", report)
    assert sorted(report["sessions"]) == sorted(sessions) and len(report["snapshots"]) == 1
    assert not ({s["id"] for s in client.list()} & set(sessions))
    assert not _private_snapshots(client) and osworld.lease_files() == []


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_screen_size_and_concurrent_first_use_boot_once(osworld, client):
    """Screen size follows ``screen_size``; the first use of an image at a size boots it cold once
    and checkpoints ``init_state`` for that size: three workers starting at the same instant make
    exactly one, and all three get desktops restored from it."""
    size = (1280, 800)
    ours = [s for s in client.snapshots() if s["name"] == "init_state" and ":1280x800:" in s["scope"]]
    for s in ours:
        client.delete_snapshot(s["id"])
    start_at = time.time() + 6
    snippet = f'''
        import base64
        while time.time() < {start_at}:
            time.sleep(0.005)
        t0 = time.monotonic()
        env = DesktopEnv(provider_name="drums", action_space="pyautogui", screen_size={size!r},
                         require_a11y_tree=False)
        took = time.monotonic() - t0
        obs = env.reset()
        emit({{"took": took, "size": env.vm_screen_size, "snapshot": env.provider.session_snapshot,
               "shot": base64.b64encode(obs["screenshot"][:32]).decode()}})
        env.close()
    '''
    procs = [osworld.popen(snippet) for _ in range(3)]
    results = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=300)
            assert p.returncode == 0, stderr[-3000:]
            results.append(json.loads([ln for ln in stdout.splitlines() if ln.startswith("@@DRUMS")][-1]
                                      .split(" ", 1)[1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    made = [s for s in client.snapshots() if s["name"] == "init_state" and ":1280x800:" in s["scope"]]
    try:
        print("first use at 1280x800, seconds per worker:", [round(r["took"], 3) for r in results])
        assert len(made) == 1, f"expected one cold boot, got {len(made)} init_state snapshots"
        assert {r["snapshot"] for r in results} == {made[0]["id"]}
        import base64

        for r in results:
            assert r["size"] == {"width": 1280, "height": 800}
            assert _png_size(base64.b64decode(r["shot"])) == size
    finally:
        for s in made:
            client.delete_snapshot(s["id"])


MIMIC_RUNNER = textwrap.dedent('''\
    """A stand-in for OSWorld's scripts/python/run_multienv.py (not in the wheel): the same argparse
    choices for --provider_name, the same DesktopEnv call, one DesktopEnv per worker process."""
    import argparse, json, multiprocessing, os, sys
    from multiprocessing import Manager, Process
    from desktop_env.desktop_env import DesktopEnv

    def config():
        parser = argparse.ArgumentParser()
        parser.add_argument("--path_to_vm", type=str, default=None)
        parser.add_argument("--headless", action="store_true")
        parser.add_argument("--action_space", type=str, default="pyautogui")
        parser.add_argument("--observation_type", choices=["screenshot", "a11y_tree", "screenshot_a11y_tree", "som"],
                            default="screenshot")
        parser.add_argument("--test_config_base_dir", type=str, required=True)
        parser.add_argument("--num_envs", type=int, default=1)
        parser.add_argument("--provider_name", type=str, default="docker",
                            choices=["aws", "virtualbox", "vmware", "docker", "azure"])
        parser.add_argument("--client_password", type=str, default="")
        parser.add_argument("--screen_width", type=int, default=1920)
        parser.add_argument("--screen_height", type=int, default=1080)
        parser.add_argument("--start_method", default="fork")
        return parser.parse_args()

    args = config()

    def run_env_tasks(task_queue, args, shared_scores):
        env = DesktopEnv(path_to_vm=args.path_to_vm, action_space=args.action_space,
                         provider_name=args.provider_name, screen_size=(args.screen_width, args.screen_height),
                         headless=args.headless, os_type="Ubuntu",
                         require_a11y_tree=args.observation_type in ["a11y_tree", "screenshot_a11y_tree", "som"],
                         enable_proxy=True, client_password=args.client_password)
        try:
            while True:
                try:
                    domain, example_id = task_queue.get(timeout=2)
                except Exception:
                    break
                with open(os.path.join(args.test_config_base_dir, domain, example_id + ".json")) as f:
                    example = json.load(f)
                env.reset(task_config=example)
                before = env.evaluate()
                for action in example["drums_solution"]:
                    env.step(action, 0.2)
                shared_scores.append([example_id, before, env.evaluate(), env.provider_name, os.getpid(),
                                      env.provider.reuse_mode])
        finally:
            env.close()

    if __name__ == "__main__":
        multiprocessing.set_start_method(args.start_method)
        with Manager() as manager:
            scores, queue = manager.list(), manager.Queue()
            for item in [("os", "e0df059f-28a6-4169-924f-b9623e7184cc"), ("os", "drums-os-make-executable"),
                         ("os", "drums-os-delete-log"), ("os", "e0df059f-28a6-4169-924f-b9623e7184cc")]:
                queue.put(item)
            procs = [Process(target=run_env_tasks, args=(queue, args, scores)) for _ in range(args.num_envs)]
            for p in procs:
                p.start()
            for p in procs:
                p.join()
            print("SCORES " + json.dumps(list(scores)))
''')


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_launcher_runs_an_osworld_runner_on_drums(osworld, client, start_method):
    """``python -m drums_osworld.apps.run <script> --provider_name drums``: the script's argparse choices
    accept drums, worker processes (fork and spawn) register, and tasks score 0.0 -> 1.0."""
    script = osworld.workdir / "run_multienv_like.py"
    script.write_text(MIMIC_RUNNER)
    py = str(osworld.venv / "bin/python")
    args = [str(script), "--provider_name", "drums", "--num_envs", "2", "--test_config_base_dir",
            str(REPO / "tasks"), "--start_method", start_method]
    plain = subprocess.run([py, *args], cwd=osworld.workdir, env=osworld.env(), capture_output=True, text=True,
                           timeout=120)
    assert plain.returncode == 2 and "invalid choice: 'drums'" in plain.stderr, plain.stderr[-2000:]
    r = subprocess.run([py, "-m", "drums_osworld.apps.run", "--reuse", "post_setup", *args], cwd=osworld.workdir,
                       env=osworld.env(), capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    scores = json.loads([ln for ln in r.stdout.splitlines() if ln.startswith("SCORES ")][-1].split(" ", 1)[1])
    print(start_method, scores)
    assert len(scores) == 4
    assert all(s[1] == 0.0 and s[2] == 1.0 and s[3] == "drums" and s[5] == "post_setup" for s in scores), scores
    assert client.list() == []


def test_daemon_autostarts_from_the_osworld_interpreter(osworld, drums_instance):
    """OSWorld runs in an interpreter of its own, which cannot run drumsd (no pyroute2, pycriu): a
    DesktopEnv with no daemon running starts it through Drums' own interpreter."""
    from drums_core.client import Client
    from drums_core.config import VENV, Instance
    from drums_core.host.hoststate import instance_leaks
    from tests.support.suite import SPARE_SLOTS, stop_instance

    # A second instance on spare slots of this run's range (the fault-window daemon uses the first 8).
    inst = Instance(name=f"{drums_instance.name}-auto", slot_base=SPARE_SLOTS[12], slot_count=2)
    assert Client(inst, autostart=False).daemon_pid() is None
    try:
        out = osworld.run('''
            import importlib.util
            env = DesktopEnv(provider_name="drums", action_space="pyautogui", require_a11y_tree=False)
            env.reset(task_config=load_task("os/e0df059f-28a6-4169-924f-b9623e7184cc.json"))
            emit({"pyroute2_here": importlib.util.find_spec("pyroute2") is not None,
                  "daemon": env.provider.client.ping()["pid"], "score": env.evaluate()})
            env.close()
        ''', DRUMS_INSTANCE=inst.name, DRUMS_SLOT_BASE=str(inst.slot_base), DRUMS_SLOT_COUNT=str(inst.slot_count))
        assert out["pyroute2_here"] is False and out["score"] == 0.0
        argv = open(f"/proc/{out['daemon']}/cmdline", "rb").read().split(b"\0")
        assert argv[0].decode() == str(VENV / "bin/python") and b"drums_core.daemon" in argv, argv
        assert Client(inst, autostart=False).list() == []
    finally:
        stop_instance(inst)
    leaked = instance_leaks(inst)
    assert not any(leaked.values()), leaked


def test_paths_scopes_and_names():
    """``drums://<image>`` paths, the scopes snapshots live in, and post_setup names (no root needed)."""
    from drums_core.errors import InvalidArgument
    from drums_osworld.provider.images import ImageRef, parse_path
    from drums_osworld.snapshot import ReuseMode, post_setup_name

    assert [parse_path(p) for p in (None, "", "drums://default", "drums:default", "default", "drums://x1/")] == \
        ["osworld", "osworld", "default", "default", "default", "x1"]  # the OSWorld desktop unless named
    for bad in ("/vms/Ubuntu.vmx", "drums://../etc", "drums://a/b", "Ubuntu.qcow2"):
        with pytest.raises(InvalidArgument):
            parse_path(bad)
    a, b = ImageRef("default", (1920, 1080)), ImageRef("default", (1280, 720))
    assert a.scope != b.scope and a.scope.startswith("osworld:default:1920x1080:")
    assert a.setup_scope([{"type": "execute"}]) != a.setup_scope([{"type": "launch"}])
    assert a.setup_scope([]).startswith(a.scope + ":setup:") and a.private_scope("x").startswith(a.scope + ":env:")
    assert post_setup_name({"id": "e0df059f-28a6-4169-924f-b9623e7184cc"}) == \
        "post_setup:e0df059f-28a6-4169-924f-b9623e7184cc"
    assert post_setup_name({"id": "../../evil id"}).startswith("post_setup:sha-")
    assert ReuseMode.parse(None) is ReuseMode.NONE and ReuseMode.parse(" POST_SETUP ") is ReuseMode.POST_SETUP
    with pytest.raises(InvalidArgument):
        ReuseMode.parse("sometimes")
