"""Reuse modes through the real desktop-env 1.0.2: ``none`` and ``post_setup``, the interference
canary, and the LibreOffice Writer task reaching its window through resets and post_setup reverts.

Each test names the acceptance item of issue 7 it shows.
"""
from __future__ import annotations

import json
import statistics

E0DF = "os/e0df059f-28a6-4169-924f-b9623e7184cc.json"
WRITER = "libreoffice_writer/drums-writer-type-and-save.json"
NO_SETUP = "os/drums-os-infeasible-bluetooth.json"

# One agent loop for every mode: only the provider's reuse mode differs.
ROLLOUTS = f'''
    from drums_osworld.snapshot import set_reuse_mode
    MODE = os.environ["REUSE_MODE"]
    task = load_task({E0DF!r})
    env = DesktopEnv(provider_name="drums", action_space="pyautogui")
    set_reuse_mode(env, MODE)
    CANARY = "~/.drums_interference_canary"
    rollouts = []
    for i in range(6):
        t0 = time.monotonic()
        env.reset(task_config=task)
        reset_s = time.monotonic() - t0
        timings = dict(env.provider.timings)
        canary_seen = guest_sh(env, f"cat {{CANARY}} 2>/dev/null || true").strip()
        before = env.evaluate()
        env.step("import subprocess; subprocess.run('mv ~/Desktop/todo_list_Jan_1 ~/Desktop/todo_list_Jan_2', "
                 "shell=True, check=True)", pause=0)
        after = env.evaluate()
        # interference: written through the controller directly, not as a step
        env.controller.run_bash_script(f"echo rollout-{{i}} > {{CANARY}}")
        written = guest_sh(env, f"cat {{CANARY}}").strip()
        rollouts.append({{"reset_s": reset_s, "canary_written": written, "before": before, "after": after,
                          "canary_seen": canary_seen,
                          "session": env.provider.desktop.id, "hostname": guest_sh(env, "hostname").strip(),
                          "reverted": timings.get("reverted"), "restore_s": timings.get("start"),
                          "destroy_s": timings.get("destroy"), "saved_s": timings.get("saved_post_setup")}})
    env.close()
    emit(rollouts)
'''


def _table(mode: str, rollouts: list[dict]) -> str:
    lines = [f"reuse mode {mode}: per-rollout reset times"]
    for i, r in enumerate(rollouts, 1):
        parts = [f"  rollout {i}: reset {r['reset_s']:.3f}s"]
        if r.get("destroy_s") is not None:
            parts.append(f"destroy {r['destroy_s']:.3f}s")
        if r.get("restore_s") is not None:
            parts.append(f"restore {r['restore_s']:.3f}s")
        if r.get("saved_s") is not None:
            parts.append(f"save post_setup {r['saved_s']:.3f}s")
        parts.append(f"score {r['before']} -> {r['after']}")
        lines.append(", ".join(parts))
    return "\n".join(lines)


def test_reuse_modes_six_rollouts_with_canary(osworld, client):
    """Acceptance 2: on e0df059f, 6 rollouts under ``none`` and 6 under ``post_setup`` with the same
    scripted correct action: 0.0 before and 1.0 after on every rollout, the canary written in one
    rollout is never seen by the next, and the per-rollout reset time of each mode is printed."""
    results = {}
    for mode in ("none", "post_setup"):
        results[mode] = osworld.run(ROLLOUTS, REUSE_MODE=mode)
        print(_table(mode, results[mode]))
    for mode, rollouts in results.items():
        assert len(rollouts) == 6
        for i, r in enumerate(rollouts):
            assert (r["before"], r["after"]) == (0.0, 1.0), f"{mode} rollout {i + 1}: {r}"
            assert r["canary_written"] == f"rollout-{i}", r  # the interference really happened
            assert r["canary_seen"] == "", f"{mode} rollout {i + 1} saw the canary {r['canary_seen']!r}"
        assert len({r["session"] for r in rollouts}) == 6, f"{mode}: every rollout needs its own desktop"
        assert len({r["hostname"] for r in rollouts}) == 6, f"{mode}: reseeded hostnames"
        assert rollouts[0]["reverted"] == 0.0 and all(r["reverted"] == 1.0 for r in rollouts[1:])
    post = results["post_setup"]
    assert post[0]["saved_s"] is not None and all(r["saved_s"] is None for r in post[1:])
    none_med = statistics.median(r["reset_s"] for r in results["none"][1:])
    post_med = statistics.median(r["reset_s"] for r in post[1:])
    print(f"median reset, rollouts 2-6: none {none_med:.3f}s, post_setup {post_med:.3f}s "
          f"(ratio {none_med / post_med:.2f})")
    names = [s for s in client.snapshots() if s["name"] == "post_setup:e0df059f-28a6-4169-924f-b9623e7184cc"]
    assert len(names) == 1, names


