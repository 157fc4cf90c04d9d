"""Desktop images: root filesystems Drums builds from Debian packages, the lowest layer of a session.

A session never sees the host's ``/``: its lowest overlay layer is an image built here with
``mmdebstrap`` (or derived from another image), customised (user ``user``, sudo, locales, the guest
Python environment) and then id-shifted so that it is owned by the ids a session's user namespace
maps onto (``config.ID_BASE`` + 0..65535).

Store layout (``config.IMAGE_STORE``, a disk filesystem, never a tmpfs)::

    <store>/<name>/rootfs/          the image's root filesystem (ids shifted by ID_BASE)
    <store>/<name>/manifest.json    written last, inside the build directory: the commit marker
    <store>/<name>/build.log        what the build's tools printed
    <store>/.locks/<name>           flock: one build or removal of <name> at a time (a derived
                                    build holds its base's lock shared while it copies it)
    <store>/.locks/<name>@use       flock: shared by :func:`mounting` while a session mounts the
                                    image, exclusive while a rebuild or removal checks for mounts
                                    and swaps the image out (no name contains '@')
    <store>/.build-<name>-<rand8>/  a build (or a removal) in progress
    <store>/.staged-<name>/         a complete build that could not replace <name> because a
                                    session used it; the next build of the same spec swaps it in

A build happens in ``.build-<name>-<rand8>`` and is swapped onto ``<name>`` with one
``renameat2(RENAME_EXCHANGE)`` (or a rename when there is no old image) only when complete, so a
half-built image is never visible. Everything a build runs (mmdebstrap, the copy of a base, chroot
commands) runs in its own pid namespace, and what mounts (mmdebstrap, chroot commands) in its own
mount namespace, tied to the builder's life (parent-death signal, ``unshare --kill-child``): a
killed builder leaves no process and no mount, only a ``.build-*`` directory that the next build of
that name removes. Chroot commands pivot into the image's root (``image_root``), so their namespace
holds no copy of the host's other mounts. Names never start with ``.``, so they cannot collide.

Identity:

- ``spec_hash`` = sha256 of the canonical spec JSON, the recipe (customisation version, guest pip
  pins, Debian suites), the base image's ``content_hash`` (derived images) and the sha256 of each
  ``files`` source's content. An unchanged ``spec_hash`` (with the same ``id_base``) makes a
  rebuild a no-op unless forced.
- ``content_hash`` = sha256 of ``spec_hash`` and the sorted ``package=version`` list that dpkg
  reports in the built image. It identifies what is in the image without reading its 1.3 GB:
  two builds of one spec that resolved to the same Debian package versions get the same hash.

Errors: bad specs and names are :class:`InvalidArgument`, a missing image :class:`NotFound`, an
image in use or built for another id base :class:`FailedPrecondition`, a failed build
:class:`Unavailable` (its build directory is removed, the previous image is untouched).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import time
from contextlib import nullcontext
from typing import Any

from .. import config
from ..errors import DrumsError, FailedPrecondition, InvalidArgument
from ..reasons import Reason
from . import linux
from .idshift import ShiftReport, shift_ids
from .image_hash import content_hash, spec_hash, up_to_date
from .image_recipe import Builder, dpkg_packages, make_rootfs, verify_guest
from .image_spec import (DEBIAN_BASE, DEFAULT_PACKAGES, FileSpec, ImageSpec, builtin_spec, default_spec, load_spec,
                         register_spec)
from .image_store import (Manifest, Progress, check_usable, get, image_dir, list_images, locked, mounting,
                          new_build_dir, read_manifest, refuse_if_used, remove, remove_stale_builds, rootfs_path,
                          staged_dir, store, swap_in, users_of)

__all__ = ["DEBIAN_BASE", "DEFAULT_PACKAGES", "FileSpec", "ImageSpec", "Manifest", "ShiftReport", "build",
           "build_parser", "builtin_spec", "check_usable", "content_hash", "default_spec", "get", "list_images",
           "load_spec", "main", "mounting", "register_spec", "remove", "rootfs_path", "shift_ids", "spec_hash",
           "store", "up_to_date", "users_of"]

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------ build
def human_size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"



def _assemble(b: Builder, digest: str, t0: float) -> Manifest:
    guest_pip = verify_guest(b)
    packages = dpkg_packages(b)
    b.say("shifting ids ...")
    shift = shift_ids(b.rootfs, config.ID_BASE)
    b.say(f"shifted {shift.files} files in {shift.seconds:.1f}s")
    return Manifest(name=b.spec.name, spec=b.spec.to_json(), base=b.spec.base, id_base=config.ID_BASE,
                    packages=packages, size_bytes=shift.size_bytes, files_count=shift.files,
                    build_seconds=round(time.monotonic() - t0, 1),
                    built_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    spec_hash=digest, content_hash=content_hash(digest, packages),
                    shift_seconds=round(shift.seconds, 2), guest_pip=guest_pip,
                    file_caps=[{**c, "path": "/" + os.path.relpath(c["path"], b.rootfs)} for c in shift.caps])



def _commit(b: Builder, m: Manifest) -> None:
    """Write the manifest last, flush to disk, then swap the image in (or keep it staged, if in use)."""
    tmp = b.dir / "manifest.json.tmp"
    tmp.write_text(json.dumps(m.to_json(), indent=1, sort_keys=True) + "\n")
    os.rename(tmp, b.dir / "manifest.json")
    linux.syncfs(b.dir)  # the rootfs's data reaches the disk before the image becomes visible
    try:
        swap_in(b.spec.name, b.dir)
    except FailedPrecondition as exc:
        staged = staged_dir(b.spec.name)
        shutil.rmtree(staged, ignore_errors=True)
        os.rename(b.dir, staged)
        exc.message += (f"; the new build is kept: run the same `drums image build` again when no session uses "
                        f"{b.spec.name!r} and it is swapped in at once")
        raise


def _try_staged(spec: ImageSpec, say: Progress, force: bool) -> Manifest | None:
    """Swap in a complete build of this very spec that was kept because the image was in use."""
    staged = staged_dir(spec.name)
    m = read_manifest(staged / "manifest.json")
    if m is None or force or m.id_base != config.ID_BASE or m.spec_hash != spec_hash(spec):
        if staged.exists():
            shutil.rmtree(staged)
        return None
    say(f"[image] {spec.name}: swapping in the kept build (content {m.content_hash[:8]})")
    swap_in(spec.name, staged)
    return m


def build(spec: ImageSpec, progress: Progress | None = None, force: bool = False) -> Manifest:
    """Build ``spec`` into the store (a no-op when its spec hash is unchanged, unless ``force``)."""
    say = progress or log.info
    spec.validate()
    if os.geteuid() != 0:
        raise FailedPrecondition("building an image needs root (mmdebstrap, chroot, chown)",
                                 reason=Reason.NOT_ROOT)
    if spec.derived:
        get(spec.base)  # NotFound (saying how to build it) before anything is created
    store().mkdir(parents=True, exist_ok=True)
    with locked(spec.name, progress=say):
        remove_stale_builds(spec.name, say)
        current = None if force else up_to_date(spec)
        if current is not None:
            say(f"[image] {spec.name}: unchanged (content {current.content_hash[:8]}); --force rebuilds")
            return current
        if image_dir(spec.name).exists():
            refuse_if_used(spec.name, "rebuild")
        return _try_staged(spec, say, force) or _build_locked(spec, say)


def _build_locked(spec: ImageSpec, say: Progress) -> Manifest:
    # A derived build holds its base's lock (shared) throughout: the base's content hash in the
    # spec hash is that of the tree it copies.
    with locked(spec.base, shared=True, progress=say) if spec.derived else nullcontext():
        t0 = time.monotonic()
        digest = spec_hash(spec)
        b = Builder(spec, new_build_dir(spec.name), say)
        try:
            make_rootfs(b)
            m = _assemble(b, digest, t0)
            _commit(b, m)
        except BaseException:
            shutil.rmtree(b.dir, ignore_errors=True)
            raise
    say(f"[image] {spec.name}: done in {m.build_seconds:.1f}s, {human_size(m.size_bytes)}, "
        f"content {m.content_hash[:8]}")
    return m


# -------------------------------------------------------------------------------------------- CLI
def _row(m: Manifest) -> dict[str, str]:
    return {"name": m.name, "content": m.content_hash[:12], "size": human_size(m.size_bytes),
            "packages": str(len(m.packages)), "base": m.base, "id_base": str(m.id_base),
            "built_at": m.built_at}


def _table(rows: list[dict[str, str]]) -> str:
    if not rows:
        return "(no images; build the default one with `drums image build`)"
    cols = list(rows[0])
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in cols}
    lines = ["  ".join(c.upper().ljust(widths[c]) for c in cols)]
    lines += ["  ".join(r[c].ljust(widths[c]) for c in cols) for r in rows]
    return "\n".join(lines)


def _cmd_build(args: argparse.Namespace) -> tuple[Any, str]:
    if args.spec:
        spec = load_spec(args.spec)
        if args.name and args.name != spec.name:
            raise InvalidArgument(f"the spec file names image {spec.name!r}, not {args.name!r}",
                                  reason=Reason.INVALID_IMAGE_SPEC)
    else:
        spec = builtin_spec(args.name or config.DEFAULT_IMAGE)
    before = None if args.force else up_to_date(spec)
    m = build(spec, progress=lambda line: print(line, file=sys.stderr, flush=True), force=args.force)
    built = before is None or before.built_at != m.built_at
    human = (f"{m.name}: built in {m.build_seconds:.1f}s, {human_size(m.size_bytes)}, content {m.content_hash[:8]}"
             if built else f"{m.name}: unchanged, content {m.content_hash[:8]}, {human_size(m.size_bytes)}")
    return {"built": built, "image": m.to_json()}, human


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``drums image`` (usage errors: one line, exit status 2)."""
    from ..cli import UsageParser

    parser = UsageParser(prog="drums image", description="desktop images built from Debian packages")
    parser.add_argument("--json", action="store_true", help="print a JSON document")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print a JSON document")
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    b = sub.add_parser("build", parents=[common], help="build an image (the default one unless NAME/--spec)")
    b.add_argument("name", nargs="?", help="the image to build (default: default; osworld: OSWorld's applications)")
    b.add_argument("--spec", metavar="FILE", help="a JSON image spec file")
    b.add_argument("--force", action="store_true", help="rebuild even when the spec is unchanged")
    sub.add_parser("ls", parents=[common], help="list built images")
    r = sub.add_parser("rm", parents=[common], help="remove an image no session uses")
    r.add_argument("name", help="the image to remove")
    return parser


def main(argv: list[str] | None = None) -> int:
    """``drums image build|ls|rm`` (also ``python -m drums_core.host.images``)."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.cmd == "build":
            data, human = _cmd_build(args)
        elif args.cmd == "ls":
            images = list_images()
            data, human = [m.to_json() for m in images], _table([_row(m) for m in images])
        else:
            remove(args.name, progress=lambda line: print(line, file=sys.stderr, flush=True))
            data, human = {"removed": args.name}, f"removed image {args.name}"
    except DrumsError as exc:
        from ..cli import report_error

        return report_error(exc, args.json, "drums image")
    print(json.dumps(data, indent=1) if args.json else human)
    return 0


if __name__ == "__main__":
    sys.exit(main())
