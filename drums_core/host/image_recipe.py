"""How an image's root filesystem is made (the recipe): ``mmdebstrap`` of Debian (or a copy of the base
image, ids shifted down), packages, the customisation (user, sudo, locales, the guest Python
environment), files, commands, cleanup; then the guest environment is checked and dpkg's package
list read. Every tool runs in its own pid and mount namespaces tied to the builder's life.
:func:`recipe` is what of all this enters an image's ``spec_hash``."""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

from .. import config
from ..errors import FailedPrecondition, Internal, Unavailable
from ..reasons import Reason
from . import linux, mounttable
from .idshift import shift_ids
from .image_spec import DEBIAN_BASE, ImageSpec
from .image_store import Progress, get, rootfs_path

SUITE = "bookworm"
MIRROR_LINES = (
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
)
# Part of every spec_hash (with the customisation's own text): bump it to rebuild every image.
RECIPE_VERSION = 2  # 2: no device nodes in /dev but the six a session has
# The guest environment's PyPI packages, pinned with their closure (installed with --no-deps; the
# rest comes from Debian through --system-site-packages).
GUEST_PIP = (
    "PyAutoGUI==0.9.54", "PyMsgBox==2.0.1", "PyScreeze==1.0.1", "pytweening==1.2.0",
    "PyGetWindow==0.0.9", "PyRect==0.2.0", "MouseInfo==0.1.3", "pyperclip==1.11.0",
)
# Packages the customisation itself needs; added to every from-scratch build.
CUSTOMISE_PACKAGES = ("sudo", "locales", "python3", "python3-venv", "ca-certificates")
# Debian package providing a module -> the module, checked in the guest venv after a build.
_MODULE_OF = {"python3-flask": "flask", "python3-xlib": "Xlib", "python3-pil": "PIL",
              "python3-numpy": "numpy", "python3-requests": "requests", "python3-tk": "tkinter"}
HOME_DIRS = ("Desktop", "Documents", "Downloads", "Pictures", "Music", "Videos", ".config")
_TAIL = 30


def recipe() -> dict[str, Any]:
    # The customisation script's text is in it too: editing it rebuilds images without a version bump.
    return {"version": RECIPE_VERSION, "guest_pip": list(GUEST_PIP), "mirrors": list(MIRROR_LINES),
            "customise_packages": list(CUSTOMISE_PACKAGES), "customise": _customise_script(),
            "finish": _FINISH_SCRIPT}



# -------------------------------------------------------------------------------- running things
def _set_pdeathsig() -> None:
    linux.prctl(linux.PR_SET_PDEATHSIG, 9)  # SIGKILL
    if os.getppid() == 1:  # the parent died before the prctl
        os._exit(1)


# Runs in fresh pid + mount namespaces (unshare --kill-child): mounts and processes die with it.
# The root becomes the namespace's own (image_root), so the namespace holds no other mount.
_CHROOT_SETUP = r"""
root=$1 network=$2 cmd=$3 python=$4 package_root=$5
mount --bind "$root" "$root"
mount -t proc proc "$root/proc"
# The kernel's settings are the host's: a package's maintainer script that applies its sysctl.d
# (tracker-miner-fs runs systemd-sysctl 30-tracker.conf) must not change them.
mount --bind "$root/proc/sys" "$root/proc/sys"
mount -o remount,bind,ro "$root/proc/sys"
mount --rbind /sys "$root/sys"
mount --rbind /dev "$root/dev"
if [ "$network" = 1 ]; then
    [ -e "$root/etc/resolv.conf" ] || : >"$root/etc/resolv.conf"
    mount --bind /etc/resolv.conf "$root/etc/resolv.conf"
    # Downloads trust what the host trusts (it may reach PyPI through a TLS-inspecting proxy);
    # the image keeps its own bundle: this bind ends with the namespace.
    bundle=/etc/ssl/certs/ca-certificates.crt
    if [ -f "$bundle" ] && [ -f "$root$bundle" ] && [ ! -L "$root$bundle" ]; then
        mount --bind "$bundle" "$root$bundle"
    fi
fi
exec "$python" -I -c 'import sys; sys.path.insert(0, sys.argv[1]); from drums_core.host import image_root
image_root.main(sys.argv[2:])' "$package_root" "$root" "$cmd"
"""

