"""``DesktopEnv(provider_name="drums")`` with a network policy, through real desktop-env 1.0.2.

The policy comes from the provider options (``provider_options(network=...)`` around the
``DesktopEnv`` constructor) or from ``$DRUMS_NETWORK``; the desktop then reaches the stand-in
upstream of :mod:`tests.support.netstandin` (a host in a network namespace this test makes), through the
guest server as OSWorld's own controllers would run a command. A bad policy fails the constructor
with ``BAD_NETWORK``. The ``nat`` desktops have an ``init_state`` of their own (the policy is part
of the desktop spec): the ``none`` one is not reused for them.
"""
from __future__ import annotations

import os

import pytest

from tests.support.netstandin import StandIn

DNS, WEB = "203.0.113.53", "203.0.113.80"
FETCH = ("python3 -c \"import urllib.request; "
         "print(urllib.request.urlopen('http://web.standin.test/{path}', timeout=5).read().decode())\"")


@pytest.fixture
def up():
    with StandIn(f"dsw{os.getpid() % 100000}", 5, {"web.standin.test": WEB, "dns.standin.test": DNS},
                 name="osworld") as s:
        yield s


def test_desktop_env_takes_the_policy_from_provider_options_and_the_environment(osworld, client, up):
    policy = {"policy": "nat", "upstream": up.ifname, "dns": [DNS]}
    out = osworld.run(f'''
        from drums_osworld.provider.registration import provider_options
        res = {{}}
        with provider_options(network={policy!r}):
            env = DesktopEnv(provider_name="drums", action_space="pyautogui")
        res["options"] = {{"network": env.provider.desktop.session["spec"]["network"],
                          "fetch": guest_sh(env, {FETCH.format(path="from-options")!r}).strip()}}
        env.close()
        env = DesktopEnv(provider_name="drums", action_space="pyautogui")  # $DRUMS_NETWORK
        res["env"] = {{"network": env.provider.desktop.session["spec"]["network"],
                      "fetch": guest_sh(env, {FETCH.format(path="from-env")!r}).strip()}}
        env.close()
        try:
            with provider_options(network="nat"):
                DesktopEnv(provider_name="drums")
        except Exception as e:
            res["bad"] = [type(e).__name__, getattr(e, "reason", None), str(e)]
        emit(res)
    ''', DRUMS_NETWORK=f"nat:{up.ifname}:{DNS}")
    want = {"policy": "nat", "upstream": up.ifname, "dns": [DNS], "allow": []}
    assert out["options"]["network"] == want and out["env"]["network"] == want, out
    assert out["options"]["fetch"] == "standin osworld /from-options", out
    assert out["env"]["fetch"] == "standin osworld /from-env", out
    assert out["bad"][:2] == ["InvalidArgument", "BAD_NETWORK"] and "needs an upstream" in out["bad"][2], out
    paths = [h["path"] for h in up.log()["http"]]
    assert paths == ["/from-options", "/from-env"], paths
    assert client.list() == []
    assert up.forwarding() == "0"
    for s in client.snapshots():  # the nat init_state names this test's upstream: it goes with it
        if up.ifname in str(s.get("spec", {}).get("network")):
            client.delete_snapshot(s["id"])