def test_no_rollout_starts_on_a_dirty_desktop(osworld):
    """The bridge's guarantee where OSWorld's own flag is blind: changes made through env.controller
    (no step), before the first reset or during a rollout whose task has no setup, are never seen
    by the next rollout, under both modes."""
    out = osworld.run(f'''
        from drums_osworld.snapshot import set_reuse_mode
        res = {{}}
        for mode in ("none", "post_setup"):
            env = DesktopEnv(provider_name="drums", action_space="pyautogui")
            set_reuse_mode(env, mode)
            # before any reset: interference through the controller
            env.controller.execute_python_command("open('/home/user/canary0', 'w').write('x')")
            written = [guest_sh(env, "ls /home/user/canary0").strip()]
            env.reset(task_config=load_task({NO_SETUP!r}))
            seen0 = guest_sh(env, "ls /home/user/canary0 2>/dev/null || true").strip()
            # a rollout of a task without setup: OSWorld's flag stays False, then interference
            env.controller.run_python_script("open('/home/user/canary1', 'w').write('x')")
            written.append(guest_sh(env, "ls /home/user/canary1").strip())
            flag = env.is_environment_used
            env.reset(task_config=load_task({NO_SETUP!r}))
            seen1 = guest_sh(env, "ls /home/user/canary1 2>/dev/null || true").strip()
            # and a task with setup under the mode, interference by bash, then a reset without a task
            env.reset(task_config=load_task({E0DF!r}))
            env.controller.run_bash_script("touch ~/canary2")
            written.append(guest_sh(env, "ls ~/canary2").strip())
            env.reset()
            seen2 = guest_sh(env, "ls ~/canary2 2>/dev/null || true").strip()
            env.close()
            res[mode] = {{"written": written, "seen": [seen0, seen1, seen2],
                          "osworld_flag_before_second_reset": flag}}
        emit(res)
    ''')
    print(json.dumps(out))
    for mode, r in out.items():
        assert r["written"] == ["/home/user/canary0", "/home/user/canary1", "/home/user/canary2"], r
        assert r["seen"] == ["", "", ""], f"{mode}: a rollout started on a dirty desktop: {r}"
        assert r["osworld_flag_before_second_reset"] is False  # OSWorld alone would have skipped the revert


def test_writer_task_reaches_its_window_through_reset_and_post_setup(osworld):
    """Acceptance 4: the LibreOffice Writer task (setup ``launch libreoffice --writer``): a reset
    through drums reaches a ``LibreOffice Writer`` window; so do post_setup reverts, and the
    restored Writer still works (the task's reference solution scores 1.0 on one)."""
    out = osworld.run(f'''
        from drums_osworld.snapshot import set_reuse_mode
        task = load_task({WRITER!r})
        assert ["libreoffice", "--writer"] in [s["parameters"].get("command") for s in task["config"]]
        def windows(env):
            return guest_sh(env, "wmctrl -l | cut -d' ' -f5-")
        res = {{"none": [], "post_setup": []}}
        env = DesktopEnv(provider_name="drums", action_space="pyautogui", require_a11y_tree=False)
        for i in range(2):
            t0 = time.monotonic()
            env.reset(task_config=task)
            res["none"].append({{"reset_s": time.monotonic() - t0, "windows": windows(env),
                                 "session": env.provider.desktop.id}})
        set_reuse_mode(env, "post_setup")
        for i in range(3):
            t0 = time.monotonic()
            env.reset(task_config=task)
            r = {{"reset_s": time.monotonic() - t0, "windows": windows(env), "session": env.provider.desktop.id,
                  "reverted": env.provider.timings.get("reverted"),
                  "saved": env.provider.timings.get("saved_post_setup")}}
            if i == 2:
                r["before"] = env.evaluate()
                for action in task["drums_solution"]:
                    env.step(action, pause=0.5)
                r["after"] = env.evaluate()
            res["post_setup"].append(r)
        env.close()
        emit(res)
    ''', timeout=1200)
    for mode, rows in out.items():
        for i, r in enumerate(rows):
            print(f"writer {mode} reset {i + 1}: {r['reset_s']:.3f}s windows={r['windows'].splitlines()}")
            assert "LibreOffice Writer" in r["windows"], f"{mode} reset {i + 1}: no Writer window: {r}"
    post = out["post_setup"]
    assert post[0]["saved"] is not None and post[1]["saved"] is None and post[2]["saved"] is None
    assert post[1]["reverted"] == 1.0 and post[2]["reverted"] == 1.0
    assert (post[2]["before"], post[2]["after"]) == (0.0, 1.0)
    assert len({r["session"] for rows in out.values() for r in rows}) == 5
