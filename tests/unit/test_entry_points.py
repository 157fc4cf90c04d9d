"""The entry points setup.cfg declares: console scripts, image specs and CLI commands each load what
their group expects (a line under the wrong group header had made the daemon an image spec)."""
from __future__ import annotations

import configparser
import importlib
from pathlib import Path

SETUP = Path(__file__).resolve().parents[2] / "setup.cfg"


def _groups() -> dict[str, dict[str, str]]:
    cfg = configparser.ConfigParser()
    cfg.read(SETUP)
    out = {}
    for group, body in cfg["options.entry_points"].items():
        lines = [ln.strip() for ln in body.strip().splitlines() if ln.strip()]
        out[group] = dict((part.strip() for part in ln.split("=", 1)) for ln in lines)
    return out


def _load(target: str):
    module, func = target.split(":")
    return getattr(importlib.import_module(module), func)


def test_each_entry_point_is_in_its_group():
    groups = _groups()
    assert set(groups["console_scripts"]) == {"drums", "drumsd"}
    for target in groups["console_scripts"].values():
        assert callable(_load(target))
    from drums_core.host.images import ImageSpec

    for name, target in groups["drums.image_specs"].items():
        spec = _load(target)()
        assert isinstance(spec, ImageSpec) and spec.name == name, (name, target)
    for target in groups["drums.cli"].values():
        assert callable(_load(target))
