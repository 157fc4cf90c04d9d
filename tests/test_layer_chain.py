"""A chain of 100 checkpoints, each of a desktop restored from the one before: every link restores
the files as they were at that link, and a link others build on cannot be deleted.

Real daemon, CRIU and overlayfs. Each link adds a file, renames one of an earlier link (a rename
across layers: overlay's redirect) and deletes one (a whiteout over a lower layer), so a restore
from link k must show exactly link k's files: nothing deleted before k comes back and nothing made
after k shows. 100 layers do not fit in one ``mount(2)`` option string (a page): the root of a deep
link is mounted one layer at a time (``lowerdir+``).
"""
from __future__ import annotations

import pytest

from drums_core.errors import FailedPrecondition

SPEC = {"programs": [{"name": "xterm", "argv": ["xterm", "-xrm", "*allowTitleOps: false", "-title", "chain"]}],
        "expect_window": "chain", "dbus": False}
LINKS = 100
CHECK_AT = (1, 2, 37, 63, 99, 100)


def expected_files(k: int) -> set[str]:
    """The files under ~/chain after link k's step (the same steps as ``step``)."""
    files: set[str] = set()
    for i in range(1, k + 1):
        files.add(f"f{i}")
        if i % 3 == 0 and f"f{i - 2}" in files:
            files.discard(f"f{i - 2}")
            files.add(f"moved/f{i - 2}")
        if i % 4 == 0:
            files.discard(f"f{i - 1}")
            files.discard(f"moved/f{i - 5}")
    return files


def step(i: int) -> str:
    cmd = [f"mkdir -p ~/chain/moved && echo {i} > ~/chain/f{i}"]
    if i % 3 == 0:
        cmd.append(f"if [ -e ~/chain/f{i - 2} ]; then mv ~/chain/f{i - 2} ~/chain/moved/f{i - 2}; fi")
    if i % 4 == 0:
        cmd.append(f"rm -f ~/chain/f{i - 1} ~/chain/moved/f{i - 5}")
    return " && ".join(cmd)


def listing(client, sid: str) -> set[str]:
    out = client.exec(sid, ["bash", "-c", "cd ~/chain && find . -type f | sed 's|^./||' | sort"], user="user")
    assert out["returncode"] == 0, out
    return set(out["stdout"].split())


def test_a_chain_of_100_links_restores_from_any_link(client):
    s = client.create(SPEC)
    made: list[dict] = []
    try:
        current = s["id"]
        for i in range(1, LINKS + 1):
            res = client.exec(current, ["bash", "-c", step(i)], user="user")
            assert res["returncode"] == 0, (i, res)
            made.append(client.checkpoint(current, name=f"chain-{i}"))
            if i < LINKS:
                (r,) = client.restore(made[-1]["id"])
                current = r["id"]
        assert len(made[-1]["layers"]) == LINKS  # one layer a link (the image and code layers come on top)
        for k in CHECK_AT:
            (r,) = client.restore(made[k - 1]["id"])
            try:
                assert listing(client, r["id"]) == expected_files(k), k
                # every file keeps its link's content
                out = client.exec(r["id"], ["bash", "-c", "cat ~/chain/f* ~/chain/moved/* 2>/dev/null | sort -n | "
                                            "tail -1"], user="user")
                assert out["stdout"].strip() == str(max(int(f.rsplit("f", 1)[1]) for f in expected_files(k))), k
            finally:
                client.destroy(r["id"])
        # a link the next one builds on cannot go; the last one can
        with pytest.raises(FailedPrecondition):
            client.delete_snapshot(made[49]["id"])
        assert client.snapshot(made[49]["id"])["id"] == made[49]["id"]
    finally:
        for sess in client.list():
            client.destroy(sess["id"])
        for snap in reversed(made):
            client.delete_snapshot(snap["id"])