_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C.UTF-8",
        "DEBIAN_FRONTEND": "noninteractive", "HOME": "/root", "PIP_NO_CACHE_DIR": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_ROOT_USER_ACTION": "ignore", "PIP_NO_INPUT": "1"}


def _env() -> dict[str, str]:
    """A clean environment for build tools (nothing of the venv), keeping the host's proxies."""
    proxies = {k: v for k, v in os.environ.items() if k.lower() in ("http_proxy", "https_proxy", "no_proxy")}
    return {**_ENV, **proxies}


class Builder:
    """One build of one spec in one build directory; its log is ``<build>/build.log``."""

    def __init__(self, spec: ImageSpec, build_dir: Path, progress: Progress) -> None:
        self.spec = spec
        self.dir = build_dir
        self.rootfs = build_dir / "rootfs"
        self.progress = progress
        self.log_path = build_dir / "build.log"

    def say(self, text: str) -> None:
        self.progress(f"[image] {self.spec.name}: {text}")

    def run(self, argv: list[str], what: str, *, stdin: bytes | None = None, capture: bool = False,
            mounts: bool = True) -> str:
        """Run ``argv`` in its own pid namespace, and with ``mounts`` its own mount namespace (its mounts
        end with it); output to the build log (or returned). A mount namespace starts as a copy of
        every host mount and holds it while the step runs (the host's mounts are private here: an
        unmount on the host does not reach the copy), so a step that mounts nothing goes without."""
        own_mounts = ["--mount", "--propagation", "private"] if mounts else []
        full = ["unshare", "--pid", "--kill-child=SIGKILL", *own_mounts, "--", *argv]
        with open(self.log_path, "ab") as logf:
            logf.write(f"\n### {what}\n".encode())
            logf.flush()
            proc = subprocess.run(full, input=stdin, stdin=None if stdin is not None else subprocess.DEVNULL,
                                  stdout=subprocess.PIPE if capture else logf, stderr=logf, env=_env(),
                                  preexec_fn=_set_pdeathsig, check=False)
        if proc.returncode != 0:
            tail = self.log_path.read_text(errors="replace").splitlines()[-_TAIL:]
            raise Unavailable(f"building image {self.spec.name!r} failed at {what} (exit {proc.returncode}); "
                              f"log: {self.log_path}: {' | '.join(tail[-3:])}",
                              reason=Reason.IMAGE_BUILD_FAILED, detail=tail)
        return proc.stdout.decode() if capture else ""

    def chroot(self, script: str, what: str, *, network: bool = False, stdin: bytes | None = None,
               capture: bool = False, args: tuple[str, ...] = ()) -> str:
        if args:  # positional parameters for the script inside the chroot
            script = f"set -- {' '.join(_sh_quote(a) for a in args)}\n{script}"
        argv = ["sh", "-ec", _CHROOT_SETUP, "drums-chroot", str(self.rootfs), "1" if network else "0", script,
                sys.executable, str(Path(__file__).resolve().parents[2])]  # this drums_core's image_root
        return self.run(argv, what, stdin=stdin, capture=capture)


def _sh_quote(s: str) -> str:
    return "'" + s.replace("'", "'\"'\"'") + "'"


# ---------------------------------------------------------------------------------- build steps
# mmdebstrap (root mode) mounts the host's /proc into its chroot before it extracts the packages;
# from then until its customize hooks, /proc/sys there is read-only, so no maintainer script can
# change a host kernel setting (as the chroot steps above; mmdebstrap unmounts only what it mounted).
_PROC_SYS_READ_ONLY_HOOKS = (
    '--extract-hook=mount --bind "$1/proc/sys" "$1/proc/sys" && mount -o remount,bind,ro "$1/proc/sys"',
    '--customize-hook=umount "$1/proc/sys"',
)


