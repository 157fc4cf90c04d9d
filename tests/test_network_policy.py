"""Network policy per session (``none``, ``nat``), against a stand-in upstream the test makes.

The stand-in (:mod:`tests.support.netstandin`) is a host in a network namespace of this test: HTTP, DNS and a
UDP sink that log the source of everything they receive, behind a veth whose host end is the
"upstream interface" (``dsu<pid>``). A second one (``dso<pid>``, routed for 198.51.100.0/24) is a
decoy: a ``nat`` session must never reach it, the host routes to it through another interface.
Nothing is ever sent to an address outside namespaces this test made.

What is checked:
1. the policy's forms and its clear errors for bad input (unknown policy, ``nat`` without an
   upstream, an upstream that does not exist, DNS servers the upstream does not lead to); bad input
   changes nothing on the host;
2. ``/etc/resolv.conf`` is written through the safe path helpers (a symlink there is replaced, never
   followed);
3. a ``nat`` session resolves and fetches from the stand-in (masqueraded behind the upstream's
   address); a ``none`` session does not; neither reaches the host's services (listeners on the
   host's wildcard and loopback addresses, reached through the host side of the session link and
   the host's address on the upstream), another session, a private range the host did not grant,
   or the decoy; a grant (``allow``) opens exactly the granted address;
4. session root changing its address, routes, loopback and source addresses (raw sockets), and
   using IPv6, reaches nothing more;
5. siblings restored from a ``nat`` checkpoint (and a checkpoint left running) keep a working route;
   a snapshot whose upstream is gone is refused with ``UPSTREAM_MISSING``;
6. forwarding on the upstream is on only while some run holds it, and is put back when the last
   session goes, also by the sweep after a daemon was killed (a daemon of another instance holding
   the same upstream keeps it on until its own last session goes; a daemon that adopts a stopped
   one's sessions takes over their route and the hold);
7. the gym env takes the policy as an argument or from ``$DRUMS_NETWORK``; ``drums up --network``
   refuses bad input. (The OSWorld provider: tests/osworld/test_network_osworld.py.)

While a Drums daemon from before network policies runs on the host, its nftables table drops every
session link's routed traffic and ``nat`` is refused with ``NAT_BLOCKED`` (these tests then fail
saying so). They can run meanwhile in a network namespace of their own (nftables and the sysctls
are per namespace; the tests make everything they route to)::

    unshare --net sh -c 'ip link set lo up; exec python -m pytest tests/test_network_policy.py'
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from pathlib import Path

import pytest

from drums_core.config import ID_BASE, STATE_ROOT, Instance
from drums_core.errors import DrumsError, FailedPrecondition, InvalidArgument
from drums_core.session.netpolicy import NetworkPolicy, parse_text
from tests.support.suite import SPARE_SLOTS, SUITE_DAEMON_ENV, require_root, stop_instance
from tests.support.netstandin import StandIn, link_exists
from drums_core.host.procs import is_alive
from tests.support.wait import wait_until

pytestmark = pytest.mark.timeout(300)

WEB, DNS, OTHER = "203.0.113.80", "203.0.113.53", "198.51.100.80"
RECORDS = {"web.standin.test": WEB, "dns.standin.test": DNS}
BARE: dict = {}
SERVER = {"programs": [{"name": "srv", "argv": ["python3", "-m", "http.server", "8000", "--bind", "0.0.0.0"]}],
          "wait_port": 8000}

# Run inside a session with its /usr/bin/python3: each job in a thread, results as JSON.
PROBE = r'''
import json, socket, sys, threading, urllib.request
jobs = json.loads(sys.argv[1])
out = [None] * len(jobs)
def run(i, job):
    kind = job[0]
    try:
        if kind == "resolve":
            out[i] = socket.gethostbyname(job[1])
        elif kind == "fetch":
            out[i] = urllib.request.urlopen(job[1], timeout=job[2]).read().decode()
        elif kind == "tcp":
            family = socket.AF_INET6 if ":" in job[1] else socket.AF_INET
            s = socket.socket(family, socket.SOCK_STREAM)
            s.settimeout(job[3])
            s.connect(socket.getaddrinfo(job[1], job[2], family, socket.SOCK_STREAM)[0][4])
            s.close()
            out[i] = "connected"
        elif kind == "udp":
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.sendto(job[3].encode(), (job[1], job[2]))
            out[i] = "sent"
    except Exception as e:
        out[i] = "error: %s: %s" % (type(e).__name__, e)
threads = [threading.Thread(target=run, args=(i, j)) for i, j in enumerate(jobs)]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps(out))
'''

# Raw IPv4/UDP with a forged source (IP_HDRINCL), as session root may send them.
SPOOF = r'''
import json, socket, struct, sys
def csum(b):
    if len(b) % 2: b += b"\0"
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b)); s = (s >> 16) + (s & 0xffff); s += s >> 16
    return ~s & 0xffff
dst, port, sources = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
r = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
sent = []
for src in sources:
    data = ("spoof " + src).encode()
    udp = struct.pack("!HHHH", 40000, port, 8 + len(data), 0) + data
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 1, 0, 64, 17, 0,
                     socket.inet_aton(src), socket.inet_aton(dst))
    ip = ip[:10] + struct.pack("!H", csum(ip)) + ip[12:]
    for _ in range(3):
        r.sendto(ip + udp, (dst, 0))
    sent.append(src)
print(json.dumps(sent))
'''


def nat(upstream: str, **extra) -> dict:
    return {"network": {"policy": "nat", "upstream": upstream, "dns": [DNS], **extra}}


def probe(c, sid: str, jobs: list, timeout: float = 60) -> list:
    res = c.exec(sid, ["python3", "-c", PROBE, json.dumps(jobs)], timeout=timeout)
    assert res["returncode"] == 0, res
    return json.loads(res["stdout"])


def sh(c, sid: str, script: str) -> dict:
    res = c.exec(sid, ["sh", "-c", script], timeout=60)
    assert res["returncode"] == 0, (script, res)
    return res


def hostnet_record(ifname: str) -> dict | None:
    from drums_core.host import hostnet

    return hostnet.read_record(ifname)


class Listeners:
    """TCP listeners of the host on a wildcard IPv4 port, a loopback port and a wildcard IPv6 port;
    they record who connected (nothing from a session ever may)."""

    def __init__(self) -> None:
        self.accepted: list[tuple[str, str]] = []
        self.socks: dict[str, socket.socket] = {}
        for name, family, addr in (("any", socket.AF_INET, "0.0.0.0"), ("loopback", socket.AF_INET, "127.0.0.1"),
                                   ("any6", socket.AF_INET6, "::")):
            s = socket.socket(family, socket.SOCK_STREAM)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            s.bind((addr, 0))
            s.listen(16)
            s.settimeout(0.2)
            self.socks[name] = s
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._accept, args=(n, s), daemon=True) for n, s in self.socks.items()]
        for t in self._threads:
            t.start()

    def port(self, name: str) -> int:
        return self.socks[name].getsockname()[1]

    def _accept(self, name: str, s: socket.socket) -> None:
        while not self._stop.is_set():
            try:
                conn, peer = s.accept()
            except OSError:
                continue
            self.accepted.append((name, peer[0]))
            conn.close()

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=2)
        for s in self.socks.values():
            s.close()


def conntrack_flows_from(address: str) -> int:
    from pyroute2 import Conntrack
    from pyroute2.netlink.nfnetlink.nfctsocket import NFCTAttrTuple

    ct = Conntrack()
    try:
        return len(list(ct.dump_entries(tuple_orig=NFCTAttrTuple(saddr=address, family=socket.AF_INET))))
    finally:
        ct.close()


def host_ipv6_link_local(ifname: str) -> str | None:
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        idx = ipr.link_lookup(ifname=ifname)
        for a in ipr.get_addr(index=idx[0], family=socket.AF_INET6) if idx else []:
            addr = a.get_attr("IFA_ADDRESS")
            if addr and addr.startswith("fe80"):
                return addr
    return None


# ------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def up():
    require_root()
    with StandIn(f"dsu{os.getpid() % 100000}", 0, RECORDS, name="upstream") as s:
        yield s


@pytest.fixture(scope="module")
def other():
    require_root()
    with StandIn(f"dso{os.getpid() % 100000}", 1, {"other.standin.test": OTHER}, routed="198.51.100.0/24",
                 name="other") as s:
        yield s


@pytest.fixture(scope="module")
def drums(drums_instance):
    from tests.support.suite import module_client

    with module_client(drums_instance, "network tests", timeout=180) as c:
        yield c


@pytest.fixture
def sessions(drums):
    """Sessions made by one test, destroyed after it even when it fails."""
    made: list[str] = []

    def make(spec: dict) -> dict:
        s = drums.create(spec)
        made.append(s["id"])
        return s

    yield make
    for sid in made:
        with contextlib.suppress(DrumsError):
            drums.destroy(sid)


@pytest.fixture
def listeners():
    ls = Listeners()
    yield ls
    ls.close()


def assert_released(up: StandIn) -> None:
    assert up.forwarding() == "0", "forwarding on the upstream was not put back"
    assert hostnet_record(up.ifname) is None, hostnet_record(up.ifname)


# ------------------------------------------------------------------------------------------ 1, 2
def test_policy_forms_and_errors():
    assert NetworkPolicy.from_spec(None) == NetworkPolicy()
    assert NetworkPolicy.from_spec("none").to_spec() == {"policy": "none"}
    p = NetworkPolicy.from_spec({"policy": "nat", "upstream": "eth1", "dns": ["192.0.2.53"],
                                 "allow": ["192.168.7.0/24"]})
    assert (p.nat, p.upstream, p.dns, p.allow) == (True, "eth1", ("192.0.2.53",), ("192.168.7.0/24",))
    assert parse_text("nat:eth1").to_spec() == {"policy": "nat", "upstream": "eth1", "dns": [], "allow": []}
    assert parse_text("nat:eth1:192.0.2.53,192.0.2.54").dns == ("192.0.2.53", "192.0.2.54")
    assert parse_text('{"policy": "nat", "upstream": "wlan0"}').upstream == "wlan0"
    bad = {
        "unknown network policy 'bridge'": {"policy": "bridge"},
        "needs an upstream": {"policy": "nat"},
        "takes no upstream": {"policy": "none", "upstream": "eth1"},
        "unknown network fields": {"policy": "nat", "upstream": "eth1", "gateway": "x"},
        "is not an interface name": {"policy": "nat", "upstream": "../../etc"},
        "cannot be used": {"policy": "nat", "upstream": "lo"},
        "is not an IPv4 address": {"policy": "nat", "upstream": "eth1", "dns": ["resolver.example"]},
        "cannot be reached from a session": {"policy": "nat", "upstream": "eth1", "dns": ["127.0.0.53"]},
        "host bits clear": {"policy": "nat", "upstream": "eth1", "allow": ["192.168.7.1/24"]},
    }
    for words, value in bad.items():
        with pytest.raises(InvalidArgument) as err:
            NetworkPolicy.from_spec(value)
        assert err.value.reason == "BAD_NETWORK" and words in err.value.message, (value, err.value)
    with pytest.raises(InvalidArgument, match="dvh1"):
        parse_text("nat:dvh1")
    with pytest.raises(InvalidArgument, match="unknown network policy"):
        parse_text("open")
    from drums_core.session.model import SessionSpec

    assert SessionSpec.from_dict({}).network == {"policy": "none"}
    assert SessionSpec.from_dict({"network": "nat:eth1"}).network["upstream"] == "eth1"


def test_resolv_conf_replaces_a_symlink_without_following_it(tmp_path):
    require_root()
    from drums_core.session.netpolicy import write_resolv_conf

    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    decoy = tmp_path / "host-resolv.conf"
    decoy.write_text("nameserver 10.9.9.9\n")
    (root / "etc/resolv.conf").symlink_to(decoy)
    policy = NetworkPolicy.from_spec({"policy": "nat", "upstream": "eth1", "dns": [DNS]})
    write_resolv_conf(str(root), policy, (ID_BASE, ID_BASE))
    assert decoy.read_text() == "nameserver 10.9.9.9\n"
    target = root / "etc/resolv.conf"
    assert not target.is_symlink() and f"nameserver {DNS}" in target.read_text().splitlines()
    assert (target.stat().st_uid, target.stat().st_gid) == (ID_BASE, ID_BASE)
    os.unlink(target)
    os.rmdir(root / "etc")
    (root / "etc").symlink_to(tmp_path)  # a symlinked parent is refused, nothing is written through it
    with pytest.raises(FailedPrecondition) as err:
        write_resolv_conf(str(root), policy, (ID_BASE, ID_BASE))
    assert err.value.reason == "UNSAFE_PATH"
    assert not (tmp_path / "resolv.conf").exists()


def test_bad_input_is_refused_and_changes_nothing(drums, up, other):
    from drums_core.session.netpolicy import host_resolvers

    sessions_before = drums.list()
    cases = [
        ({"network": {"policy": "bridge"}}, "BAD_NETWORK", "unknown network policy"),
        ({"network": {"policy": "nat"}}, "BAD_NETWORK", "needs an upstream"),
        ({"network": {"policy": "nat", "upstream": "nosuch0"}}, "UPSTREAM_NOT_FOUND", "does not exist"),
        ({"network": {"policy": "nat", "upstream": up.ifname, "dns": ["198.51.100.53"]}}, "DNS_UNREACHABLE",
         "not reached through"),
    ]
    # the host's own resolvers are not behind the stand-in, so without a dns list there is none to use
    assert host_resolvers() == [] or all(not r.startswith("203.0.113.") for r in host_resolvers())
    cases.append(({"network": {"policy": "nat", "upstream": up.ifname}}, "NO_DNS", "no DNS server"))
    for spec, reason, words in cases:
        with pytest.raises(InvalidArgument) as err:
            drums.create(spec)
        assert err.value.reason == reason and words in err.value.message, (spec, err.value)
    assert drums.list() == sessions_before
    assert_released(up)
    assert other.forwarding() == "0"


# ------------------------------------------------------------------------------------------ 3
def test_nat_reaches_the_upstream_none_does_not_and_neither_reaches_the_host(drums, sessions, up, other, listeners):
    a = sessions(nat(up.ifname))
    b = sessions(SERVER)  # none, with a web server of its own on 8000
    assert a["spec"]["network"] == {"policy": "nat", "upstream": up.ifname, "dns": [DNS], "allow": []}
    assert b["spec"]["network"] == {"policy": "none"}
    assert up.forwarding() == "1"
    rec = hostnet_record(up.ifname)
    assert rec["prior"] == "0" and len(rec["holders"]) == 1, rec
    resolv = drums.exec(a["id"], ["cat", "/etc/resolv.conf"])["stdout"]
    assert f"nameserver {DNS}" in resolv.splitlines()

    port, lo_port = listeners.port("any"), listeners.port("loopback")
    host_side = {a["id"]: a["address"].rsplit(".", 1)[0] + "." + str(int(a["address"].rsplit(".", 1)[1]) - 1),
                 b["id"]: b["address"].rsplit(".", 1)[0] + "." + str(int(b["address"].rsplit(".", 1)[1]) - 1)}
    # controls: the host's listeners and b's server answer the host itself
    with socket.create_connection((host_side[a["id"]], port), timeout=2):
        pass
    with socket.create_connection((up.host_address, port), timeout=2):
        pass
    with socket.create_connection(("127.0.0.1", lo_port), timeout=2):
        pass
    with socket.create_connection((b["address"], 8000), timeout=5):
        pass
    wait_until(lambda: len(listeners.accepted) >= 3, 5, "three accepted connections")
    assert sorted(n for n, _ in listeners.accepted) == ["any", "any", "loopback"], listeners.accepted
    seen_by_host = len(listeners.accepted)

    got = probe(drums, a["id"], [
        ["resolve", "web.standin.test"],
        ["fetch", "http://web.standin.test/from-nat", 5],
        ["tcp", host_side[a["id"]], port, 2],      # the host side of its own link
        ["tcp", up.host_address, port, 2],         # the host's own address on the upstream
        ["tcp", host_side[b["id"]], port, 2],      # the host side of another session's link
        ["tcp", b["address"], 8000, 2],            # another session
        ["fetch", f"http://{up.address}/link-local", 2],   # a blocked (link-local) range, not granted
        ["fetch", f"http://{OTHER}/decoy", 2],     # reached by the host through another interface
        ["resolve", "nosuch.standin.test"],
    ])
    assert got[0] == WEB, got
    assert got[1] == "standin upstream /from-nat", got
    assert all(r.startswith("error") for r in got[2:]), got
    assert got[8].startswith("error"), got

    got_b = probe(drums, b["id"], [
        ["resolve", "web.standin.test"],
        ["fetch", f"http://{WEB}/from-none", 2],
        ["tcp", host_side[b["id"]], port, 2],
        ["tcp", up.host_address, port, 2],
        ["tcp", a["address"], 5000, 2],
    ])
    assert all(r.startswith("error") for r in got_b), got_b

    log = up.log()
    assert [h["path"] for h in log["http"]] == ["/from-nat"], log
    assert {h["src"] for h in log["http"]} == {up.host_address}, "not masqueraded behind the upstream's address"
    assert {d["src"] for d in log["dns"]} == {up.host_address} and "web.standin.test" in [d["name"] for d in log["dns"]]
    assert other.log() == {"http": [], "dns": [], "udp": []}
    time.sleep(0.5)  # an absence, nothing to wait on: an accept in flight would show by now
    assert listeners.accepted[seen_by_host:] == [], listeners.accepted

    drums.destroy(a["id"])
    assert_released(up)
    assert conntrack_flows_from(a["address"]) == 0, "the gone session's flows are still tracked"


def test_without_dns_the_hosts_resolvers_behind_the_upstream_are_used(up, tmp_path, monkeypatch):
    from drums_core.session import netpolicy

    conf = tmp_path / "resolv.conf"
    conf.write_text(f"nameserver 127.0.0.53\nnameserver 10.255.255.53\nnameserver {DNS}\nnameserver ::1\n")
    monkeypatch.setattr(netpolicy, "HOST_RESOLV_CONFS", (str(conf),))
    got = netpolicy.resolve_for_host(NetworkPolicy.from_spec({"policy": "nat", "upstream": up.ifname}))
    assert got.dns == (DNS,), got  # loopback, IPv6 and a resolver the host reaches elsewhere are left out


def test_a_grant_opens_exactly_the_granted_address(drums, sessions, up):
    g = sessions(nat(up.ifname, allow=[f"{up.address}/32"]))
    got = probe(drums, g["id"], [["fetch", f"http://{up.address}/granted", 5],
                                 ["fetch", f"http://{up.host_address}/host", 2],
                                 ["fetch", f"http://{WEB}/public", 5]])
    assert got[0] == "standin upstream /granted" and got[2] == "standin upstream /public", got
    assert got[1].startswith("error"), got
    drums.destroy(g["id"])
    assert_released(up)


# ------------------------------------------------------------------------------------------ 4
def test_session_root_cannot_route_spoof_or_readdress_its_way_out(drums, sessions, up, other, listeners):
    victim = sessions(SERVER)
    n = sessions(BARE)                       # none: root adds its own default route
    a = sessions(nat(up.ifname))
    port, lo_port, port6 = listeners.port("any"), listeners.port("loopback"), listeners.port("any6")
    gw = {s["id"]: s["address"].rsplit(".", 1)[0] + "." + str(int(s["address"].rsplit(".", 1)[1]) - 1)
          for s in (a, n, victim)}
    before_log = up.log()

    # forged sources: the host's upstream address, another session, a public and a private address
    spoofed = [up.host_address, victim["address"], "203.0.113.99", "10.1.2.3", gw[a["id"]]]
    res = drums.exec(a["id"], ["python3", "-c", SPOOF, WEB, "9", json.dumps(spoofed)], timeout=60)
    assert res["returncode"] == 0 and json.loads(res["stdout"]) == spoofed, res
    probe(drums, a["id"], [["udp", WEB, 9, "legit"]])

    # more routes: to the decoy's range, and the host's loopback through the link (own loopback removed)
    sh(drums, a["id"], f"ip route add 198.51.100.0/24 via {gw[a['id']]} dev eth0; "
                       f"ip route add 10.0.0.0/8 via {gw[a['id']]} dev eth0")
    got = probe(drums, a["id"], [["fetch", f"http://{OTHER}/routed", 2],
                                 ["tcp", "10.255.255.53", 53, 2]])
    assert all(r.startswith("error") for r in got), got
    sh(drums, a["id"], f"ip route del local 127.0.0.0/8 dev lo table local; "
                       f"ip route add 127.0.0.0/8 via {gw[a['id']]} dev eth0")
    got = probe(drums, a["id"], [["tcp", "127.0.0.1", lo_port, 2]])
    assert got[0].startswith("error"), got

    # IPv6: the host side's link-local address of its link (the host listens on [::])
    ll = host_ipv6_link_local(f"dvh{a['slot']}")
    if ll is not None:
        got = probe(drums, a["id"], [["tcp", f"{ll}%eth0", port6, 2]])
        assert got[0].startswith("error"), got

    # a new address: another session's, then a free one in its own /30
    sh(drums, a["id"], f"ip addr flush dev eth0; ip addr add {victim['address']}/30 dev eth0; "
                       f"ip route replace default via {gw[a['id']]} dev eth0 || true")
    got = probe(drums, a["id"], [["fetch", f"http://{WEB}/as-victim", 2], ["tcp", gw[a["id"]], port, 2]])
    assert all(r.startswith("error") for r in got), got

    # the none session: root routes everything through the host
    sh(drums, n["id"], f"ip route add default via {gw[n['id']]} dev eth0")
    got = probe(drums, n["id"], [["fetch", f"http://{WEB}/from-none-root", 2], ["tcp", gw[n["id"]], port, 2],
                                 ["tcp", victim["address"], 8000, 2]])
    assert all(r.startswith("error") for r in got), got

    log = up.log()
    new_udp = log["udp"][len(before_log["udp"]):]
    assert [(u["src"], u["data"]) for u in new_udp] == [(up.host_address, "legit")], new_udp
    new_http = [h["path"] for h in log["http"][len(before_log["http"]):]]
    assert new_http == [], new_http
    assert other.log() == {"http": [], "dns": [], "udp": []}
    time.sleep(0.5)  # an absence, nothing to wait on: an accept in flight would show by now
    assert listeners.accepted == [], listeners.accepted
    # the victim still answers its host, and nothing of a's got to it
    with socket.create_connection((victim["address"], 8000), timeout=5):
        pass


# ------------------------------------------------------------------------------------------ 5
def test_restored_siblings_keep_a_working_route(drums, sessions, up):
    a = sessions(nat(up.ifname))
    assert probe(drums, a["id"], [["fetch", "http://web.standin.test/before", 5]]) == ["standin upstream /before"]
    snap = drums.checkpoint(a["id"], name="nat-base")
    try:
        assert up.forwarding() == "0" and hostnet_record(up.ifname) is None, "the hold outlived its last session"
        sibs = drums.restore(snap["id"], count=2)
        try:
            assert len({s["address"] for s in sibs}) == 2
            for i, s in enumerate(sibs):
                got = probe(drums, s["id"], [["resolve", "web.standin.test"],
                                             ["fetch", f"http://web.standin.test/sibling-{i}", 5]])
                assert got == [WEB, f"standin upstream /sibling-{i}"], (s["id"], got)
            print("nat sibling restores: " + ", ".join(f"{s['timings']['ready']:.3f}s" for s in sibs))
            drums.checkpoint(sibs[0]["id"], name="nat-running", leave_running=True)
            assert up.forwarding() == "1"
            got = probe(drums, sibs[0]["id"], [["fetch", "http://web.standin.test/left-running", 5]])
            assert got == ["standin upstream /left-running"], got
        finally:
            for s in sibs:
                with contextlib.suppress(DrumsError):
                    drums.destroy(s["id"])
        assert_released(up)
        paths = [h["path"] for h in up.log()["http"]]
        assert {"/sibling-0", "/sibling-1", "/left-running"} <= set(paths), paths
    finally:
        for sn in sorted(drums.snapshots(), key=lambda x: x["created"], reverse=True):  # children first
            if sn.get("name") in ("nat-base", "nat-running"):
                with contextlib.suppress(DrumsError):
                    drums.delete_snapshot(sn["id"])


def test_restoring_a_snapshot_whose_upstream_is_gone_fails_clearly(drums):
    gone_dns = "198.51.100.153"
    with StandIn(f"dsx{os.getpid() % 100000}", 2, {"dns.gone.test": gone_dns}, routed="198.51.100.128/25",
                 name="gone") as tmp:
        s = drums.create({"network": {"policy": "nat", "upstream": tmp.ifname, "dns": [gone_dns]}})
        snap = drums.checkpoint(s["id"])
    try:
        # the sessions by id: another session's record may change meanwhile (its liveness verdict)
        before = {x["id"] for x in drums.list()}
        with pytest.raises(FailedPrecondition) as err:
            drums.restore(snap["id"], count=2)
        assert err.value.reason == "UPSTREAM_MISSING" and tmp.ifname in err.value.message, err.value
        assert {x["id"] for x in drums.list()} == before
    finally:
        drums.delete_snapshot(snap["id"])


# ------------------------------------------------------------------------------------------ 6
def _spare(name: str, index: int) -> Instance:
    return Instance(name=f"{name}-{os.getpid()}", slot_base=SPARE_SLOTS[12 + index], slot_count=1)


def test_last_holder_puts_forwarding_back_also_after_a_crash(drums, sessions, up):
    from drums_core.client import Client
    from drums_core.sweep.ledger import Ledger
    from drums_core.sweep import sweep

    kept = sessions(nat(up.ifname))
    inst = _spare("natcrash", 0)
    try:
        other_daemon = Client(inst, daemon_env={**SUITE_DAEMON_ENV, "DRUMS_FAULT_AT": ""}, timeout=180)
        info = other_daemon.ping()
        s2 = other_daemon.create(nat(up.ifname))
        rec = hostnet_record(up.ifname)
        assert set(rec["holders"]) == {drums.ping()["run"], info["run"]}, rec
        os.kill(info["pid"], 9)
        # dead, not gone: the daemon is this process's child, a zombie until reaped
        wait_until(lambda: not is_alive(info["pid"]), 15, "the killed daemon to die")
        report = sweep(inst.ledger_root)
        assert report.hostnet_released == 1, report.to_dict()
        assert up.forwarding() == "1", "another run's session still uses the upstream"
        assert set(hostnet_record(up.ifname)["holders"]) == {drums.ping()["run"]}
        assert Ledger.runs(inst.ledger_root) == []
        assert not link_exists(f"dvh{s2['slot']}")
        got = probe(drums, kept["id"], [["fetch", "http://web.standin.test/still", 5]])
        assert got == ["standin upstream /still"], got
        drums.destroy(kept["id"])
        assert_released(up)

        # killed right after it turned forwarding on: the sweep alone puts it back
        faulty = Client(inst, daemon_env={**SUITE_DAEMON_ENV, "DRUMS_FAULT_AT": "nat-hold-applied"}, timeout=180)
        pid = faulty.ping()["pid"]
        with pytest.raises(DrumsError) as err:
            faulty.create(nat(up.ifname))
        assert err.value.reason == "DAEMON_DIED", err.value
        wait_until(lambda: not is_alive(pid), 15, "the faulty daemon to die")
        assert up.forwarding() == "1"
        report = sweep(inst.ledger_root)
        assert report.hostnet_released == 1 and report.errors == 0, report.to_dict()
        assert_released(up)

        # a daemon that stops leaving its sessions running: the next one adopts them, their route and
        # the hold on the upstream (recorded by the new run before the old run's sweep lets go)
        first = Client(inst, daemon_env={**SUITE_DAEMON_ENV, "DRUMS_FAULT_AT": ""}, timeout=180)
        old_run = first.ping()["run"]
        s3 = first.create(nat(up.ifname))
        first.shutdown(destroy_sessions=False)
        second = Client(inst, daemon_env={**SUITE_DAEMON_ENV, "DRUMS_FAULT_AT": ""}, timeout=180)
        new_run = second.ping()["run"]
        assert [s["id"] for s in second.list()] == [s3["id"]] and new_run != old_run
        assert set(hostnet_record(up.ifname)["holders"]) == {new_run}
        got = probe(second, s3["id"], [["fetch", "http://web.standin.test/adopted", 5]])
        assert got == ["standin upstream /adopted"], got
        second.destroy(s3["id"])
        assert_released(up)
    finally:
        stop_instance(inst)
    from drums_core.host.hoststate import instance_leaks

    assert not any(instance_leaks(inst).values()), instance_leaks(inst)


# ------------------------------------------------------------------------------------------ 7
def test_the_gym_env_and_drums_up_choose_the_policy(drums, up, monkeypatch):
    """``DrumsDesktopEnv(network=...)`` (and ``$DRUMS_NETWORK``) boots its desktop with the policy;
    ``drums up --network`` refuses bad input before asking the daemon for anything."""
    import subprocess
    import sys

    from drums_osworld.gym.env import DrumsDesktopEnv
    from drums_osworld.tasks import tasks_dir

    task = str(tasks_dir() / "os" / "drums-os-make-executable.json")
    with pytest.raises(InvalidArgument) as err:
        DrumsDesktopEnv(task=task, client=drums, network="nat")
    assert err.value.reason == "BAD_NETWORK"
    monkeypatch.setenv("DRUMS_NETWORK", f"nat:{up.ifname}:{DNS}")
    env = DrumsDesktopEnv(task=task, client=drums, pause=0.0)
    monkeypatch.delenv("DRUMS_NETWORK")
    try:
        assert json.loads(env.network) == {"policy": "nat", "upstream": up.ifname, "dns": [DNS], "allow": []}
        env.reset(seed=1)
        session = drums.get(env.session_id)
        assert session["spec"]["network"]["upstream"] == up.ifname
        got = probe(drums, env.session_id, [["fetch", "http://web.standin.test/from-gym", 5]])
        assert got == ["standin upstream /from-gym"], got
    finally:
        env.close()
    assert_released(up)
    plain = DrumsDesktopEnv(task=task, client=drums)
    assert plain.network == ""
    plain.close()

    env_vars = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
                "DRUMS_INSTANCE": f"nosuch-{os.getpid()}"}
    for argv, words in ((["up", "--network", "nat"], "needs an upstream"),
                        (["up", "--network", "bridge"], "unknown network policy"),
                        (["up", "--network", "none", "--upstream", up.ifname], "takes no upstream"),
                        (["up", "--upstream", up.ifname, "--dns", "not-an-address"], "is not an IPv4 address")):
        # a usage error of the CLI: exit status 2, one line on stderr, checked before any daemon is asked
        out = subprocess.run([sys.executable, "-m", "drums_core.cli", "--json", *argv], capture_output=True,
                             text=True, env=env_vars, timeout=60)
        assert out.returncode == 2 and out.stdout == "", (argv, out)
        assert len(out.stderr.splitlines()) == 1, (argv, out.stderr)
        assert "[BAD_NETWORK]" in out.stderr and words in out.stderr, (argv, out.stderr)
    assert not (STATE_ROOT / f"nosuch-{os.getpid()}").exists(), "a bad `drums up` must not start a daemon"
