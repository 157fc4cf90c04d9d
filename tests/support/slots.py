"""Slot blocks: which slots a test process may give its daemon instances.

Every test process (the one process of a plain ``pytest`` run, or each pytest-xdist worker) owns one
block of :data:`BLOCK` slots, and every instance the suite starts takes its slots from its own
process's block: the suite's daemon, the spare slots of tests that start another daemon, the
orphans test, the benchmark smoke runs and the fault windows. Two workers of one run therefore never
share a slot, link, X display or nftables set.

The block is chosen in two steps. :func:`preferred_block` derives it from the run and the worker
(``PYTEST_XDIST_TESTRUNUID``/``PYTEST_XDIST_WORKER``; without xdist, the pid): the workers of one
run prefer consecutive, distinct blocks. :func:`claim_block` then takes the first block from there
that no other process on the host holds (an ``flock`` held for the process's lifetime, under
:data:`LOCK_DIR`), so two concurrent suite runs do not collide either.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

FIRST = 1000  # below: the default instance (0..63), `drums bench`'s default (300..399)
BLOCK = 384
LAST = 16384  # slots are 0..16383 (drums_core.config.slot_addresses)
NBLOCKS = (LAST - FIRST) // BLOCK
LOCK_DIR = Path("/run/lock/drums-test-slots")


@dataclass(frozen=True)
class Block:
    """One block of slots and how the suite divides it."""

    index: int

    @property
    def base(self) -> int:
        return FIRST + self.index * BLOCK

    def _part(self, start: int, count: int) -> range:
        return range(self.base + start, self.base + start + count)

    @property
    def suite(self) -> range:
        """The suite's daemon (``pytest-<pid>``)."""
        return self._part(0, 32)

    @property
    def spare(self) -> range:
        """Tests that start another daemon for a while (tests in one process run one at a time)."""
        return self._part(32, 16)

    @property
    def orphans(self) -> range:
        """tests/faults/test_orphans.py: two instances of 8."""
        return self._part(48, 16)

    @property
    def bench(self) -> range:
        """``drums bench --quick`` in tests/bench (an instance family takes 100 slots)."""
        return self._part(64, 100)

    @property
    def faults(self) -> range:
        """The fault windows (tests/faults/harness.py): 4 slots per window, up to 55 windows."""
        return self._part(164, BLOCK - 164)

    @property
    def slots(self) -> range:
        return self._part(0, BLOCK)


def worker_id() -> str:
    """This process's pytest-xdist worker (``gw0``, ``gw1``, ...), or ``""`` outside xdist."""
    return os.environ.get("PYTEST_XDIST_WORKER", "")


def run_id() -> str:
    """The run this process belongs to: xdist's test-run id (the same in every worker of a run), or
    this process's pid when it runs alone."""
    return os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"pid{os.getpid()}"


def preferred_block(run: str, worker: str, nblocks: int = NBLOCKS) -> int:
    """The block a worker of a run tries first: the run picks a starting block, worker ``gwK`` takes
    the K-th after it (so the workers of a run never prefer the same block)."""
    start = int.from_bytes(hashlib.sha256(run.encode()).digest()[:8], "big") % nblocks
    k = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    return (start + k) % nblocks


_held: dict[tuple[Path, int], int] = {}  # (lock dir, block index) -> fd of its lock, held until the process exits


def claim_block(run: str | None = None, worker: str | None = None, lock_dir: Path = LOCK_DIR) -> Block:
    """Claim the first block, from the preferred one on, that no other process holds. The lock lives
    as long as the process. Without a writable lock directory the preferred block is used unclaimed."""
    first = preferred_block(run_id() if run is None else run, worker_id() if worker is None else worker)
    try:
        lock_dir.mkdir(parents=True, exist_ok=True)
    except OSError:
        return Block(first)
    for i in range(NBLOCKS):
        index = (first + i) % NBLOCKS
        if (lock_dir, index) in _held:
            continue
        try:
            fd = os.open(lock_dir / f"{index}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            return Block(first)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        _held[lock_dir, index] = fd
        return Block(index)
    raise RuntimeError(f"all {NBLOCKS} slot blocks under {lock_dir} are held by other test processes")


def release_block(block: Block, lock_dir: Path = LOCK_DIR) -> None:
    """Give a claimed block back (the unit test of the claim; a test process keeps its own)."""
    fd = _held.pop((lock_dir, block.index), None)
    if fd is not None:
        os.close(fd)


_mine: Block | None = None


def my_block() -> Block:
    """This process's block, claimed on first use."""
    global _mine
    if _mine is None:
        _mine = claim_block()
    return _mine
