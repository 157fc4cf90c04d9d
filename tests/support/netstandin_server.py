"""The stand-in upstream's servers, run by :mod:`tests.support.netstandin` inside the stand-in's own network
namespace (``unshare --net``). Not a test module.

Argument: a JSON object ``{"name": str, "records": {hostname: address}}``. Serves, on every address
of the namespace: HTTP on port 80 (``GET /`` answers ``standin <name> <path>``; ``GET /_log`` returns
what was seen), DNS on UDP port 53 of each address in ``records`` (dnslib; A records for ``records``,
NXDOMAIN for other names), and
a UDP sink on port 9. Every HTTP request, DNS query and UDP datagram is logged with its source
address. Prints ``ready`` once every socket is bound.
"""
from __future__ import annotations

import json
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from dnslib import QTYPE, RCODE, RR, A
from dnslib.server import BaseResolver, DNSLogger, DNSServer

CONFIG = json.loads(sys.argv[1])
LOG: dict[str, list] = {"http": [], "dns": [], "udp": []}
LOCK = threading.Lock()


def note(kind: str, item: dict) -> None:
    with LOCK:
        LOG[kind].append(item)


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path == "/_log":
            with LOCK:
                body = json.dumps(LOG).encode()
        else:
            note("http", {"src": self.client_address[0], "path": self.path, "host": self.headers.get("Host")})
            body = f"standin {CONFIG['name']} {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


class Resolver(BaseResolver):
    def resolve(self, request, handler):
        reply = request.reply()
        name = str(request.q.qname).rstrip(".").lower()
        note("dns", {"src": handler.client_address[0], "name": name, "type": QTYPE[request.q.qtype]})
        addr = CONFIG["records"].get(name)
        if addr is None:
            reply.header.rcode = RCODE.NXDOMAIN
        elif request.q.qtype in (QTYPE.A, QTYPE.ANY):
            reply.add_answer(RR(request.q.qname, QTYPE.A, rdata=A(addr), ttl=30))
        return reply


def sink(sock: socket.socket) -> None:
    while True:
        data, src = sock.recvfrom(2048)
        note("udp", {"src": src[0], "data": data[:64].decode("latin-1")})


def main() -> None:
    from pyroute2 import IPRoute

    with IPRoute() as ipr:  # its loopback, with the addresses it serves (before the DNS servers bind them)
        lo = ipr.link_lookup(ifname="lo")[0]
        ipr.link("set", index=lo, state="up")
        for addr in sorted(set(CONFIG["records"].values())):
            ipr.addr("add", index=lo, address=addr, prefixlen=32)
    http = ThreadingHTTPServer(("0.0.0.0", 80), Handler)
    # one DNS server per address: a UDP reply must come from the address the query went to (a server
    # on 0.0.0.0 answers from the address of its route back, which a NAT'd client never accepts)
    quiet = DNSLogger("-request,-reply,-truncated,-error")
    for addr in sorted(set(CONFIG["records"].values())):
        DNSServer(Resolver(), port=53, address=addr, logger=quiet).start_thread()
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("0.0.0.0", 9))
    threading.Thread(target=sink, args=(udp,), daemon=True).start()
    print("ready", flush=True)
    http.serve_forever()


if __name__ == "__main__":
    main()
