"""Overlay roots: the desktop image layer, per-session uppers, and freezing an upper into a layer."""
from __future__ import annotations

import crypt
import os
import shutil
from pathlib import Path

from . import linux
from .config import SESSION_PASSWORD, SESSION_UID, SESSION_USER


def is_mountpoint(path: Path) -> bool:
    target = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            if line.split()[4] == target:
                return True
    return False


def ensure_tmpfs(path: Path, size: str = "50%") -> bool:
    """Mount a private tmpfs at ``path`` unless one is there. Returns True when it mounted one."""
    path.mkdir(parents=True, exist_ok=True)
    if is_mountpoint(path):
        return False
    linux.mount("tmpfs", str(path), "tmpfs", linux.MS_NOSUID | linux.MS_NODEV, f"mode=700,size={size}")
    linux.mount("none", str(path), None, linux.MS_PRIVATE)
    return True


def _rewrite(lines: list[str], name: str, uid: int, new: str) -> list[str]:
    out = []
    for line in lines:
        fields = line.split(":")
        if fields[0] == name:
            continue
        if len(fields) > 2 and fields[2].isdigit() and int(fields[2]) == uid:
            continue
        out.append(line)
    out.append(new)
    return out


def build_image_layer(layer: Path) -> None:
    """Write the image layer: user ``user`` (uid 1000, sudo with password ``password``) and its home.

    The host's own accounts stay as they are; the layer shadows /etc/passwd, group and shadow.
    """
    tmp = layer.with_name(layer.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "etc/drums").mkdir(parents=True)
    user, uid = SESSION_USER, SESSION_UID
    passwd = _rewrite(Path("/etc/passwd").read_text().splitlines(), user, uid,
                      f"{user}:x:{uid}:{uid}:Drums user:/home/{user}:/bin/bash")
    group_lines = []
    for line in Path("/etc/group").read_text().splitlines():
        fields = line.split(":")
        if fields[0] == user or (len(fields) > 2 and fields[2] == str(uid)):
            continue
        if fields[0] in ("sudo", "audio", "video", "plugdev", "netdev"):
            members = [m for m in fields[3].split(",") if m] + [user]
            fields[3] = ",".join(members)
            line = ":".join(fields)
        group_lines.append(line)
    group_lines.append(f"{user}:x:{uid}:")
    pw_hash = crypt.crypt(SESSION_PASSWORD, crypt.mksalt(crypt.METHOD_SHA512))
    shadow = [line for line in Path("/etc/shadow").read_text().splitlines() if line.split(":")[0] != user]
    passwd_names = {line.split(":")[0] for line in passwd}
    shadow = [line for line in shadow if line.split(":")[0] in passwd_names]
    shadow.append(f"{user}:{pw_hash}:19000:0:99999:7:::")
    (tmp / "etc/passwd").write_text("\n".join(passwd) + "\n")
    (tmp / "etc/group").write_text("\n".join(group_lines) + "\n")
    (tmp / "etc/shadow").write_text("\n".join(shadow) + "\n")
    os.chmod(tmp / "etc/shadow", 0o640)
    (tmp / "etc/sudoers.d").mkdir()
    (tmp / "etc/sudoers.d/drums").write_text(f"{user} ALL=(ALL:ALL) ALL\nDefaults:{user} !use_pty, !lecture\n")
    os.chmod(tmp / "etc/sudoers.d/drums", 0o440)
    for sub in ("", "Desktop", "Documents", "Downloads", ".config"):
        d = tmp / "home" / user / sub
        d.mkdir(parents=True, exist_ok=True)
        os.chown(d, uid, uid)
    xauth = tmp / "home" / user / ".Xauthority"  # pyautogui's Xlib import fails without one
    xauth.touch()
    os.chown(xauth, uid, uid)
    os.chmod(xauth, 0o600)
    for d in ("home", "etc", "etc/drums", "etc/sudoers.d"):
        os.chmod(tmp / d, 0o755)
    os.chmod(tmp / "etc/sudoers.d", 0o750)
    (tmp / ".oldroot").mkdir()
    tmp.rename(layer)


def mount_overlay(lowers: list[Path | str], upper: Path, work: Path, target: Path) -> None:
    lowerdir = ":".join(str(p) for p in lowers)
    opts = f"lowerdir={lowerdir},upperdir={upper},workdir={work},redirect_dir=on"
    linux.mount("overlay", str(target), "overlay", 0, opts)
    linux.mount("none", str(target), None, linux.MS_PRIVATE)


def unmount_tree(target: Path) -> int:
    """Unmount ``target`` and everything under it, deepest first. Returns how many were unmounted."""
    real = os.path.realpath(target)
    mounts = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4]
            if point == real or point.startswith(real + "/"):
                mounts.append(point)
    count = 0
    for point in sorted(mounts, key=len, reverse=True):
        try:
            linux.umount(point, linux.MNT_DETACH)
            count += 1
        except OSError:
            if is_mountpoint(Path(point)):
                raise
    return count


def write_session_files(root: Path, hostname: str, machine_id: str, spec_json: str | None = None) -> None:
    etc = root / "etc"
    (etc / "hostname").write_text(hostname + "\n")
    (etc / "hosts").write_text(f"127.0.0.1\tlocalhost\n127.0.1.1\t{hostname}\n::1\tlocalhost ip6-localhost\n")
    mid = etc / "machine-id"
    if mid.is_symlink():
        mid.unlink()
    mid.write_text(machine_id + "\n")
    if spec_json is not None:
        (etc / "drums").mkdir(exist_ok=True)
        (etc / "drums/session.json").write_text(spec_json)


def dir_size(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total
