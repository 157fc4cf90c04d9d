"""The ``nat`` network policy on the host: per-session rules in the run's nftables table, the
session's default route, and the run's holds on its upstreams' forwarding (:mod:`drums_core.host.hostnet`).

The run's table (:func:`drums_core.session.netns.create_nft_table`) has, for this module:

* ``map nat_links`` (session link -> ``jump nat_<link>``), consulted first by the forward chain;
* ``set nat_addrs``: the addresses of ``nat`` sessions, masqueraded in ``postrouting`` and the only
  session addresses that replies (``ct state established,related``) are forwarded to;
* ``set guarded``: upstreams whose forwarding Drums turned on; anything they would forward
  elsewhere than to a session link is dropped, so the host routes for nobody else;
* ``set blocked``: :data:`drums_core.session.netpolicy.BLOCKED`.

A session's chain ``nat_<link>`` accepts, in order: IPv4 only, from the session's own address
only (spoofed sources are dropped), out through its upstream only (so never to the host, another
session, or out another interface), to its DNS servers on port 53, to the networks the host
granted (``allow``); it drops the blocked ranges and accepts the rest. When the session goes, the
host's conntrack entries of the flows it opened go too (late replies never reach the slot's next
session). Everything of one session
goes in or out in one ``nft`` transaction; clearing it is idempotent (an element or chain that is
absent is added and deleted again in the same transaction), so a slot is always clean before reuse.
"""
from __future__ import annotations

import contextlib
import logging
import re
import subprocess
import threading
import uuid
from collections.abc import Iterator

from ..host import hostnet
from ..errors import DrumsError, FailedPrecondition, Unavailable
from ..reasons import Reason
from ..sweep.ledger import Ledger
from .netpolicy import NetworkPolicy

log = logging.getLogger("drums.nat")


def _nft(script: str, what: str) -> None:
    out = subprocess.run(["nft", "-f", "-"], input=script, capture_output=True, text=True, check=False, timeout=30)
    if out.returncode != 0:
        raise Unavailable(f"nft could not {what}: {out.stderr.strip()[-1000:]}", reason=Reason.NFT_FAILED)


def session_script(table: str, ifname: str, address: str, policy: NetworkPolicy) -> str:
    t, chain = f"inet {table}", f"nat_{ifname}"
    rules = ["meta nfproto != ipv4 drop", f"ip saddr != {address} drop", f'oifname != "{policy.upstream}" drop']
    if policy.dns:
        dns = ", ".join(f"{ns} . {proto} . 53" for ns in policy.dns for proto in ("udp", "tcp"))
        rules.append(f"ip daddr . meta l4proto . th dport {{ {dns} }} accept")
    if policy.allow:
        rules.append(f"ip daddr {{ {', '.join(policy.allow)} }} accept")
    rules += ["ip daddr @blocked drop", "accept"]
    lines = [f"add chain {t} {chain}", f"flush chain {t} {chain}"]
    lines += [f"add rule {t} {chain} {r}" for r in rules]
    lines += [f"add element {t} nat_addrs {{ {address} }}",
              f'add element {t} nat_links {{ "{ifname}" : jump {chain} }}']
    return "\n".join(lines) + "\n"


def clear_script(table: str, ifname: str, address: str) -> str:
    t, chain = f"inet {table}", f"nat_{ifname}"
    return "\n".join([
        f"add chain {t} {chain}",
        f"flush chain {t} {chain}",
        f'add element {t} nat_links {{ "{ifname}" : jump {chain} }}',
        f'delete element {t} nat_links {{ "{ifname}" }}',
        f"add element {t} nat_addrs {{ {address} }}",
        f"delete element {t} nat_addrs {{ {address} }}",
        f"delete chain {t} {chain}",
    ]) + "\n"


def forget_flows(address: str) -> int:
    """Delete the host's conntrack entries of flows a session at ``address`` opened, so that late
    replies of a gone session never reach the next one given the same slot. Returns how many."""
    import socket

    from pyroute2 import Conntrack
    from pyroute2.netlink.nfnetlink.nfctsocket import NFCTAttrTuple

    n = 0
    ct = Conntrack()
    try:
        for entry in list(ct.dump_entries(tuple_orig=NFCTAttrTuple(saddr=address, family=socket.AF_INET))):
            try:
                ct.delete(entry)
                n += 1
            except Exception:  # noqa: BLE001 - gone meanwhile (a timeout or another delete)
                pass
    finally:
        ct.close()
    return n


def _set_link_forwarding(ifname: str, value: str) -> None:
    if not re.fullmatch(r"dvh[0-9]{1,5}", ifname):
        raise Unavailable(f"{ifname!r} is not a session link", reason=Reason.BAD_LINK)
    try:
        with open(f"/proc/sys/net/ipv4/conf/{ifname}/forwarding", "w") as f:
            f.write(value)
    except OSError as exc:
        raise Unavailable(f"cannot set forwarding on {ifname}: {exc}", reason=Reason.SYSCTL_FAILED) from exc


