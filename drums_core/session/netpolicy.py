"""A session's network policy: what it is, how it is written, and what the host must offer for it.

Two policies:

``none`` (the default)
    The session has its link to the host (the guest server's address) and nothing else: no route,
    no name service. Sessions made before policies existed are ``none``.
``nat``
    A route out through one host interface the user names (``upstream``), with the session's
    address masqueraded behind the upstream's. Never through the default route on its own: a
    packet the host would send out any other interface is dropped. The session still reaches
    neither the host's own services (loopback, the host side of its link, any host address), nor
    other sessions, nor the private and special ranges in :data:`BLOCKED`, except the networks the
    host grants in ``allow`` and the DNS servers (port 53 only) in ``dns``.

Written in a session spec as ``{"network": {"policy": "nat", "upstream": "eth1", "dns": ["192.0.2.53"],
"allow": ["192.168.7.0/24"]}}``, or as text (``DRUMS_NETWORK``, ``drums up --network``): ``none``,
``nat:<upstream>`` or ``nat:<upstream>:<dns>[,<dns>...]``, or that JSON object.

``dns`` is where the session's ``/etc/resolv.conf`` points. Left out, it is the host's own
resolvers (``/etc/resolv.conf``, then systemd-resolved's upstream list) that the host reaches
through the upstream; a host whose resolvers are elsewhere (a loopback stub, another interface)
must name one. The file is written once, when the session is made, through
:mod:`drums_core.host.safepath`; a restore keeps the file the snapshot holds.

Pure parsing (:meth:`NetworkPolicy.from_spec`) raises ``InvalidArgument`` with reason
``BAD_NETWORK``; the checks against this host (:func:`resolve_for_host`) raise ``InvalidArgument``
(``UPSTREAM_NOT_FOUND``, ``UPSTREAM_UNUSABLE``, ``DNS_UNREACHABLE``, ``NO_DNS``) for a new session
and ``FailedPrecondition`` (``UPSTREAM_MISSING``) when a snapshot's upstream is gone.
"""
from __future__ import annotations

import ipaddress
import json
import re
import socket
from dataclasses import dataclass, field

from ..errors import FailedPrecondition, InvalidArgument
from ..reasons import Reason

POLICIES = ("none", "nat")
#: Destinations a ``nat`` session never reaches unless the host grants them (``allow``, ``dns``):
#: "this" network, private ranges, shared address space, loopback, link-local (other sessions and
#: cloud metadata services live there), IETF protocol assignments, benchmarking, multicast and
#: reserved.
BLOCKED = ("0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
           "192.0.0.0/24", "192.168.0.0/16", "198.18.0.0/15", "224.0.0.0/3")
HOST_RESOLV_CONFS = ("/etc/resolv.conf", "/run/systemd/resolve/resolv.conf")
MAX_DNS = 3       # glibc reads at most three nameservers
MAX_ALLOW = 64
_IFNAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,14}$")
_KEYS = {"policy", "upstream", "dns", "allow"}


def _bad(msg: str) -> InvalidArgument:
    return InvalidArgument(msg, reason=Reason.BAD_NETWORK)


@dataclass(frozen=True)
class NetworkPolicy:
    policy: str = "none"
    upstream: str | None = None
    dns: tuple[str, ...] = field(default_factory=tuple)
    allow: tuple[str, ...] = field(default_factory=tuple)

    @property
    def nat(self) -> bool:
        return self.policy == "nat"

    def to_spec(self) -> dict:
        if not self.nat:
            return {"policy": "none"}
        return {"policy": "nat", "upstream": self.upstream, "dns": list(self.dns), "allow": list(self.allow)}

    @classmethod
    def from_spec(cls, value: object) -> "NetworkPolicy":
        """Parse a spec's ``network`` (a dict, a policy text, or None for ``none``)."""
        if value is None or value == {}:
            return cls()
        if isinstance(value, str):
            return parse_text(value)
        if not isinstance(value, dict):
            raise _bad(f"network must be an object like {{'policy': 'nat', 'upstream': 'eth1'}} or 'none', "
                       f"not {value!r}")
        unknown = set(value) - _KEYS
        if unknown:
            raise _bad(f"unknown network fields {sorted(unknown)}: use policy, upstream, dns, allow")
        policy = value.get("policy", "none")
        if policy not in POLICIES:
            raise _bad(f"unknown network policy {policy!r}: use 'none' or 'nat'")
        upstream, dns, allow = value.get("upstream"), value.get("dns") or [], value.get("allow") or []
        if policy == "none":
            if upstream or dns or allow:
                raise _bad("network policy 'none' takes no upstream, dns or allow (did you mean 'nat'?)")
            return cls()
        if not upstream:
            raise _bad("network policy 'nat' needs an upstream: the host interface sessions reach the outside "
                       "through, e.g. {'policy': 'nat', 'upstream': 'eth1'} (never the default route on its own)")
        return cls("nat", check_ifname(upstream), _check_dns(dns), _check_allow(allow))


