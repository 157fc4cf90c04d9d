"""What a CRIU failure says: the error lines of its log, without the probes' noise, the cause first."""
from __future__ import annotations

from drums_core.session.criu import error_lines, summary

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
# kerndat's probes, logged as errors at the start of every run of the daemon's CRIU on this host
KERNDAT = [
    "Error (criu/tun.c:85): tun: Unable to create tun: Operation not permitted",
    "Error (criu/util.c:1534): rlimit: Can't setup RLIMIT_NOFILE for self: Operation not permitted",
    "Error: ipv4: Address already assigned.",   # ip's word on a restored namespace's loopback
    "Error: ipv6: address already assigned.",
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


def test_the_cause_comes_first_in_the_message() -> None:
    """A restore that failed opening a file: the message names the file (its first error line), not
    only CRIU's later 'Unable to open fd' and 'Restoring FAILED' lines."""
    cause = "44: Error (criu/files-reg.c:2213): Can't open file home/user/x on restore: No such file or directory"
    then = ["44: Error (criu/files.c:1221): Unable to open fd=44 id=0x10e",
            "Error (criu/cr-restore.c:2331): Restoring FAILED.",
            "Error (criu/cgroup.c:2055): cg: cgroupd: recv req error: No such file or directory"]
    lines = error_lines([*KERNDAT, cause, *PROBES, *then])
    assert lines == [cause, *then]
    assert summary(lines) == " | ".join([cause, *then])
    many = [f"Error (criu/x.c:{i}): line {i}" for i in range(30)]
    kept = error_lines(many, limit=12)
    assert kept == many[:6] + many[-6:]
    said = summary(kept)
    assert said.startswith(many[0]) and said.endswith(many[-1]) and "... 8 more" in said