def _debootstrap(b: Builder) -> None:
    if shutil.which("mmdebstrap", path=_ENV["PATH"]) is None:
        raise FailedPrecondition("mmdebstrap is not installed (apt-get install mmdebstrap, or run scripts/provision)",
                                 reason=Reason.MMDEBSTRAP_MISSING)
    packages = sorted(set(b.spec.packages) | set(CUSTOMISE_PACKAGES))
    b.say(f"mmdebstrap {SUITE} (packages: {len(packages)}) ...")
    b.run(["mmdebstrap", "--mode=root", "--variant=apt", "--format=directory",
           f"--include={','.join(packages)}",
           "--dpkgopt=path-exclude=/usr/share/doc/*", "--dpkgopt=path-include=/usr/share/doc/*/copyright",
           "--dpkgopt=path-exclude=/usr/share/man/*", "--dpkgopt=path-exclude=/usr/share/info/*",
           '--aptopt=Acquire::Retries "3"', *_PROC_SYS_READ_ONLY_HOOKS, SUITE, str(b.rootfs), *MIRROR_LINES],
          "mmdebstrap")


def _copy_base(b: Builder) -> None:
    b.say(f"copying image {b.spec.base} ...")
    base = rootfs_path(b.spec.base)  # the caller holds the base's lock, shared
    b.run(["cp", "-a", "--reflink=auto", str(base), str(b.rootfs)], f"copy of image {b.spec.base}", mounts=False)
    b.say("unshifting ids ...")
    shift_ids(b.rootfs, -config.ID_BASE)


def _install_packages(b: Builder) -> None:
    if not b.spec.packages:
        return
    b.say(f"apt-get install (packages: {len(b.spec.packages)}) ...")
    script = ("printf '#!/bin/sh\\nexit 101\\n' >/usr/sbin/policy-rc.d; chmod 755 /usr/sbin/policy-rc.d\n"
              "apt-get update\n"
              'apt-get install -y --no-install-recommends "$@"\n'
              "rm -f /usr/sbin/policy-rc.d\n")
    b.chroot(script, "apt-get install", network=True, args=b.spec.packages)


def _customise_script() -> str:
    homes = " ".join(HOME_DIRS)
    pins = " ".join(GUEST_PIP)
    uid = config.SESSION_UID
    user = config.SESSION_USER
    return f"""
printf 'en_US.UTF-8 UTF-8\\nC.UTF-8 UTF-8\\n' >/etc/locale.gen
locale-gen
printf 'LANG=en_US.UTF-8\\n' >/etc/default/locale
getent group {user} >/dev/null || groupadd -g {uid} {user}
id -u {user} >/dev/null 2>&1 || useradd -u {uid} -g {uid} -m -d /home/{user} -s /bin/bash {user}
usermod -a -G sudo,audio,video {user}
echo '{user}:{config.SESSION_PASSWORD}' | chpasswd
printf '%s\\n' '{user} ALL=(ALL:ALL) ALL' 'Defaults:{user} !use_pty, !lecture' >/etc/sudoers.d/drums
chmod 0440 /etc/sudoers.d/drums
visudo -cf /etc/sudoers.d/drums
cd /home/{user} && mkdir -p {homes} && chown -R {uid}:{uid} /home/{user} && cd /
echo drums >/etc/hostname
printf '127.0.0.1\\tlocalhost\\n127.0.1.1\\tdrums\\n::1\\tlocalhost ip6-localhost ip6-loopback\\n' >/etc/hosts
mkdir -p /var/lib/dbus && ln -sf /etc/machine-id /var/lib/dbus/machine-id
mkdir -p {config.GUEST_CODE} /.oldroot
python3 -m venv --system-site-packages {config.GUEST_VENV}
{config.GUEST_VENV}/bin/pip install --no-deps {pins}
"""


def _customise(b: Builder) -> None:
    b.say("customising (user, sudo, locales, guest venv) ...")
    b.chroot(_customise_script(), "customisation", network=True)


def _copy_files(b: Builder) -> None:
    for f in b.spec.files:
        mode = f.mode if f.mode is not None else stat.S_IMODE(os.stat(f.src).st_mode)
        b.say(f"file {f.dest}")
        # Written from inside the chroot, so no path in the image can lead it out.
        script = 'mkdir -p "$(dirname "$1")"; cat >"$1"; chown 0:0 "$1"; chmod "$2" "$1"'
        b.chroot(script, f"file {f.dest}", stdin=Path(f.src).read_bytes(), args=(f.dest, f"{mode:o}"))


