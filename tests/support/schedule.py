"""The order in which the desktop lane hands its files to the pytest-xdist workers: longest first.

A file's tests stay on one worker (``--dist loadfile``), so a long file handed out last keeps one
worker busy while the others have nothing left (the lane's last minutes ran on one of three
workers). Handing the longest files out first (longest processing time first) ends the workers
together. The figures are each file's seconds (setup, call and teardown of its tests) in one
fresh-clone run of ``make test`` with 3 workers; a file not listed counts as :data:`DEFAULT`.
They only order the files: a wrong figure costs time, never a test.
"""
from __future__ import annotations

DEFAULT = 20.0

FILE_SECONDS = {
    "tests/bench/test_bench_smoke.py": 417,
    "tests/bench/test_osworld_tasks.py": 44,
    "tests/osworld/test_reference_solutions.py": 735,
    "tests/osworld/test_post_setup_budget.py": 284,
    "tests/test_images.py": 276,
    "tests/gym/test_gym_env.py": 255,
    "tests/test_a11y.py": 194,
    "tests/test_snapshots.py": 177,
    "tests/osworld/test_reuse.py": 143,
    "tests/test_tasks_local.py": 127,
    "tests/test_engine.py": 115,
    "tests/osworld/test_provider.py": 106,
    "tests/test_layer_chain.py": 89,
    "tests/test_store_budget.py": 78,
    "tests/gym/test_rollouts.py": 78,
    "tests/test_osworld_desktop.py": 60,
    "tests/test_evaluation_parity.py": 59,
    "tests/test_cli.py": 58,
    "tests/gym/test_branch_from_step.py": 57,
    "tests/ray/test_ray_pool.py": 48,
    "tests/ray/test_bench_cluster.py": 42,
    "tests/test_network_policy.py": 41,
    "tests/test_session_limits.py": 39,
    "tests/gym/test_demo.py": 39,
    "tests/osworld/test_setup_failure_osworld.py": 35,
    "tests/test_guest_in_session.py": 35,
    "tests/test_containment.py": 31,
    "tests/guest/test_server.py": 29,
    "tests/guest/test_osworld_compat.py": 28,
    "tests/gym/test_setup_failure.py": 27,
    "tests/ray/test_transfer.py": 17,
    "tests/test_dump_retry.py": 16,
}


def weight(relpath: str) -> float:
    """The expected seconds of the test file at ``relpath`` (``tests/...``, forward slashes)."""
    return float(FILE_SECONDS.get(relpath, DEFAULT))
