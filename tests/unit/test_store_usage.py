"""What a layer occupies (drums_core.store.usage): blocks of each inode once, no symlink followed, a
tree deeper than PATH_MAX measured whole, the walk's bounds, and the charge of a layer cut short."""
from __future__ import annotations

import os

from drums_core.store.usage import INODE_COST, LINK_COST, Usage, occupied, snapshot_usage

MiB = 1 << 20


def _blocks(path) -> int:
    return os.lstat(path).st_blocks * 512


def test_sparse_and_hard_linked_files_cost_what_they_occupy(tmp_path):
    layer = tmp_path / "layer"
    layer.mkdir()
    with open(layer / "sparse", "wb") as f:
        f.truncate(8 << 40)  # 8 TiB: every filesystem here holds that sparse
        f.seek(4 << 40)
        f.write(b"x" * 4096)
    (layer / "linked").write_bytes(os.urandom(4 * MiB))
    for i in range(300):
        os.link(layer / "linked", layer / f"link{i}")
    u = occupied(layer)
    want = _blocks(layer) + _blocks(layer / "sparse") + _blocks(layer / "linked")
    assert u.complete and u.blocks == want, (u, want)
    assert (u.inodes, u.entries) == (3, 303)
    assert u.apparent == (8 << 40) + 301 * 4 * MiB  # what st_size claims
    assert u.charge == want + 3 * INODE_COST + 300 * LINK_COST


def test_no_symlink_is_followed_and_a_tree_deeper_than_path_max_is_counted(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "big").write_bytes(b"y" * (2 * MiB))
    layer = tmp_path / "layer"
    layer.mkdir()
    os.symlink(outside, layer / "to-outside")
    os.symlink(outside / "big", layer / "to-big")
    fd = os.open(layer, os.O_RDONLY)
    try:
        for _ in range(300):  # 300 x 21 bytes: deeper than PATH_MAX (4096)
            os.mkdir("d" * 20, dir_fd=fd)
            sub = os.open("d" * 20, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = sub
        w = os.open("hidden", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd)
        os.write(w, b"z" * MiB)
        os.close(w)
    finally:
        os.close(fd)
    u = occupied(layer)
    assert u.complete, u
    assert MiB <= u.blocks < 2 * MiB + 310 * 8192, u  # the deep file counted, the symlinks' targets not
    assert u.inodes == 1 + 2 + 300 + 1


def test_the_walk_stops_at_its_bounds_and_says_so(tmp_path):
    for i in range(3000):
        (tmp_path / f"f{i}").touch()
    u = occupied(tmp_path, max_entries=100)
    assert not u.complete and u.entries == 100 and "names" in u.why
    u = occupied(tmp_path, seconds=0.0)
    assert not u.complete and "walk over" in u.why
    assert occupied(tmp_path / "absent") == Usage()


def test_a_layer_cut_short_is_charged_what_the_upper_held(tmp_path):
    snap = tmp_path / "snap"
    (snap / "images").mkdir(parents=True)
    (snap / "images" / "pages-1.img").write_bytes(b"p" * MiB)
    (snap / "layer").mkdir()
    for i in range(50):
        (snap / "layer" / f"f{i}").touch()
    whole = snapshot_usage(snap)
    assert whole["basis"] == "blocks" and whole["layer"]["complete"]
    assert whole["size"] == whole["images"]["charge"] + whole["layer"]["charge"]
    held = Usage(blocks=64 * MiB, inodes=51, entries=51)
    cut = snapshot_usage(snap, upper_fallback=held, max_entries=10)
    assert not cut["layer"]["complete"] and "cut short" in cut["basis"]
    assert cut["layer"]["charged"] == held.charge
