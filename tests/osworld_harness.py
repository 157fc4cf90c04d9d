"""``python tests/osworld_harness.py [--evaluators]``: the command the README and ``drums bench`` name for
building OSWorld's test venv. The harness itself is tests/support/osworld_harness.py (imported by the
tests as ``tests.support.osworld_harness``); this file only runs it."""
import runpy
from pathlib import Path

runpy.run_path(str(Path(__file__).resolve().parent / "support" / "osworld_harness.py"), run_name="__main__")