def _run_commands(b: Builder) -> None:
    for i, cmd in enumerate(b.spec.commands, 1):
        b.say(f"command {i}/{len(b.spec.commands)}: {cmd[:60]}")
        b.chroot(cmd, f"command {i}: {cmd}", network=True)


_FINISH_SCRIPT = """
apt-get clean
rm -rf /var/lib/apt/lists/* /root/.cache /tmp/* /var/tmp/*
find /var/log -type f -delete
: >/etc/machine-id
printf '# sessions have no name service\\n' >/etc/resolv.conf
"""


# The only device nodes an image keeps in /dev: a session makes these six in its upper anyway.
SESSION_DEV_NODES = frozenset({"null", "zero", "full", "random", "urandom", "tty"})


def strip_dev_nodes(rootfs: Path) -> int:
    """Remove the image's other device nodes (console, ptmx, ... from debootstrap): they would be
    the host's devices, and the overlay (index=on) could not even hide them in a session, since it
    copies a node up before removing it, which the session's devices cgroup denies.

    Done from the host on the image's own directory, after every chroot has ended: inside the
    chroot /dev is a bind of the host's /dev. Refuses anything but a plain directory on the
    image's filesystem, and never descends."""
    dev = rootfs / "dev"
    st = os.lstat(dev)
    mounted = mounttable.mounts_within(mounttable.read_mountinfo(), [os.path.realpath(dev)])
    if not stat.S_ISDIR(st.st_mode) or st.st_dev != os.lstat(rootfs).st_dev or mounted:
        raise Internal(f"{dev} is not a plain directory of the image; not touching it",
                       reason=Reason.IMAGE_BUILD_FAILED)
    removed = 0
    with os.scandir(dev) as entries:
        for entry in entries:
            mode = entry.stat(follow_symlinks=False).st_mode
            if (stat.S_ISCHR(mode) or stat.S_ISBLK(mode)) and entry.name not in SESSION_DEV_NODES:
                os.unlink(entry.path)
                removed += 1
    return removed


def _finish(b: Builder) -> None:
    b.say("cleaning apt caches ...")
    b.chroot(_FINISH_SCRIPT, "cleanup")
    b.say(f"removed {strip_dev_nodes(b.rootfs)} device node(s) from /dev")


def verify_guest(b: Builder) -> dict[str, str]:
    """Check the guest environment imports; return its pip packages {name: version}."""
    modules = ["pyscreeze", "pymsgbox", "pytweening"] + [m for p, m in _MODULE_OF.items() if p in _all_packages(b)]
    # pyautogui itself needs a display to import; its files must be there.
    script = (f"env -u DISPLAY {config.GUEST_PYTHON} -c 'import importlib.util as u, {', '.join(modules)}; "
              "assert u.find_spec(\"pyautogui\")'\n"
              f"{config.GUEST_VENV}/bin/pip list --format=json --path $({config.GUEST_PYTHON} -c "
              "'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])')")
    out = b.chroot(script, "guest environment check", capture=True)
    return {p["name"]: p["version"] for p in json.loads(out)}


def _all_packages(b: Builder) -> set[str]:
    names = set(b.spec.packages)
    base: str = b.spec.base
    while base != DEBIAN_BASE:  # a derived image has its bases' packages too
        spec = get(base).spec
        names |= set(spec.get("packages", []))
        base = spec.get("base", DEBIAN_BASE)
    return names


def dpkg_packages(b: Builder) -> dict[str, str]:
    out = b.chroot("dpkg-query -W -f '${db:Status-Abbrev}\\t${Package}\\t${Version}\\n'", "dpkg-query",
                   capture=True)
    rows = (line.split("\t") for line in out.splitlines() if line.strip())
    return {r[1]: r[2] for r in rows if len(r) == 3 and r[0].startswith("ii")}



def make_rootfs(b: Builder) -> None:
    if b.spec.derived:
        _copy_base(b)
        _install_packages(b)
    else:
        _debootstrap(b)
        _customise(b)
    _copy_files(b)
    _run_commands(b)
    _finish(b)
