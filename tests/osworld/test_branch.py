"""Mid-task branches through the real desktop-env 1.0.2 (acceptance 3 of issue 7).

After the setup of e0df059f an agent prefix writes a unique token to a file and starts a
long-lived Python process that seeded ``random``; the state is saved; three sibling DesktopEnvs
are restored at once. A renames correctly (1.0), B wrongly (0.0), C as A (1.0), concurrently. All
three hold the token and draw the same next number from the agent's process; hostnames and
guest-server draws differ; B's desktop never shows A's rename.
"""
from __future__ import annotations

import json

E0DF = "os/e0df059f-28a6-4169-924f-b9623e7184cc.json"

# The agent's long-lived process: seeded once; each time ~/go appears it appends its next draw,
# then removes ~/go. In that order: the reader takes ~/go's absence to mean "drawn" (removed
# first, a reader under load read the previous draw in the gap, as if the sibling had not drawn).
DRAWER = ("import os, random, time\n"
          "random.seed(20240607); [random.random() for _ in range(3)]\n"
          "home = os.path.expanduser('~')\n"
          "while True:\n"
          "    if os.path.exists(home + '/go'):\n"
          "        with open(home + '/draws', 'a') as f:\n"
          "            f.write(repr(random.random()) + '\\n')\n"
          "        os.remove(home + '/go')\n"
          "    time.sleep(0.05)\n")

SNIPPET = f'''
    import threading, uuid
    from drums_osworld.snapshot import branch, close_all

    DRAWER = {DRAWER!r}
    task = load_task({E0DF!r})
    env = DesktopEnv(provider_name="drums", action_space="pyautogui")
    env.reset(task_config=task)
    token = uuid.uuid4().hex

    # the agent prefix, as pyautogui-space steps
    env.step(f"open(__import__('os').path.expanduser('~/agent_token'), 'w').write({{token!r}})", pause=0)
    env.step(f"import subprocess, os; open(os.path.expanduser('~/drawer.py'), 'w').write({{DRAWER!r}}); "
             "subprocess.Popen(['python', os.path.expanduser('~/drawer.py')], start_new_session=True, "
             "stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)", pause=0.5)

    def draw(e):
        guest_sh(e, "touch ~/go")
        for _ in range(100):
            out = guest_sh(e, "test -e ~/go || tail -n 1 ~/draws")
            if out.strip():
                return out.strip()
            time.sleep(0.05)
        raise RuntimeError("the agent's process did not draw")

    first_draw = draw(env)                      # the process runs before the state is saved
    env._save_state("mid")
    t0 = time.monotonic()
    a, b, c = sibs = branch(env, 3, "mid")
    branch_s = time.monotonic() - t0
    res = {{"token": token, "first_draw": first_draw, "branch_s": branch_s, "sibs": {{}}}}
    for label, s in zip("ABC", sibs):
        res["sibs"][label] = {{
            "session": s.provider.desktop.id, "ip": s.vm_ip, "task": s.task_id,
            "token": guest_sh(s, "cat ~/agent_token"),
            "hostname": guest_sh(s, "hostname").strip(),
            "guest_draw": s.provider.desktop.session["timings"].get("reseed_draw"),
            "next_draw": draw(s),
            "drawer_pids": guest_sh(s, "pgrep -f '[d]rawer.py' | wc -l").strip(),
        }}
    res["parent"] = {{"hostname": guest_sh(env, "hostname").strip(), "next_draw": draw(env)}}

    actions = {{"A": "import subprocess; subprocess.run('mv ~/Desktop/todo_list_Jan_1 ~/Desktop/todo_list_Jan_2', "
                     "shell=True, check=True)",
               "B": "import subprocess; subprocess.run('mv ~/Desktop/todo_list_Jan_1 ~/Desktop/todo_list_Jan_3', "
                    "shell=True, check=True)"}}
    actions["C"] = actions["A"]
    b_seen = []
    def watch_b(stop):
        while not stop.is_set():        # B's desktop, all the while A and C act
            b_seen.append(guest_sh(b, "ls ~/Desktop"))
            time.sleep(0.05)
    stop = threading.Event()
    watcher = threading.Thread(target=watch_b, args=(stop,))
    watcher.start()
    def act(label, s):
        res["sibs"][label]["step"] = list(s.step(actions[label], pause=0.2)[1:3])
    threads = [threading.Thread(target=act, args=(label, s)) for label, s in zip("ABC", sibs)]
    for t in threads: t.start()
    for t in threads: t.join()
    scores = {{}}
    def score(label, s):
        scores[label] = s.evaluate()
    threads = [threading.Thread(target=score, args=(label, s)) for label, s in zip("ABC", sibs)]
    for t in threads: t.start()
    for t in threads: t.join()
    stop.set(); watcher.join()
    res["scores"] = scores
    res["b_listings"] = sorted(set(b_seen))
    res["listings"] = {{label: guest_sh(s, "ls ~/Desktop").split() for label, s in zip("ABC", sibs)}}
    res["parent_listing"] = guest_sh(env, "ls ~/Desktop").split()
    res["parent_score"] = env.evaluate()
    res["private_scope"] = env.provider.image_ref().private_scope(env.provider.owner)
    close_all(sibs)
    env.close()
    emit(res)
'''


def test_three_siblings_from_a_mid_task_state(osworld, client):
    out = osworld.run(SNIPPET)
    print(json.dumps(out, indent=1))
    sibs = out["sibs"]
    print(f"branch of 3 siblings (one restore call): {out['branch_s']:.3f}s")
    # each sibling its own desktop
    assert len({s["session"] for s in sibs.values()}) == 3 and len({s["ip"] for s in sibs.values()}) == 3
    assert all(s["task"] == "e0df059f-28a6-4169-924f-b9623e7184cc" for s in sibs.values())
    # the agent's state came along: the token and the seeded process, which draws the same next number
    assert all(s["token"] == out["token"] for s in sibs.values())
    assert all(s["drawer_pids"] == "1" for s in sibs.values())
    draws = {s["next_draw"] for s in sibs.values()}
    assert len(draws) == 1 and out["first_draw"] not in draws, (out["first_draw"], draws)
    assert out["parent"]["next_draw"] in draws  # the parent continues from the same state
    # the infrastructure did not: hostnames and guest-server draws differ
    hostnames = {s["hostname"] for s in sibs.values()} | {out["parent"]["hostname"]}
    assert len(hostnames) == 4, hostnames
    guest_draws = [s["guest_draw"] for s in sibs.values()]
    assert None not in guest_draws and len(set(guest_draws)) == 3, guest_draws
    # independent continuations, scored by the task's own evaluator
    assert out["scores"] == {"A": 1.0, "B": 0.0, "C": 1.0}
    assert all(s["step"] == [0, False] for s in sibs.values())
    assert out["listings"] == {"A": ["todo_list_Jan_2"], "B": ["todo_list_Jan_3"], "C": ["todo_list_Jan_2"]}
    assert not any("todo_list_Jan_2" in ls for ls in out["b_listings"]), out["b_listings"]
    assert out["parent_listing"] == ["todo_list_Jan_1"] and out["parent_score"] == 0.0
    # the state was private to the env and went with the last of them
    assert not [s for s in client.snapshots() if s["scope"] == out["private_scope"]]
    assert client.list() == []
