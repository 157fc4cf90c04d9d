"""A layer shipped from another node is checked before it is used: only what a session could make."""
from __future__ import annotations

import os

import pytest

from drums_core.config import ID_BASE
from drums_core.errors import Internal
from drums_core.store.transfer import check_layer


def _layer(tmp_path):
    layer = tmp_path / "layer"
    (layer / "home/user").mkdir(parents=True)
    (layer / "home/user/notes.txt").write_text("hi")
    for p in (layer / "home", layer / "home/user", layer / "home/user/notes.txt"):
        os.lchown(p, ID_BASE + 1000, ID_BASE + 1000)
    os.symlink("/etc/shadow", layer / "home/user/link")  # a symlink is data, never followed
    os.lchown(layer / "home/user/link", ID_BASE, ID_BASE)
    return layer


def test_a_session_made_layer_passes(tmp_path):
    if os.geteuid() != 0:
        pytest.fail("needs root (chown to session ids, mknod)")
    layer = _layer(tmp_path)
    os.mknod(layer / "home/user/gone", 0o600 | 0o020000, os.makedev(0, 0))  # an overlay whiteout, root's
    check_layer(layer)


@pytest.mark.parametrize("offence", ["block", "char", "root-owned", "host-user", "xattr"])
def test_a_crafted_layer_is_refused(tmp_path, offence):
    if os.geteuid() != 0:
        pytest.fail("needs root (chown to session ids, mknod)")
    layer = _layer(tmp_path)
    bad = layer / "home/user/bad"
    if offence == "block":
        os.mknod(bad, 0o666 | 0o060000, os.makedev(8, 0))
    elif offence == "char":
        os.mknod(bad, 0o666 | 0o020000, os.makedev(1, 1))  # /dev/mem
    else:
        bad.write_text("x")
        if offence == "root-owned":
            os.chmod(bad, 0o4755)
            os.chown(bad, 0, 0)
        elif offence == "host-user":
            os.chown(bad, 1000, 1000)
        else:
            os.chown(bad, ID_BASE, ID_BASE)
            os.setxattr(bad, "trusted.evil", b"1")
    if offence in ("block", "char"):
        os.chown(bad, ID_BASE, ID_BASE)
    with pytest.raises(Internal) as err:
        check_layer(layer)
    assert err.value.reason == "BUNDLE_UNSAFE" and "bad" in err.value.message
