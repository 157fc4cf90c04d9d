#!/usr/bin/env python3
"""Print the Debian suite that CRIU 4.2.x is taken from on this host.

Usage: criu_suite.py [OS_RELEASE_PATH]   (default /etc/os-release)

On this project's kernels only CRIU 4.2.x works (see notes/platform.md): Debian 12's 3.17
fails `criu check` and Debian 13's 4.1.1 cannot dump a process with an AF_INET socket. Neither
stable release has 4.2, so both take it from unstable ("sid") into a private prefix; the host's
own packages are never touched. Exit status 2 (and a message on stderr) for a host we do not
know how to provision.

Standard library only: it runs before the virtual environment exists.
"""

from __future__ import annotations

import shlex
import sys

# Debian major version -> suite holding a CRIU 4.2.x build. Add a release here only once
# its own archive carries 4.2.x or newer.
SUITE_BY_DEBIAN_VERSION: dict[str, str] = {
    "12": "sid",  # bookworm: 3.17.1
    "13": "sid",  # trixie: 4.1.1
}
# Debian testing/unstable hosts have no VERSION_ID; they get CRIU from unstable too.
SUITE_BY_CODENAME: dict[str, str] = {
    "bookworm": "sid",
    "trixie": "sid",
    "forky": "sid",
    "sid": "sid",
}


class UnsupportedHost(Exception):
    """The host is not a Debian release this project knows how to provision."""


def parse_os_release(text: str) -> dict[str, str]:
    """Parse os-release(5) text into a dict (shell-style quoting)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        try:
            parts = shlex.split(value)
        except ValueError:
            parts = [value]
        fields[key.strip()] = parts[0] if parts else ""
    return fields


def criu_suite(os_release_text: str) -> str:
    """Return the Debian suite to take CRIU 4.2.x from, for a host with this os-release."""
    fields = parse_os_release(os_release_text)
    if fields.get("ID") != "debian":
        raise UnsupportedHost(
            f"{fields.get('ID') or 'this OS'} is not supported (ID={fields.get('ID', '')!r}): "
            "Drums is provisioned on Debian 12 or 13"
        )
    version = fields.get("VERSION_ID", "")
    if version:
        major = version.split(".")[0]
        if major in SUITE_BY_DEBIAN_VERSION:
            return SUITE_BY_DEBIAN_VERSION[major]
        raise UnsupportedHost(
            f"Debian {version} is not supported (supported: "
            f"{', '.join(sorted(SUITE_BY_DEBIAN_VERSION))})"
        )
    codename = fields.get("VERSION_CODENAME", "")
    if codename in SUITE_BY_CODENAME:
        return SUITE_BY_CODENAME[codename]
    raise UnsupportedHost(f"Debian without VERSION_ID and unknown codename {codename!r}")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    path = args[0] if args else "/etc/os-release"
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        print(criu_suite(text))
    except OSError as exc:
        print(f"criu_suite: cannot read {path}: {exc.strerror}", file=sys.stderr)
        return 2
    except UnsupportedHost as exc:
        print(f"criu_suite: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
