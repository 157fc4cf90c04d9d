"""Where things live on a host, and the fixed conventions of a session."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from .reasons import Reason

VENV = Path(os.environ.get("DRUMS_VENV", "/opt/drums/venv"))
CRIU_PREFIX = Path(os.environ.get("DRUMS_CRIU_PREFIX", "/opt/drums/criu"))
CRIU_BIN = Path(os.environ.get("DRUMS_CRIU", str(CRIU_PREFIX / "usr/sbin/criu")))
PYCRIU_PATH = CRIU_PREFIX / "usr/lib/python3/dist-packages"
STATE_ROOT = Path(os.environ.get("DRUMS_STATE_ROOT", "/run/drums"))
X11_DIR = Path("/tmp/.X11-unix")
# Desktop images (root filesystems built from Debian packages) live on a disk filesystem, not in RAM.
IMAGE_STORE = Path(os.environ.get("DRUMS_IMAGE_STORE", "/var/lib/drums/images"))
DEFAULT_IMAGE = "default"
# Sessions' user namespaces map ids 0..ID_COUNT-1 onto host ids ID_BASE.. (unprivileged nobodies on
# the host). One range per host: snapshots carry files owned by these ids, so every instance that
# restores a snapshot must use the same base.
ID_BASE = int(os.environ.get("DRUMS_ID_BASE", "1000000000"))
ID_COUNT = 65536
# Inside every session (from the image and the Drums code layer), never host paths.
GUEST_VENV = "/usr/lib/drums/venv"
GUEST_PYTHON = f"{GUEST_VENV}/bin/python"
GUEST_CODE = "/usr/lib/drums/python"
GUEST_SITE = f"{GUEST_VENV}/lib/python3.11/site-packages"  # Debian 12's Python, in every image

SESSION_USER = "user"
SESSION_UID = 1000
SESSION_PASSWORD = "password"
SESSION_PATH = f"{GUEST_VENV}/bin:/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")


def check_name(name: str, what: str = "name") -> str:
    """Reject hostile names (path separators, '..', control characters) with InvalidArgument."""
    from .errors import InvalidArgument

    if not isinstance(name, str) or not _NAME_RE.match(name) or ".." in name:
        raise InvalidArgument(f"invalid {what} {name!r}: use letters, digits, '_', '.', ':', '-' (no '/', no '..')",
                              reason=Reason.INVALID_NAME)
    return name


@dataclass(frozen=True)
class Instance:
    """One daemon's world: its state directory, socket, slot range and nftables table."""

    name: str = "default"
    slot_base: int = 0
    slot_count: int = 64
    state_root: Path = field(default=STATE_ROOT)

    @property
    def state_dir(self) -> Path:
        """This instance's state directory (snapshots, sessions, ledger), ``<state_root>/<name>``."""
        return self.state_root / self.name

    @property
    def socket(self) -> Path:
        """The daemon's unix socket."""
        return self.state_dir / "drumsd.sock"

    @property
    def ledger_root(self) -> Path:
        """Where the daemon's runs record what they own (the sweep's input)."""
        return self.state_dir / "ledger"

    @property
    def sessions_dir(self) -> Path:
        """The sessions' directories (roots, uppers, CRIU work)."""
        return self.state_dir / "sessions"

    @property
    def snapshots_dir(self) -> Path:
        """The snapshot store."""
        return self.state_dir / "snapshots"

    @property
    def images_dir(self) -> Path:
        """The instance's own image directory."""
        return self.state_dir / "images"

    # Beside the state directory, not in it: the state directory is a tmpfs of its own that a
    # shutdown unmounts, and these outlive it (the log is read after the daemon is gone).
    @property
    def log_file(self) -> Path:
        """The daemon's log."""
        return self.state_root / f"{self.name}.log"

    @property
    def stderr_file(self) -> Path:
        """The daemon's stdout and stderr (a start-up failure shows here, before its log exists)."""
        return self.state_root / f"{self.name}.stderr"

    @property
    def start_lock(self) -> Path:
        """Held by whoever is starting the daemon (so racing starters start one)."""
        return self.state_root / f"{self.name}.start.lock"

    @property
    def run_lock(self) -> Path:
        """Held by the running daemon for its lifetime (so one runs per instance)."""
        return self.state_root / f"{self.name}.lock"

    @property
    def daemon_files(self) -> tuple[Path, ...]:
        """The files a stopped daemon leaves beside its state directory, its log apart."""
        return (self.run_lock, self.start_lock, self.stderr_file)


def instance_from_env() -> Instance:
    """The instance the environment names: ``DRUMS_INSTANCE`` (default ``default``), ``DRUMS_SLOT_BASE``
    (0) and ``DRUMS_SLOT_COUNT`` (64). Raises ``InvalidArgument`` ``INVALID_NAME`` for a bad name."""
    name = os.environ.get("DRUMS_INSTANCE", "default")
    base = int(os.environ.get("DRUMS_SLOT_BASE", "0"))
    count = int(os.environ.get("DRUMS_SLOT_COUNT", "64"))
    return Instance(name=check_name(name, "instance"), slot_base=base, slot_count=count)


def slot_addresses(slot: int) -> tuple[str, str]:
    """(host, guest) addresses of a slot's link-local /30."""
    if not 0 <= slot < 16384:
        raise ValueError(f"slot {slot} out of range")
    third, fourth = divmod(slot, 64)
    base = fourth * 4
    return f"169.254.{third}.{base + 1}", f"169.254.{third}.{base + 2}"


def host_ifname(slot: int) -> str:
    return f"dvh{slot}"


def display_number(slot: int) -> int:
    return 100 + slot


def nft_table_name(run: str) -> str:
    """The nftables table of a daemon run: ``drums_<run>`` with ``-`` as ``_``, cut at 60 characters."""
    return f"drums_{run.replace('-', '_')}"[:60]
