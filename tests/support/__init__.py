"""Helpers shared by the test suite, imported as ``tests.support.<module>`` (the suite's conftest puts
the checkout first on ``sys.path``; nothing here edits ``sys.path``).

- :mod:`.wait`: ``wait_until``, the one way a test waits for a state.
- :mod:`.slots`: this test process's block of slots (per pytest-xdist worker, claimed on the host).
- :mod:`.suite`: the suite's daemon instance, its env, ``drums`` in a subprocess, stopping instances.
- :mod:`.leaks`: what Drums could have left on the host, per instance and per run.
- guests and desktops: :mod:`.local_guest`, :mod:`.guestlib`, :mod:`.a11y_hostile` (runs in a guest);
  the network stand-in :mod:`.netstandin` (+ :mod:`.netstandin_server`, run in its namespace);
  gym :mod:`.gymlib`; Ray :mod:`.raylib`; OSWorld :mod:`.osworld_harness` (its venv),
  :mod:`.osworldlib`, :mod:`.solutionlib`, :mod:`.taskset`; documents :mod:`.docfiles`.
"""
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
