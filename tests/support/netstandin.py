"""A stand-in "upstream" host for the ``nat`` policy's tests, in a network namespace the test makes.

One child process holds the namespace (``unshare --net``; it dies with the process that made it,
``PR_SET_PDEATHSIG``) and runs :mod:`tests.support.netstandin_server` there: HTTP on 80, DNS on 53, a UDP
sink on 9, each logging the source address of what it receives. The host side of its veth is the
"upstream interface" that sessions are routed through.

Addresses, all inside namespaces the test made: the link is ``169.254.254.<4k>/30`` (host ``.1``,
stand-in ``.2``; link-local, a range no session slot uses); the stand-in also holds one
public-looking address per host name it serves, from the documentation ranges of RFC 5737
(``203.0.113.0/25`` by default; the fault harness uses the other half), on its loopback, and the
host gets a route to that range through the stand-in's link (and nowhere else). When the child
dies, its namespace, the veth and the host's route through it go with it; :meth:`StandIn.close`
also waits until the link is gone.
"""
from __future__ import annotations

import ctypes
import json
import signal
import subprocess
import sys
from pathlib import Path

import requests

from .wait import WaitTimeout, wait_until

HERE = Path(__file__).resolve().parent
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def link_exists(ifname: str) -> bool:
    """By netlink, in this process's network namespace (``/sys/class/net`` shows the one ``/sys`` was
    mounted in, which differs when the tests run in a namespace of their own)."""
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        return bool(ipr.link_lookup(ifname=ifname))


class StandIn:
    """``StandIn("dsu123", index=0, records={"web.standin.test": "203.0.113.80"})``; use as a context."""

    def __init__(self, ifname: str, index: int = 0, records: dict[str, str] | None = None,
                 routed: str = "203.0.113.0/25", name: str = "upstream") -> None:
        assert 0 <= index < 64 and not ifname.startswith("dvh") and len(ifname) <= 15
        base = 4 * index
        self.ifname = ifname
        self.name = name
        self.host_address = f"169.254.254.{base + 1}"
        self.address = f"169.254.254.{base + 2}"
        self.routed = routed
        self.records = dict(records or {})
        self.proc: subprocess.Popen | None = None

    @property
    def dns(self) -> str:
        """The stand-in's DNS server address (its first public-looking address)."""
        return next(iter(self.records.values()))

    def start(self) -> "StandIn":
        from pyroute2 import IPRoute

        from drums_core.session import netns

        cfg = json.dumps({"name": self.name, "records": self.records})
        self.proc = subprocess.Popen(["unshare", "--net", sys.executable, str(HERE / "netstandin_server.py"), cfg],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, preexec_fn=_die_with_parent, cwd="/")
        try:
            line = self.proc.stdout.readline().strip()
            if line != "ready":
                raise RuntimeError(f"stand-in server did not start: {line!r} {self.proc.stderr.read()[-2000:]}")
            pid = self.proc.pid
            with IPRoute() as ipr:
                ipr.link("add", ifname=self.ifname, kind="veth", peer={"ifname": "eth0", "net_ns_pid": pid})
                idx = ipr.link_lookup(ifname=self.ifname)[0]
                ipr.addr("add", index=idx, address=self.host_address, prefixlen=30)
                ipr.link("set", index=idx, state="up")

            def inside() -> None:
                with IPRoute() as ipr:  # (its loopback and the addresses there: the server did them)
                    eth = ipr.link_lookup(ifname="eth0")[0]
                    ipr.addr("add", index=eth, address=self.address, prefixlen=30)
                    ipr.link("set", index=eth, state="up")
                    ipr.route("add", dst="0.0.0.0/0", gateway=self.host_address, oif=eth)

            netns.in_namespaces(pid, {"net": 0x40000000}, inside)
            with IPRoute() as ipr:
                ipr.route("add", dst=self.routed, gateway=self.address, oif=idx)
            wait_until(self._answers, 10, f"stand-in {self.ifname} to answer on {self.address}")
        except BaseException:
            self.close()
            raise
        return self

    def _answers(self) -> bool:
        try:
            return requests.get(f"http://{self.address}/_log", timeout=1).status_code == 200
        except requests.RequestException:
            return False

    def log(self) -> dict:
        """What the stand-in saw: ``{"http": [...], "dns": [...], "udp": [...]}``, each with ``src``."""
        return requests.get(f"http://{self.address}/_log", timeout=5).json()

    def forwarding(self) -> str:
        return Path(f"/proc/sys/net/ipv4/conf/{self.ifname}/forwarding").read_text().strip()

    def close(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait(timeout=10)
            for f in (self.proc.stdout, self.proc.stderr):
                if f:
                    f.close()
            self.proc = None
        try:
            wait_until(lambda: not link_exists(self.ifname), 10, f"{self.ifname} to go with its namespace")
        except WaitTimeout:  # the namespace is gone, so its veth should be: remove the host end by hand
            subprocess.run(["ip", "link", "del", self.ifname], capture_output=True)

    def __enter__(self) -> "StandIn":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
