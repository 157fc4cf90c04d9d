"""Short names for checkpoint layers, and the refusal of a root whose mount line CRIU could not read."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from drums_core.errors import FailedPrecondition
from drums_core.session import rootfs


def test_alias_is_short_stable_and_points_at_the_layer(tmp_path: Path) -> None:
    layer = tmp_path / "snapshots" / ("a" * 32) / "layer"
    layer.mkdir(parents=True)
    aliases = tmp_path / "L"
    first = rootfs.layer_alias(aliases, layer)
    assert rootfs.layer_alias(aliases, layer) == first and len(Path(first).name) == rootfs.ALIAS_HEX
    assert os.path.realpath(first) == str(layer)


def test_a_clashing_alias_gets_a_longer_name(tmp_path: Path) -> None:
    layer = tmp_path / "layer"
    layer.mkdir()
    aliases = tmp_path / "L"
    aliases.mkdir()
    import hashlib

    digest = hashlib.sha256(str(layer).encode()).hexdigest()
    os.symlink("/elsewhere", aliases / digest[:rootfs.ALIAS_HEX])  # taken by another layer
    got = rootfs.layer_alias(aliases, layer)
    assert Path(got).name == digest[:rootfs.ALIAS_HEX + 1] and os.readlink(got) == str(layer)


def test_prune_removes_only_aliases_of_deleted_layers(tmp_path: Path) -> None:
    kept, gone = tmp_path / "kept", tmp_path / "gone"
    kept.mkdir()
    gone.mkdir()
    aliases = tmp_path / "L"
    a, b = rootfs.layer_alias(aliases, kept), rootfs.layer_alias(aliases, gone)
    gone.rmdir()
    assert rootfs.prune_aliases(aliases) == 1
    assert os.path.lexists(a) and not os.path.lexists(b)


def test_a_root_too_deep_for_criu_is_refused_before_anything_is_mounted(tmp_path: Path) -> None:
    lowers = [f"/run/drums/some-instance/snapshots/{i:032x}/layer" for i in range(60)]
    target = tmp_path / "root"
    target.mkdir()
    with pytest.raises(FailedPrecondition) as exc:
        rootfs.mount_overlay(lowers, tmp_path / "upper", tmp_path / "work", target)
    assert exc.value.reason == "CHAIN_TOO_DEEP" and exc.value.detail["layers"] == 60
    assert not rootfs.is_mountpoint(target)
