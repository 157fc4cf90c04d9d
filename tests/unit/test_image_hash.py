"""An image's spec hash names what would be built: the files' content and where they go, not the
host path they are read from (a fresh clone elsewhere must not rebuild an image that is there)."""
from __future__ import annotations

from drums_core.host.image_hash import spec_hash
from drums_core.host.image_spec import FileSpec, ImageSpec


def _spec(src) -> ImageSpec:
    return ImageSpec(name="hashcheck", packages=("xterm",), files=(FileSpec(str(src), "/usr/local/bin/tool", 0o755),))


def test_the_same_file_read_from_two_checkouts_is_the_same_image(tmp_path):
    a, b = tmp_path / "a" / "tool", tmp_path / "b" / "tool"
    for f in (a, b):
        f.parent.mkdir()
        f.write_text("#!/bin/sh\necho one\n")
    assert spec_hash(_spec(a)) == spec_hash(_spec(b))


def test_a_file_changed_or_put_elsewhere_in_the_image_is_another_image(tmp_path):
    f = tmp_path / "tool"
    f.write_text("#!/bin/sh\necho one\n")
    first = spec_hash(_spec(f))
    f.write_text("#!/bin/sh\necho two\n")
    assert spec_hash(_spec(f)) != first
    moved = ImageSpec(name="hashcheck", packages=("xterm",), files=(FileSpec(str(f), "/usr/bin/tool", 0o755),))
    assert spec_hash(moved) != spec_hash(_spec(f))
