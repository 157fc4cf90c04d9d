"""``drums doctor``: is this host ready to run Drums sessions?

One :class:`Check` per prerequisite, each with whether it passed, whether Drums needs it, what was
found and how to fix it. Checks that must change the system to find out (a test overlay mount, a
veth pair, a namespace) undo what they did before returning, whether they pass or not.

Output: one line per check, ``ok|FAIL|warn <name>: <detail> (fix: <fix>)``, or with ``--json``
one document ``{"ok": bool, "checks": [{"name", "ok", "required", "detail", "fix"}, ...]}``.
The exit status is 1 when a required check fails, else 0.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from .. import config
from ..reasons import Reason
from . import criu_cache, linux

PROVISION = "run scripts/provision (or `make test`) as root"
CRIU_SERIES = "4.2"
MIN_KERNEL = (5, 15)


@dataclass
class Check:
    """The outcome of one prerequisite check."""

    name: str
    ok: bool
    required: bool
    detail: str
    fix: str = ""


def _run(argv: list[str], timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout, check=False)


def _last_lines(text: str, n: int = 3) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " | ".join(lines[-n:])


def _criu_bin() -> Path:
    return Path(os.environ.get("DRUMS_CRIU", str(config.CRIU_BIN)))


def check_root() -> Check:
    euid = os.geteuid()
    return Check("root", euid == 0, True, f"euid {euid}",
                 "run as root: Drums mounts filesystems, creates namespaces and runs CRIU")


def check_kernel() -> Check:
    release = platform.release()
    m = re.match(r"(\d+)\.(\d+)", release)
    version = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
    ok = version >= MIN_KERNEL
    return Check("kernel", ok, True, f"Linux {release} (need >= {MIN_KERNEL[0]}.{MIN_KERNEL[1]}; "
                 "measured on 6.18)", "boot a newer kernel")


_NS_ARGS = {
    "user": ["--user"],
    "pid": ["--pid", "--fork"],
    "net": ["--net"],
    "mount": ["--mount"],
    "uts": ["--uts"],
    "ipc": ["--ipc"],
}


def check_namespace(kind: str) -> Check:
    name = f"namespace-{kind}"
    # Sessions live in a user namespace owned by host root (CRIU reads rlimits of uid-1000 processes there).
    required = True
    if not shutil.which("unshare"):
        return Check(name, False, required, "unshare(1) not found", "apt-get install util-linux")
    try:
        res = _run(["unshare", *_NS_ARGS[kind], "true"], timeout=10)
    except subprocess.TimeoutExpired:
        return Check(name, False, required, "unshare timed out", "check the kernel's namespace support")
    if res.returncode == 0:
        return Check(name, True, required, f"a child could unshare a new {kind} namespace")
    return Check(name, False, required, f"unshare {kind} failed: {_last_lines(res.stderr, 1)}",
                 f"enable CONFIG_{kind.upper()}_NS / lift the sysctl that blocks {kind} namespaces")


def check_overlayfs() -> Check:
    name = "overlayfs-redirect-dir"
    fix = "use a kernel with overlayfs (CONFIG_OVERLAY_FS) that accepts redirect_dir=on"
    base = Path(tempfile.mkdtemp(prefix="drums-doctor-"))
    mounted: list[Path] = []
    try:
        linux.mount("tmpfs", str(base), "tmpfs", 0, "size=4m,mode=700")
        mounted.append(base)
        linux.mount("none", str(base), None, linux.MS_PRIVATE)
        for d in ("lower/dir", "upper", "work", "merged"):
            (base / d).mkdir(parents=True)
        (base / "lower/dir/file").write_text("x")
        merged = base / "merged"
        opts = f"lowerdir={base}/lower,upperdir={base}/upper,workdir={base}/work,redirect_dir=on"
        linux.mount("overlay", str(merged), "overlay", 0, opts)
        mounted.append(merged)
        # What redirect_dir is for: renaming a directory that comes from a lower layer.
        os.rename(merged / "dir", merged / "moved")
        ok = (merged / "moved/file").read_text() == "x"
        return Check(name, ok, True, "mounted an overlay with redirect_dir=on and renamed a lower "
                     "directory in it" if ok else "renamed lower directory lost its content", fix)
    except OSError as exc:
        return Check(name, False, True, f"{exc}", fix)
    finally:
        for target in reversed(mounted):
            try:
                linux.umount(str(target))
            except OSError:
                try:
                    linux.umount(str(target), linux.MNT_DETACH)
                except OSError:
                    pass
        shutil.rmtree(base, ignore_errors=True)


def check_criu_binary() -> Check:
    path = _criu_bin()
    ok = path.is_file() and os.access(path, os.X_OK)
    detail = f"{path}" if ok else f"CRIU binary missing: {path} does not exist or is not executable"
    return Check("criu-binary", ok, True, detail, f"{PROVISION}: it installs CRIU {CRIU_SERIES}.x "
                 f"from Debian unstable into {config.CRIU_PREFIX}, rebuilt with Drums' patches")


def criu_version(path: Path) -> str | None:
    """The version CRIU reports (e.g. ``4.2.1``), or None when it cannot run."""
    try:
        res = _run([str(path), "--version"], timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"^Version:\s*(\S+)", res.stdout, re.M)
    return m.group(1) if res.returncode == 0 and m else None


def check_criu_version() -> Check:
    path = _criu_bin()
    fix = f"{PROVISION}; CRIU {CRIU_SERIES}.x is the only series that works on this kernel"
    version = criu_version(path)
    if version is None:
        return Check("criu-version", False, True, f"cannot run {path} --version", fix)
    ok = version == CRIU_SERIES or version.startswith(CRIU_SERIES + ".")
    return Check("criu-version", ok, True, f"{version} (need {CRIU_SERIES}.x)", fix)


def check_criu_check() -> Check:
    path = _criu_bin()
    fix = "see `criu check --all`; CRIU needs a kernel with CONFIG_CHECKPOINT_RESTORE and friends"
    try:
        res = _run([str(path), "check"], timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Check("criu-check", False, True, f"cannot run {path} check: {exc}", PROVISION)
    out = "\n".join(line for line in (res.stdout + res.stderr).splitlines()
                    if "RLIMIT_NOFILE" not in line)
    if res.returncode == 0:
        return Check("criu-check", True, True, _last_lines(out, 1) or "passed")
    return Check("criu-check", False, True, f"criu check failed: {_last_lines(out)}", fix)


def check_criu_kdat_cache() -> Check:
    """CRIU's kernel-feature cache (host/criu_cache.py): without it every restore and dump probes
    the kernel again (30 to 50 ms each). Not required: CRIU works without it."""
    st = criu_cache.status(_criu_bin())
    state = st["state"]
    detail = {"tmpfs": "/run is a tmpfs: CRIU keeps its own cache there",
              "kept": f"{criu_cache.KDAT}, made by Drums for this boot, kernel and CRIU",
              "absent": f"no {criu_cache.KDAT} yet: the daemon makes it when it starts",
              "foreign": f"{criu_cache.KDAT} was not written by Drums (left alone)",
              "stale": f"{criu_cache.KDAT} is of another {', '.join(st.get('differs', []))}: the daemon makes "
                       "it again when it starts"}.get(state, st.get("detail", state))
    return Check("criu-kdat-cache", state in ("tmpfs", "kept", "absent", "stale"), False, detail,
                 f"remove {criu_cache.KDAT} if it is not CRIU's own, then start the daemon")


def check_pycriu() -> Check:
    fix = (f"{PROVISION}: it puts {config.PYCRIU_PATH} on the venv's path "
           "(pycriu is not on PyPI)")
    try:
        import pycriu  # noqa: F401
        from pycriu import rpc_pb2  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import failure means the same thing here
        return Check("pycriu", False, True, f"pycriu not importable from {sys.executable}: {exc}",
                     fix)
    return Check("pycriu", True, True, f"{Path(pycriu.__file__).parent}")


def _which(name: str, check_name: str, package: str, required: bool = True) -> Check:
    path = shutil.which(name)
    return Check(check_name, path is not None, required, path or f"{name} not found on PATH",
                 f"apt-get install {package}")


def check_xvfb() -> Check:
    return _which("Xvfb", "xvfb", "xvfb")


def check_window_manager() -> Check:
    return _which("openbox", "window-manager", "openbox")


def check_nftables() -> Check:
    fix = "apt-get install nftables; the kernel needs CONFIG_NF_TABLES"
    if not shutil.which("nft"):
        return Check("nftables", False, True, "nft not found on PATH", fix)
    ver = _run(["nft", "--version"], timeout=10)
    if ver.returncode != 0:
        return Check("nftables", False, True, f"nft --version failed: {_last_lines(ver.stderr)}", fix)
    tables = _run(["nft", "list", "tables"], timeout=10)
    if tables.returncode != 0:
        return Check("nftables", False, True,
                     f"{ver.stdout.strip()}, but `nft list tables` failed: "
                     f"{_last_lines(tables.stderr)}", fix)
    return Check("nftables", True, True, f"{ver.stdout.strip()}, kernel nf_tables answers")


def check_veth() -> Check:
    fix = "apt-get install iproute2; the kernel needs CONFIG_VETH"
    if not shutil.which("ip"):
        return Check("veth", False, True, "ip(8) not found", fix)
    existing = set(os.listdir("/sys/class/net"))
    for k in range(10):
        n = (os.getpid() + k) % 1000
        host, peer = f"dvhdoc{n}", f"dvpdoc{n}"  # <= 15 characters
        if host not in existing and peer not in existing:
            break
    else:
        return Check("veth", False, True, "no free dvhdoc* name", "delete stale dvhdoc*/dvpdoc* links")
    try:
        res = _run(["ip", "link", "add", host, "type", "veth", "peer", "name", peer], timeout=10)
        if res.returncode != 0:
            return Check("veth", False, True, f"ip link add veth failed: {_last_lines(res.stderr)}", fix)
        return Check("veth", True, True, f"created and deleted veth pair {host}/{peer}")
    finally:
        if os.path.exists(f"/sys/class/net/{host}"):
            _run(["ip", "link", "del", host], timeout=10)


def _mount_fstype(path: Path) -> str | None:
    target = os.path.realpath(path)
    fstype = None
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if fields[4] == target:
                fstype = fields[fields.index("-") + 1]  # the last mount on top wins
    return fstype


def check_state_dir() -> Check:
    state = config.instance_from_env().state_dir
    fix = (f"unmount what is mounted on {state} (the daemon mounts its own tmpfs there: overlay "
           "layers must not share the base root's filesystem)")
    if not state.exists():
        return Check("state-dir", True, True, f"{state} not there yet: created by the daemon "
                     "on its own tmpfs")
    fstype = _mount_fstype(state)
    if fstype == "tmpfs":
        return Check("state-dir", True, True, f"{state} is a tmpfs mountpoint")
    if fstype is None:
        return Check("state-dir", True, True, f"{state} exists, not mounted yet: the daemon "
                     "mounts its tmpfs on it when it starts")
    return Check("state-dir", False, True, f"{state} is a {fstype} mount, not tmpfs", fix)


def check_ksm() -> Check:
    ksm = Path("/sys/kernel/mm/ksm")
    if not ksm.is_dir():
        return Check("ksm", False, False, "no /sys/kernel/mm/ksm: sibling sessions will not share "
                     "memory pages", "use a kernel with CONFIG_KSM")
    try:
        run = (ksm / "run").read_text().strip()
    except OSError:
        run = "?"
    return Check("ksm", True, False, f"/sys/kernel/mm/ksm present (run={run})")


def check_cgroups() -> Check:
    """Which cgroup driver per-session limits use here (v1 hierarchies or cgroup2), or what is missing."""
    from ..session import cgroups
    from ..errors import DrumsError

    try:
        driver = cgroups.detect()
    except DrumsError as exc:
        return Check("cgroups", False, True, exc.message,
                     "mount the v1 memory, pids and cpu hierarchies, or a cgroup2 with those controllers")
    kind = "v1" if isinstance(driver, cgroups.CgroupV1Driver) else "v2"
    return Check("cgroups", True, True, f"cgroup {kind} ({', '.join(driver.roots())})")


def check_seccomp() -> Check:
    """libseccomp's Python binding, which loads every session's syscall filter."""
    try:
        from ..session import containment

        containment.seccomp_filter()
    except ImportError as exc:
        return Check("seccomp", False, True, f"cannot import seccomp: {exc}",
                     "apt-get install python3-seccomp, then rerun scripts/provision")
    return Check("seccomp", True, True, f"filter of {len(containment.DENIED_SYSCALLS)} denied syscalls builds")


def check_images() -> Check:
    """The desktop images in the store; warns when the default one is missing, stale or unusable."""
    from . import images

    built = images.list_images()
    listing = ", ".join(f"{m.name} {m.content_hash[:8]} {m.size_bytes / 2**30:.2f} GiB" for m in built)
    detail = f"{config.IMAGE_STORE}: {listing or 'no images'}"
    fix = "drums image build (as root; about 2 minutes, needs deb.debian.org and PyPI)"
    default = next((m for m in built if m.name == config.DEFAULT_IMAGE), None)
    if default is None:
        return Check("images", False, False, f"{detail}; the default image is missing", fix)
    if default.id_base != config.ID_BASE:
        return Check("images", False, False, f"{detail}; the default image was built for id base "
                     f"{default.id_base}, this host uses {config.ID_BASE}", fix + " --force")
    if images.up_to_date(images.default_spec()) is None:
        return Check("images", False, False, f"{detail}; the default image is older than its spec", fix)
    return Check("images", True, False, detail)


def _budget_check(name: str) -> Callable[[], Check]:
    """One shared kernel budget (host/kernel_budget.py): the host's limit, use now, and what the
    default instance's slots need; the pid space's shortfall is PID_BUDGET, the others HOST_BUDGET."""
    def fn() -> Check:
        from . import kernel_budget

        b = next(b for b in kernel_budget.budgets() if b.name == name)
        used = "?" if b.use is None else str(b.use)
        detail = (f"{b.sysctl.replace('/', '.')}: {used} in use of {b.limit}; {kernel_budget.HOST_SLOTS} sessions "
                  f"and the host need {b.need}")
        if b.fits:
            return Check(f"budget-{name.replace('_', '-')}", True, True, detail)
        reason = Reason.PID_BUDGET if name in ("pid_max", "threads_max") else Reason.HOST_BUDGET
        return Check(f"budget-{name.replace('_', '-')}", False, True, f"{reason}: {detail}",
                     "scripts/provision raises it (python -m drums_core.host.kernel_budget apply)")

    fn.__name__ = f"check_budget_{name}"
    return fn


def _namespace_check(kind: str) -> Callable[[], Check]:
    def fn() -> Check:
        return check_namespace(kind)

    fn.__name__ = f"check_namespace_{kind}"
    return fn


CHECKS: list[Callable[[], Check]] = [
    check_root,
    check_kernel,
    *[_namespace_check(k) for k in ("user", "pid", "net", "mount", "uts", "ipc")],
    check_overlayfs,
    check_criu_binary,
    check_criu_version,
    check_criu_check,
    check_criu_kdat_cache,
    check_pycriu,
    check_xvfb,
    check_window_manager,
    check_nftables,
    check_veth,
    check_state_dir,
    check_ksm,
    check_cgroups,
    check_seccomp,
    check_images,
    *[_budget_check(n) for n in ("inotify_instances", "inotify_watches", "fanotify_groups", "fanotify_marks",
                                 "user_namespaces", "mnt_namespaces", "net_namespaces", "pid_max", "threads_max")],
]


def run_checks() -> list[Check]:
    """Run every check in order; a check that raises is reported as failed, never skipped."""
    results = []
    for fn in CHECKS:
        try:
            results.append(fn())
        except Exception as exc:  # noqa: BLE001 - a broken check is a failed check
            name = getattr(fn, "__name__", "check").removeprefix("check_").replace("_", "-")
            results.append(Check(name, False, True, f"the check itself failed: "
                                 f"{type(exc).__name__}: {exc}", "report this as a bug"))
    return results


def format_check(c: Check) -> str:
    status = "ok" if c.ok else ("FAIL" if c.required else "warn")
    line = f"{status} {c.name}: {c.detail}"
    if not c.ok and c.fix:
        line += f" (fix: {c.fix})"
    return line


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``drums doctor`` (usage errors: one line, exit status 2)."""
    from ..cli import UsageParser

    parser = UsageParser(prog="drums doctor", description="Check this host's prerequisites for Drums "
                         "(exit status 1 when a required check fails).")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    checks = run_checks()
    ok = all(c.ok for c in checks if c.required)
    if args.json:
        json.dump({"ok": ok, "checks": [asdict(c) for c in checks]}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for c in checks:
            print(format_check(c))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
