"""An image's identity: ``spec_hash`` (what would be built: the spec, the recipe, the base image's
content, the files' content) and ``content_hash`` (what was built: the spec hash and the packages
dpkg reports); :func:`up_to_date` says whether building a spec again would change nothing."""
from __future__ import annotations

import hashlib
import json

from .. import config
from .image_recipe import recipe
from .image_spec import ImageSpec
from .image_store import Manifest, get, image_dir, read_manifest


def _sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def spec_hash(spec: ImageSpec) -> str:
    """sha256 over the canonical spec, the recipe, the base image's content and the files' content.

    A file counts by its content and where it goes in the image, not by where it is read from on the
    host: the same checkout cloned elsewhere (a fresh clone for CI) describes the same image."""
    base_content = get(spec.base).content_hash if spec.derived else None
    canonical = spec.to_json()
    canonical["files"] = [{k: v for k, v in f.items() if k != "src"} for f in canonical["files"]]
    doc = {"spec": canonical, "recipe": recipe(), "base_content_hash": base_content}
    h = hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode())
    for f in spec.files:
        h.update(_sha256_file(f.src).encode())
    return h.hexdigest()


def content_hash(spec_digest: str, packages: dict[str, str]) -> str:
    """sha256 of the spec hash and the sorted ``package=version`` list (not of the 1.3 GB of files)."""
    listing = "\n".join(sorted(f"{p}={v}" for p, v in packages.items()))
    return hashlib.sha256(f"{spec_digest}\n{listing}\n".encode()).hexdigest()


def up_to_date(spec: ImageSpec) -> Manifest | None:
    """The built image's manifest when building ``spec`` again would change nothing, else None."""
    m = read_manifest(image_dir(spec.name) / "manifest.json")
    if m is None or m.id_base != config.ID_BASE or not (image_dir(spec.name) / "rootfs").is_dir():
        return None
    return m if m.spec_hash == spec_hash(spec) else None