def check_ifname(name: object) -> str:
    if not isinstance(name, str) or not _IFNAME_RE.match(name) or name in (".", ".."):
        raise _bad(f"upstream {name!r} is not an interface name")
    if name == "lo" or name.startswith("dvh"):
        raise _bad(f"upstream {name!r} cannot be used: name the host interface that leads outside")
    return name


def _listed(values: object, what: str, most: int, of: str) -> list | tuple:
    """``values`` as a list (one string is a list of one); InvalidArgument beyond ``most`` or not a list."""
    if isinstance(values, str):
        values = [values]
    if not isinstance(values, (list, tuple)) or len(values) > most:
        raise _bad(f"{what} must be a list of at most {most} {of}, not {values!r}")
    return values


def _check_dns(values: object) -> tuple[str, ...]:
    out = []
    for v in _listed(values, "dns", MAX_DNS, "IPv4 addresses"):
        try:
            addr = ipaddress.IPv4Address(v)
        except (ipaddress.AddressValueError, ValueError, TypeError):
            raise _bad(f"dns server {v!r} is not an IPv4 address") from None
        if addr.is_loopback or addr.is_unspecified or addr.is_multicast or addr.is_link_local:
            raise _bad(f"dns server {v} cannot be reached from a session (loopback, link-local, multicast "
                       "and 0.0.0.0 are the host's or nobody's)")
        out.append(str(addr))
    return tuple(dict.fromkeys(out))


def _check_allow(values: object) -> tuple[str, ...]:
    out = []
    for v in _listed(values, "allow", MAX_ALLOW, "IPv4 networks"):
        try:
            net = ipaddress.IPv4Network(v, strict=True)
        except (ipaddress.AddressValueError, ipaddress.NetmaskValueError, ValueError, TypeError):
            raise _bad(f"allow entry {v!r} is not an IPv4 network like 192.168.7.0/24 (host bits clear)") from None
        out.append(str(net))
    return tuple(dict.fromkeys(out))


def parse_text(text: str) -> NetworkPolicy:
    """``none``, ``nat:<upstream>``, ``nat:<upstream>:<dns>[,<dns>...]`` or a JSON object."""
    text = text.strip()
    if text.startswith("{"):
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise _bad(f"network {text!r} is not valid JSON: {exc}") from None
        return NetworkPolicy.from_spec(value)
    parts = text.split(":")
    if parts[0] == "none" and len(parts) == 1:
        return NetworkPolicy()
    if parts[0] == "nat":
        if len(parts) == 1 or not parts[1]:
            return NetworkPolicy.from_spec({"policy": "nat"})  # the clear "needs an upstream" error
        if len(parts) > 3:
            raise _bad(f"network {text!r}: use nat:<upstream> or nat:<upstream>:<dns>[,<dns>...]")
        dns = [d for d in parts[2].split(",") if d] if len(parts) == 3 else []
        return NetworkPolicy.from_spec({"policy": "nat", "upstream": parts[1], "dns": dns})
    raise _bad(f"unknown network policy {text!r}: use 'none', 'nat:<upstream>' or 'nat:<upstream>:<dns>'")


# ------------------------------------------------------------------------------------ this host
def _link(ipr, name: str) -> int | None:
    idx = ipr.link_lookup(ifname=name)
    return idx[0] if idx else None


def _route_oif(ipr, dst: str) -> tuple[int | None, int]:
    """(output interface index, route type) the host uses for ``dst``; (None, 0) when unroutable."""
    from pyroute2.netlink.exceptions import NetlinkError

    try:
        routes = ipr.route("get", dst=dst)
    except NetlinkError:
        return None, 0
    if not routes:
        return None, 0
    r = routes[0]
    return r.get_attr("RTA_OIF"), r["type"]


