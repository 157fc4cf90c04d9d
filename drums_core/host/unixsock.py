"""What the kernel knows of a unix socket's other end (sock_diag, through pyroute2)."""
from __future__ import annotations

import os
import socket

from pyroute2.netlink import NLM_F_REQUEST
from pyroute2.netlink.diag import (AF_UNIX, SOCK_DIAG_BY_FAMILY, SS_ALL, UDIAG_SHOW_PEER, DiagSocket,
                                   unix_diag_req)

NO_COOKIE = 0xFFFFFFFFFFFFFFFF  # look the socket up by inode alone


def peer_inode(sock: socket.socket) -> int:
    """The inode of the socket at the other end of the connected unix socket ``sock``; 0 once that
    end is released (its last file descriptor closed), which a shutdown of it alone does not do.
    ``sock`` must be of this process's network namespace. OSError when the kernel cannot say."""
    req = unix_diag_req()
    req["sdiag_family"] = AF_UNIX
    req["udiag_states"] = SS_ALL
    req["udiag_ino"] = os.fstat(sock.fileno()).st_ino
    req["udiag_show"] = UDIAG_SHOW_PEER
    req["udiag_cookie"] = NO_COOKIE
    with DiagSocket() as diag:
        diag.bind()
        answers = tuple(diag.nlm_request(req, SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST))
    if not answers:
        raise OSError(f"sock_diag has no unix socket of inode {req['udiag_ino']}")
    return int(answers[0].get_attr("UNIX_DIAG_PEER") or 0)
