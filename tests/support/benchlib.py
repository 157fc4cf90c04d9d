"""What the ``drums bench`` tests (tests/bench) share: their instance and its slots, the clean-up check."""
from __future__ import annotations

import os

from .slots import my_block

# each suite runs on an instance family of its own (benchtest-<pid>, -ksm, -prof, -ca, -cb), on the
# 100 bench slots of this test process's block
INSTANCE = f"benchtest-{os.getpid()}"
SLOT_BASE = my_block().bench.start


def assert_clean(res: dict) -> None:
    cleanups = res["cleanup"]
    if "leaks" in cleanups:
        cleanups = {"main": cleanups}
    for name, c in cleanups.items():
        assert c["leaked"] == 0, f"{name} left resources on the host: {c['leaks']}"
