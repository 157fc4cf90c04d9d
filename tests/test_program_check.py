"""A spec that names a program its image lacks is refused before anything starts, with a reason that
names the program (it used to be ``SESSION_DIED: session init (pid N) is gone``), and a path that
would leave the session's root is looked up inside it, never on the host."""
from __future__ import annotations

import subprocess
import sys

import pytest

from drums_core.errors import FailedPrecondition, InvalidArgument

from tests.support.suite import INSTANCE

HOST_ONLY = "/opt/drums/venv/bin/python"  # the host's venv: no image has it


@pytest.mark.parametrize("spec, program", [
    ({"programs": [{"name": "guest", "argv": [HOST_ONLY, "-m", "drums_osworld.guest"]}]}, HOST_ONLY),
    ({"window_manager": "no-such-window-manager"}, "no-such-window-manager"),
    # resolved within the session's root: the dot-dots stop at its /, the host's file is not found
    ({"programs": [{"name": "escape", "argv": ["/../../../../.." + HOST_ONLY]}]}, "/../../../../.." + HOST_ONLY),
])
def test_a_missing_program_is_named_and_nothing_is_left(client, spec: dict, program: str) -> None:
    with pytest.raises(FailedPrecondition) as exc:
        client.create(spec)
    assert exc.value.reason == "PROGRAM_MISSING" and program in str(exc.value), exc.value
    assert client.list() == []


def test_an_empty_or_malformed_argv_is_a_bad_spec(client) -> None:
    for argv in ([], [""], ["ok", 3]):
        with pytest.raises(InvalidArgument) as exc:
            client.create({"programs": [{"name": "p", "argv": argv}]})
        assert exc.value.reason == "BAD_SPEC", exc.value


def test_drums_up_with_a_host_program_says_which(client) -> None:
    out = subprocess.run([sys.executable, "-m", "drums_core.cli", "--instance", INSTANCE.name, "up", "--bare",
                          "--program", f"{HOST_ONLY} -m drums_osworld.guest"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode != 0
    assert "PROGRAM_MISSING" in out.stderr and HOST_ONLY in out.stderr, out.stderr
    assert client.list() == []