class NatManager:
    """One run's ``nat`` sessions: which upstream each uses, and the run's hold on each upstream."""

    def __init__(self, ledger: Ledger, table: str) -> None:
        self.ledger = ledger
        self.table = table
        self._lock = threading.Lock()
        self._users: dict[str, set[str]] = {}

    def attach(self, sid: str, ifname: str, address: str, policy: NetworkPolicy) -> None:
        """Route session ``sid`` (its link ``ifname`` exists, its guest side is configured) out
        through its upstream. Raises Unavailable (nothing of the session left in place), or
        FailedPrecondition ``NAT_BLOCKED`` while an older Drums run's table drops routed session traffic
        (looked for when the run first holds the upstream)."""
        with self._lock:
            if not self._users.get(policy.upstream):
                self._check_not_blocked()
                try:
                    hostnet.acquire(self.ledger, policy.upstream,
                                    on_change=lambda: self._guard(policy.upstream, True))
                except DrumsError as exc:
                    self._let_go(policy.upstream)
                    raise Unavailable(f"cannot route session {sid} out through {policy.upstream}: {exc.message}",
                                      reason=exc.reason, detail=exc.detail) from exc
            self._users.setdefault(policy.upstream, set()).add(sid)
        try:
            _nft(session_script(self.table, ifname, address, policy), f"route session {sid} out")
            _set_link_forwarding(ifname, "1")
        except Unavailable:
            self.detach(sid, ifname, address, policy)
            raise

    def detach(self, sid: str, ifname: str, address: str, policy: NetworkPolicy) -> bool:
        """Remove the session's rules (its link is gone or going); the run's last session on an
        upstream lets go of it. False when the rules could not be removed (keep the slot unused)."""
        ok = True
        try:
            _nft(clear_script(self.table, ifname, address), f"clear the rules of session {sid}")
        except (Unavailable, subprocess.TimeoutExpired) as exc:
            log.error("rules of session %s on %s not removed: %s", sid, ifname, exc)
            ok = False
        try:
            forget_flows(address)
        except Exception as exc:  # noqa: BLE001 - the rules are gone: stale flows only time out later
            log.warning("conntrack entries of session %s (%s) not removed: %s", sid, address, exc)
        with self._lock:
            users = self._users.get(policy.upstream, set())
            if sid not in users:
                return ok
            users.discard(sid)
            if not users:
                self._users.pop(policy.upstream, None)
                self._let_go(policy.upstream)
        return ok

    def _let_go(self, upstream: str) -> None:
        try:
            hostnet.release(self.ledger, upstream, on_released=lambda: self._guard(upstream, False))
        except DrumsError as exc:  # the entry stays: the sweep puts the setting back
            log.error("forwarding on %s not put back: %s", upstream, exc.message)

    def _check_not_blocked(self) -> None:
        from .netns import blocking_tables

        blockers = blocking_tables(self.table)
        if blockers:
            raise FailedPrecondition(f"the nftables tables {', '.join(blockers)} of Drums daemons from before network "
                                     "policies drop every session link's routed traffic: restart those daemons "
                                     "(`drums shutdown`, after `scripts/provision`) to use 'nat'",
                                     reason=Reason.NAT_BLOCKED, detail={"tables": blockers})

    def _guard(self, upstream: str, on: bool) -> None:
        t = f"inet {self.table}"
        if on:
            _nft(f'add element {t} guarded {{ "{upstream}" }}\n', f"guard {upstream}")
        else:
            _nft(f'add element {t} guarded {{ "{upstream}" }}\ndelete element {t} guarded {{ "{upstream}" }}\n',
                 f"unguard {upstream}")

    def upstreams(self) -> dict[str, list[str]]:
        with self._lock:
            return {u: sorted(s) for u, s in self._users.items()}

    @contextlib.contextmanager
    def pinned(self, policy: NetworkPolicy) -> Iterator[None]:
        """Keep the run's hold on ``policy``'s upstream through a block (a checkpoint that tears its
        session down and restores it), so the host setting does not flap off and on."""
        if not policy.nat:
            yield
            return
        token = f"pin-{uuid.uuid4().hex}"
        with self._lock:
            held = bool(self._users.get(policy.upstream))
            if held:
                self._users[policy.upstream].add(token)
        try:
            yield
        finally:
            if held:
                with self._lock:
                    users = self._users.get(policy.upstream, set())
                    users.discard(token)
                    if not users:
                        self._users.pop(policy.upstream, None)
                        self._let_go(policy.upstream)
