"""``display.until_peer_closed``: how the daemon ends its X connections to a session (so that the X
server's end, a socket of the host's namespace, is gone before a checkpoint). The peer is the
session's X server, which may be hostile: it may never close, or flood; the wait stays bounded."""
from __future__ import annotations

import socket
import threading
import time

from drums_core.session.display import until_peer_closed


def _pair_with_server(serve):
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    t = threading.Thread(target=serve, args=(theirs,), daemon=True)
    t.start()
    return ours, theirs, t


def test_returns_once_the_peer_has_closed_its_end():
    closed_at = []

    def serve(s):  # an X server: reads until the end of the stream, then closes the client
        while s.recv(4096):
            pass
        time.sleep(0.2)
        closed_at.append(time.monotonic())
        s.close()

    ours, _, t = _pair_with_server(serve)
    ours.sendall(b"request")
    assert until_peer_closed(ours, 5.0) is True
    assert closed_at and time.monotonic() >= closed_at[0]  # not before the peer closed
    t.join(1)
    ours.close()


def test_a_peer_that_shuts_down_first_is_waited_for_until_it_closes():
    """X's transport layer shuts a connection down, then closes it: the end of the stream comes
    first, and the socket is still held until the close."""
    closed_at = []

    def serve(s):
        while s.recv(4096):
            pass
        s.shutdown(socket.SHUT_RDWR)
        time.sleep(0.3)
        closed_at.append(time.monotonic())
        s.close()

    ours, _, t = _pair_with_server(serve)
    assert until_peer_closed(ours, 5.0) is True
    assert closed_at and time.monotonic() >= closed_at[0]
    t.join(1)
    ours.close()


def test_a_peer_that_never_closes_is_given_up_on_after_the_timeout():
    ours, theirs, _ = _pair_with_server(lambda s: None)
    t0 = time.monotonic()
    assert until_peer_closed(ours, 0.5) is False
    assert 0.4 < time.monotonic() - t0 < 10
    ours.close()
    theirs.close()


def test_a_peer_that_floods_is_given_up_on_after_the_timeout():
    stop = threading.Event()

    def flood(s):
        try:
            while not stop.is_set():
                s.sendall(b"x" * 65536)
        except OSError:
            pass

    ours, theirs, t = _pair_with_server(flood)
    t0 = time.monotonic()
    assert until_peer_closed(ours, 0.5) is False
    assert 0.4 < time.monotonic() - t0 < 10
    stop.set()
    ours.close()
    t.join(2)
    theirs.close()
