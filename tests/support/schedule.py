"""How the desktop lane hands its tests to the pytest-xdist workers: by file, longest first.

A file's tests stay on one worker (module fixtures, one module's desktops; :func:`make_scheduler`
is ``--dist loadfile`` with this module's unit), except the files of :data:`SPLIT`, whose tests
are handed out one by one. A long unit handed out last keeps one worker busy while the others have
nothing left, so the units go out longest first (longest processing time first), and the workers
end together. The figures are each file's seconds (setup, call and teardown of its tests) in one
fresh-clone run of ``make test`` with 5 workers (DRUMS_TEST_CPU's rows, 2026-12-07); a file not listed counts
as :data:`DEFAULT`, a test of a split file as its share of the file's figure. They only order the
work: a wrong figure costs time, never a test.
"""
from __future__ import annotations

DEFAULT = 12.0

# Files of 12 s or less are left at DEFAULT. An unlisted file of 68 s (tests/test_restore_race.py)
# once went out last and kept one worker busy for a minute after the others had ended.
FILE_SECONDS = {
    "tests/osworld/test_reference_solutions.py": 593,
    "tests/bench/test_bench_smoke.py": 492,
    "tests/osworld/test_post_setup_budget.py": 302,
    "tests/gym/test_gym_env.py": 267,
    "tests/test_snapshots.py": 156,
    "tests/test_images.py": 133,
    "tests/test_a11y.py": 125,
    "tests/osworld/test_reuse.py": 113,
    "tests/test_layer_chain.py": 112,
    "tests/osworld/test_provider.py": 111,
    "tests/bench/test_osworld_tasks.py": 109,
    "tests/test_engine.py": 109,
    "tests/test_tasks_local.py": 108,
    "tests/test_gnome_desktop.py": 100,
    "tests/bench/test_bench_density_smoke.py": 99,
    "tests/test_noisy_neighbour_store.py": 86,
    "tests/test_restore_race.py": 68,
    "tests/test_noisy_neighbour_reads.py": 62,
    "tests/test_containment.py": 59,
    "tests/test_osworld_desktop.py": 58,
    "tests/test_noisy_neighbour.py": 58,
    "tests/gym/test_branch_from_step.py": 54,
    "tests/test_dump_retry.py": 54,
    "tests/ray/test_bench_cluster.py": 50,
    "tests/test_store_budget.py": 50,
    "tests/gym/test_rollouts.py": 50,
    "tests/test_network_policy.py": 46,
    "tests/gym/test_demo.py": 43,
    "tests/ray/test_ray_pool.py": 38,
    "tests/test_guest_in_session.py": 37,
    "tests/test_cli.py": 37,
    "tests/test_evaluation_parity.py": 34,
    "tests/osworld/test_setup_failure_osworld.py": 26,
    "tests/guest/test_osworld_compat.py": 25,
    "tests/guest/test_server.py": 24,
    "tests/gym/test_setup_failure.py": 24,
    "tests/ray/test_multienv.py": 14,
    "tests/ray/test_transfer.py": 13,
    "tests/test_session_limits.py": 13,
    "tests/test_sweep.py": 12,
}

# Files whose tests are handed out one by one: the two longest, whose tests share nothing but
# session-wide fixtures (each benchmark smoke run has instances of its own; each reference solution
# its own DesktopEnv). Whole, either would keep one worker busy for minutes after the others ended.
SPLIT = frozenset({"tests/bench/test_bench_smoke.py", "tests/osworld/test_reference_solutions.py"})


def weight(relpath: str) -> float:
    """The expected seconds of the test file at ``relpath`` (``tests/...``, forward slashes)."""
    return float(FILE_SECONDS.get(relpath, DEFAULT))


def unit_of(nodeid: str) -> str:
    """The unit of work a worker is handed for the test ``nodeid``: its file, or the test alone
    in a file of :data:`SPLIT`."""
    path = nodeid.split("::", 1)[0]
    return nodeid if path in SPLIT else path


def unit_weights(relpaths: list[str]) -> list[float]:
    """Each test's share of its unit's expected seconds, for tests at ``relpaths`` (one per test,
    in collection order): a whole file's figure for a file handed out whole, a file's figure
    divided among its tests for a file of :data:`SPLIT`."""
    count: dict[str, int] = {}
    for p in relpaths:
        count[p] = count.get(p, 0) + 1
    return [weight(p) / count[p] if p in SPLIT else weight(p) for p in relpaths]


def make_scheduler(config, log):
    """The desktop lane's pytest-xdist scheduler: ``--dist loadfile`` whose unit is
    :func:`unit_of` (a file, or one test of a file in :data:`SPLIT`), handed out in collection
    order (tests/conftest.py sorts it longest first)."""
    from xdist.scheduler import LoadScopeScheduling

    class ByUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    return ByUnit(config, log)
