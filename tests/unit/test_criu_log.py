"""What a CRIU failure says: the error lines of its log, without the iptables probes' noise."""
from __future__ import annotations

from drums_core.session.criu import error_lines

# The tail of a restore log on a host without iptables: CRIU probes for the iptables tools in every
# run (and logs each failed probe as an error) even when the images hold no rules.
PROBES = [
    "(00.052101)      1: Error (criu/util.c:642): execvp(\"iptables-restore\", ...) failed: No such file or directory",
    "(00.052190)      1: Error (criu/util.c:1723): iptables-restore -V failed",
    "(00.052301)      1: Error (criu/util.c:642): execvp(\"iptables-legacy-restore\", ...) failed: Permission denied",
    "(00.052390)      1: Error (criu/util.c:1723): iptables-legacy-restore -V failed",
    "(00.052501)      1: Error (criu/util.c:1723): ip6tables-restore -V failed",
    "(00.052601)      1: Error (criu/util.c:642): execvp(\"ip6tables-legacy-restore\", ...) failed: Permission denied",
    "(00.052690)      1: Error (criu/util.c:1723): ip6tables-legacy-restore -V failed",
]


def test_the_cause_is_not_hidden_by_the_iptables_probes() -> None:
    cause = "(00.051000)     41: Error (criu/files-reg.c:2213): Can't open file tmp/x on restore: No such file"
    log = ["(00.000100) Version: 4.2.1", cause, *PROBES, "(00.060000) Restoring FAILED."]
    assert error_lines(log) == [cause]


def test_a_missing_iptables_tool_for_real_rules_still_shows() -> None:
    real = "(00.052700)      1: Error (criu/net.c:2563): Can't restore ip6tables dump - no legacy version present"
    assert error_lines([*PROBES, real]) == [real]


def test_a_log_without_errors_gives_its_tail() -> None:
    log = [f"({i:08.6f}) line {i}" for i in range(20)]
    assert error_lines(log, limit=5) == log[-5:]
    assert error_lines(PROBES, limit=3) == PROBES[-3:]  # only noise: the tail, noise and all
