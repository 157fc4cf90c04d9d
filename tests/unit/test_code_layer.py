"""The code layer (drums_core.session.rootfs.build_code_layer) carries the bytecode of its sources:
a session's programs (init, exec helper, guest server) import from it without compiling anything,
on a read-only layer where they could not write it."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from drums_core.config import GUEST_CODE
from drums_core.session import rootfs


def test_every_module_of_the_code_layer_has_its_bytecode_and_imports_use_it(tmp_path: Path) -> None:
    layer = rootfs.build_code_layer(tmp_path, os.getuid())
    code = layer / GUEST_CODE.lstrip("/")
    sources = sorted(code.rglob("*.py"))
    assert len(sources) > 100
    missing = [str(p) for p in sources if not Path(importlib.util.cache_from_source(str(p))).is_file()]
    assert not missing, f"modules without bytecode in the code layer: {missing[:5]}"
    out = subprocess.run([sys.executable, "-v", "-c", "import drums_core.session.enter, drums_osworld.guest.server"],
                         env={"PYTHONPATH": str(code), "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                              "PYTHONDONTWRITEBYTECODE": "1"},
                         capture_output=True, text=True, cwd="/", timeout=120)
    ours = [line for line in out.stderr.splitlines() if line.startswith("# code object from") and str(code) in line]
    assert ours and all("__pycache__" in line for line in ours), [line for line in ours if "__pycache__" not in line]
