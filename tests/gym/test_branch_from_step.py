"""Branch from any step: a 10-step trajectory of a real task, recorded with a checkpoint after each
step, then 3 siblings from step 4 and 3 from step 8.

Real daemon, CRIU, Xvfb and LibreOffice Writer (the task ``drums-writer-type-and-save``). Step 1
starts a seeded process in the desktop (a random generator seeded once, answering each connection
with its next draw); every step then writes, renames and deletes files. Right after steps 4 and 8
the test reads the original desktop's state: its files (names and contents), its window titles and
the seeded process's next draw. Each sibling must show exactly that state (so its draw is the one
the original made after that step: the generator's memory came back), while its hostname and
machine id differ from the original's and from every other sibling's (the reseed). After the
episode, a new ``reset`` deletes the last episode's step checkpoints, and ``close`` the rest.
"""
from __future__ import annotations

import json

import pytest

from drums_osworld.gym.env import DrumsDesktopEnv
from drums_osworld.tasks import tasks_dir

from tests.support.gymlib import snapshot_ids

WRITER_TASK = tasks_dir() / "libreoffice_writer" / "drums-writer-type-and-save.json"
PORT = 7719
SEEDED = f"""
import random, socket
random.seed(20261203)
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", {PORT}))
s.listen(8)
while True:
    c, _ = s.accept()
    c.sendall(repr(random.random()).encode())
    c.close()
"""
START_SEEDED = (
    "import subprocess, pathlib\n"
    f"pathlib.Path('/home/user/seeded.py').write_text({SEEDED!r})\n"
    "subprocess.Popen(['python3', '/home/user/seeded.py'], start_new_session=True,"
    " stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
    "import time, socket\n"
    "for _ in range(100):\n"
    "    try:\n"
    f"        socket.create_connection(('127.0.0.1', {PORT}), timeout=1).close(); break\n"
    "    except OSError:\n"
    "        time.sleep(0.05)\n"
)
# the first connection above took draw 1; the test's reads take the next ones

STATE = f"""
import hashlib, json, os, socket, subprocess
work = '/home/user/work'
files = {{}}
for root, _, names in os.walk(work):
    for n in names:
        p = os.path.join(root, n)
        files[os.path.relpath(p, work)] = hashlib.sha256(open(p, 'rb').read()).hexdigest()
titles = subprocess.run(['wmctrl', '-l'], capture_output=True, text=True).stdout.splitlines()
titles = sorted(' '.join(line.split()[3:]) for line in titles)
c = socket.create_connection(('127.0.0.1', {PORT}), timeout=5)
draw = c.recv(64).decode()
c.close()
ident = [open('/proc/sys/kernel/hostname').read().strip(), open('/etc/machine-id').read().strip()]
print(json.dumps({{'files': files, 'titles': titles, 'draw': draw, 'identity': ident}}))
"""


def step_action(i: int) -> str:
    """Step ``i``'s file work: a new file each step, a rename every third step, a deletion every fourth."""
    code = ["import os", "os.makedirs('/home/user/work/sub', exist_ok=True)",
            f"open('/home/user/work/s{i}.txt', 'w').write('step {i} ' * {i})"]
    if i % 3 == 0:
        code.append(f"os.rename('/home/user/work/s{i - 1}.txt', '/home/user/work/sub/r{i - 1}.txt')")
    if i % 4 == 0:
        code.append(f"os.remove('/home/user/work/s{i - 2}.txt') if os.path.exists('/home/user/work/s{i - 2}.txt') "
                    "else None")
    return "\n".join(code)


def read_state(env: DrumsDesktopEnv) -> dict:
    res = env.desktop.guest.execute(["python3", "-c", STATE])
    assert res.returncode == 0, res.error
    return json.loads(res.output)


def test_branch_3_siblings_from_step_4_and_3_from_step_8(client) -> None:
    before = snapshot_ids(client)
    env = DrumsDesktopEnv(task=WRITER_TASK, client=client, record_steps=True, max_steps=20, pause=0.0)
    siblings: list[DrumsDesktopEnv] = []
    try:
        _, info = env.reset()
        assert "checkpoint" in info and env.trajectory_steps == [0]
        seen: dict[int, dict] = {}
        for i in range(1, 11):
            action = START_SEEDED + "\n" + step_action(i) if i == 1 else step_action(i)
            _, reward, terminated, truncated, info = env.step(action)
            assert not (terminated or truncated) and reward == 0.0
            assert info["checkpoint"]["seconds"] > 0, info
            if i in (4, 8):
                seen[i] = read_state(env)
        assert env.trajectory_steps == list(range(11))
        # the deletions and renames did happen in the original
        assert "s2.txt" not in seen[4]["files"] and "sub/r2.txt" in seen[4]["files"]
        assert "s6.txt" not in seen[8]["files"] and "sub/r5.txt" in seen[8]["files"]
        assert seen[4]["draw"] != seen[8]["draw"]
        assert any("LibreOffice Writer" in t for t in seen[4]["titles"]), seen[4]["titles"]

        with pytest.raises(ValueError, match="not recorded"):
            env.branch(step=11, n=1)
        with pytest.raises(ValueError, match="exactly one"):
            env.branch("x", 1, step=4)

        identities = {tuple(read_state(env)["identity"])}
        for k in (4, 8):
            group = env.branch(step=k, n=3)
            siblings += group
            for sib in group:
                assert sib.step_count == k and len(sib.action_history) == k
                got = read_state(sib)
                assert got["files"] == seen[k]["files"], (k, got["files"], seen[k]["files"])
                assert got["titles"] == seen[k]["titles"], (k, got["titles"])
                assert got["draw"] == seen[k]["draw"], (k, got["draw"], seen[k]["draw"])
                identities.add(tuple(got["identity"]))
            # a sibling's episode goes on: one more step, and it records its own checkpoint
            _, _, _, _, info = group[0].step(step_action(k + 1))
            assert info["checkpoint"]["snapshot"] not in before and group[0].trajectory_steps == [k + 1]
        assert len(identities) == 7, identities  # the original and 6 siblings: all reseeded apart
        hostnames = {h for h, _ in identities}
        assert len(hostnames) == 7

        for sib in siblings:
            sib.close()
        siblings = []
        during = snapshot_ids(client) - before
        assert len(during) >= 11, during
        # a new episode: the last one's step checkpoints go (no sibling stands on them any more)
        env.reset()
        assert env.trajectory_steps == [0]
        after_reset = snapshot_ids(client) - before
        assert len(after_reset) == 1, after_reset  # the new episode's step 0, nothing else
    finally:
        for sib in siblings:
            sib.close()
        env.close()
    assert snapshot_ids(client) == before