def host_resolvers(paths: tuple[str, ...] | None = None) -> list[str]:
    out: list[str] = []
    for path in HOST_RESOLV_CONFS if paths is None else paths:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                lines = f.read(65536).splitlines()
        except OSError:
            continue
        for line in lines:
            words = line.split()
            if len(words) >= 2 and words[0] == "nameserver":
                try:
                    out.append(str(ipaddress.IPv4Address(words[1])))
                except ValueError:
                    continue
    return list(dict.fromkeys(out))


def resolve_for_host(policy: NetworkPolicy, *, restoring: bool = False) -> NetworkPolicy:
    """Check ``policy`` against this host and fill in its DNS servers; ``none`` passes unchanged.

    The upstream must exist and have an IPv4 address; each DNS server must be routed out through
    it. For a restore (``restoring``) only the upstream's existence is checked: the snapshot already
    holds its resolv.conf."""
    if not policy.nat:
        return policy
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        idx = _link(ipr, policy.upstream)
        if idx is None:
            names = sorted(link.get_attr("IFLA_IFNAME") for link in ipr.get_links())
            names = [n for n in names if n and not n.startswith("dvh") and n != "lo"]
            if restoring:
                raise FailedPrecondition(f"the snapshot's upstream interface {policy.upstream!r} is not on this "
                                         f"host (it has {', '.join(names) or 'no other interface'})",
                                         reason=Reason.UPSTREAM_MISSING)
            raise InvalidArgument(f"upstream interface {policy.upstream!r} does not exist on this host (it has "
                                  f"{', '.join(names) or 'no other interface'})", reason=Reason.UPSTREAM_NOT_FOUND)
        if restoring:
            return policy
        if not ipr.get_addr(index=idx, family=socket.AF_INET):
            raise InvalidArgument(f"upstream interface {policy.upstream!r} has no IPv4 address to masquerade "
                                  "behind", reason=Reason.UPSTREAM_UNUSABLE)
        if policy.dns:
            for server in policy.dns:
                oif, rtype = _route_oif(ipr, server)
                if oif != idx or rtype != 1:  # RTN_UNICAST
                    raise InvalidArgument(f"dns server {server} is not reached through {policy.upstream!r} on this "
                                          "host: a session could not reach it", reason=Reason.DNS_UNREACHABLE)
            return policy
        found = host_resolvers()
        usable = [ns for ns in found if not ipaddress.IPv4Address(ns).is_loopback
                  and _route_oif(ipr, ns) == (idx, 1)][:MAX_DNS]
    if not usable:
        raise InvalidArgument(f"no DNS server for the session: the host's resolvers ({', '.join(found) or 'none'}) "
                              f"are not reached through {policy.upstream!r}; name one, e.g. "
                              f"{{'policy': 'nat', 'upstream': {policy.upstream!r}, 'dns': ['<address>']}}",
                              reason=Reason.NO_DNS)
    return NetworkPolicy("nat", policy.upstream, tuple(usable), policy.allow)


def resolv_conf(policy: NetworkPolicy) -> str:
    lines = ["# written by Drums for the session's network policy 'nat'"]
    lines += [f"nameserver {ns}" for ns in policy.dns]
    lines.append("options timeout:2 attempts:2")
    return "\n".join(lines) + "\n"


def write_resolv_conf(root: str, policy: NetworkPolicy, owner: tuple[int, int]) -> None:
    """Point the session's resolver at the policy's DNS servers (through the safe path helpers:
    a symlink the image or the session put at ``/etc/resolv.conf`` is replaced, never followed)."""
    from ..host import safepath

    safepath.replace_file(root, "etc/resolv.conf", resolv_conf(policy), owner=owner)


def from_options(network: str | None = None, upstream: str | None = None, dns: list[str] | None = None,
                 allow: list[str] | None = None) -> NetworkPolicy:
    """A policy from command-line style options: ``network`` in the text form (:func:`parse_text`),
    then ``upstream``, ``dns`` and ``allow`` over it (giving any of them alone means ``nat``)."""
    base = parse_text(network) if network else NetworkPolicy()
    if not (upstream or dns or allow):
        return base
    if network and not base.nat and network.strip() == "none":
        raise _bad("network policy 'none' takes no upstream, dns or allow (did you mean 'nat'?)")
    return NetworkPolicy.from_spec({"policy": "nat", "upstream": upstream or base.upstream,
                                    "dns": list(dns or base.dns), "allow": list(allow or base.allow)})
