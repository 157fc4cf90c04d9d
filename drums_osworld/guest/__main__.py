"""``python -m drums_osworld.guest``: run the guest server in the foreground."""
from __future__ import annotations

import argparse
import logging
import os
import sys


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def _fixed_mmap_threshold(size: int = 128 << 10) -> None:
    """Blocks of ``size`` bytes and more get their own mappings, unmapped when freed.

    The server answers each request in a thread of its own, and glibc raises its mmap threshold
    each time a large block is freed: without a fixed one, a screenshot's buffers (6 MiB a frame)
    stay in a thread's arena after the reply, and a desktop is checkpointed, and restored in every
    sibling, with them (a restored desktop's server: 45 MiB anon without, 33 MiB with)."""
    import ctypes

    try:
        ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, size)  # the process's own C library
    except (OSError, AttributeError):
        pass  # not glibc: its allocator, its policy


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m drums_osworld.guest",
                                description="OSWorld-compatible guest server for a Drums desktop.")
    p.add_argument("--host", default=os.environ.get("DRUMS_GUEST_HOST", "0.0.0.0"),
                   help="address to listen on (default 0.0.0.0: the session's own network "
                        "namespace; use 127.0.0.1 when running on a host)")
    p.add_argument("--port", type=int, default=5000, help="port (0 = any free port)")
    p.add_argument("--port-file", help="write the bound port here once listening")
    p.add_argument("--display", help="X display (default $DISPLAY, else :0)")
    p.add_argument("--run-as-user", default=None,
                   help="when running as root, run commands as this user "
                        "(default $DRUMS_GUEST_USER; unset = the server's own user)")
    p.add_argument("--exec-timeout", type=float, default=120.0,
                   help="seconds before /execute and /setup/execute give up (OSWorld: 120)")
    p.add_argument("--open-timeout", type=float, default=1800.0,
                   help="seconds /setup/open_file waits for the window (OSWorld: 1800)")
    p.add_argument("--workdir", help="scratch directory (default: a new directory in /tmp)")
    p.add_argument("--log-level", default=os.environ.get("DRUMS_GUEST_LOG", "INFO"))
    a = p.parse_args(argv)

    logging.basicConfig(level=a.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    _fixed_mmap_threshold()
    from .server import GuestConfig, serve

    cfg = GuestConfig(exec_timeout=a.exec_timeout, open_timeout=a.open_timeout,
                      run_as=a.run_as_user, display=a.display, workdir=a.workdir)
    serve(cfg, a.host, a.port, a.port_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
