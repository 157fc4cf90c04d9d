"""The OSWorld task classifier (drums_osworld.catalog) on OSWorld's own task files.

The task set is ../shared/osworld-tasks (DRUMS_OSWORLD_TASKS overrides): OSWorld's 369 tasks,
verbatim. The committed list must be what the classifier makes of them today.
"""
from __future__ import annotations

import ast
import copy
import json
import os
from pathlib import Path

import pytest

from drums_osworld import catalog
from drums_osworld.catalog import apps as catalog_apps
from drums_osworld.catalog import rules
from drums_osworld.catalog.__main__ import main as catalog_main
from drums_osworld.tasks import OSWORLD_GETTERS, OSWORLD_METRICS, OSWORLD_STEP_TYPES

from tests.support.taskset import osworld_tasks_dir

REPO = Path(__file__).resolve().parents[2]
TASKS = osworld_tasks_dir()
OSWORLD_SITE = Path(os.environ.get("DRUMS_OSWORLD_VENV", "/opt/drums/osworld-venv")) / "lib" / "python3.11" / \
    "site-packages" / "desktop_env"


def _tasks_dir() -> Path:
    if not (TASKS / "examples").is_dir():
        pytest.fail(f"OSWorld's task set is missing at {TASKS} (set DRUMS_OSWORLD_TASKS)")
    return TASKS


def task(prefix: str) -> tuple[str, dict]:
    hits = list((_tasks_dir() / "examples").glob(f"*/{prefix}*.json"))
    assert len(hits) == 1, f"{prefix}: {hits}"
    return hits[0].parent.name, json.loads(hits[0].read_text())


@pytest.fixture(scope="module")
def committed() -> dict[str, catalog.Entry]:
    return {e.id: e for e in catalog.load_list()}


def by_prefix(entries: dict[str, catalog.Entry], prefix: str) -> catalog.Entry:
    hits = [e for i, e in entries.items() if i.startswith(prefix)]
    assert len(hits) == 1, prefix
    return hits[0]


def test_committed_list_is_what_the_classifier_makes_of_the_task_set():
    fresh = catalog.build(_tasks_dir())
    doc = json.loads(catalog.LIST_PATH.read_text())
    assert doc["tasks"] == fresh["tasks"], "stale list: run python -m drums_osworld.catalog build --tasks ..."
    assert doc["counts"] == fresh["counts"]
    assert fresh["counts"]["tasks"] == 369
    assert fresh["counts"]["offline"] + fresh["counts"]["excluded"] == 369
    assert catalog_main(["check", "--tasks", str(_tasks_dir())]) == 0


def test_every_exclusion_has_a_known_code_and_a_reason(committed):
    for e in committed.values():
        assert e.offline == (not e.exclusions), e.key
        for x in e.exclusions:
            assert x["code"] in rules.CODES, (e.key, x)
            assert len(x["reason"]) > 10, (e.key, x)


@pytest.mark.parametrize("prefix,code", [
    ("2373b66a", "PACKAGE_INSTALL"),  # apt-get install sysstat
    ("48d05431", "PACKAGE_INSTALL"),  # conda
    ("69acbb55", "LIVE_SITE"),        # a GitHub project to set up
    ("f8369178", "PACKAGE_INSTALL"),  # a theme from gnome-look.org
    ("3c8f201a", "LIVE_SITE"),        # a download URL in the instruction
    ("e1fc0df3", "PACKAGE_INSTALL"),  # the LanguageTool extension
    ("94d95f96", "PACKAGE_INSTALL"),  # Spotify
    ("93eabf48", "NEWER_DESKTOP_ENV"),  # chrome_appearance_mode_ui
    ("5ac2891a", "NEWER_DESKTOP_ENV"),  # check_play_and_exit
    ("bba3381f", "LIVE_SITE"),        # stream a video from the web
    ("9656a811", "PACKAGE_INSTALL"),  # apt install jq in setup
])
def test_tasks_known_to_need_the_internet_are_excluded_with_their_reason(committed, prefix, code):
    e = by_prefix(committed, prefix)
    assert not e.offline
    assert code in {x["code"] for x in e.exclusions}, e.exclusions


def test_download_steps_and_cloud_getters_always_exclude():
    for _domain, path, t in catalog.read_tasks(_tasks_dir()):
        types = {s.get("type") for _, _, s in rules.steps(t)}
        getters = {g["type"] for g in rules.getter_configs(t)}
        codes = {x.code for x in rules.exclusions(t)}
        if "download" in types:
            assert "DOWNLOAD" in codes, path
        if getters & {"cloud_file", "googledrive_file"}:
            assert "CLOUD_GETTER" in codes, path
        if "chrome_open_tabs" in types:
            assert codes, path


def test_offline_flags_infeasible_and_vs_code(committed):
    e = by_prefix(committed, "e0df059f")
    assert e.offline and not e.infeasible and not e.vs_code and e.apps["all"] == []
    bt = by_prefix(committed, "b3d4a89c")  # switch on Bluetooth
    assert bt.offline and bt.infeasible
    code = [x for x in committed.values() if x.domain == "vs_code"]
    assert code and all(x.vs_code for x in code)
    assert any(x.offline for x in code)


def test_rules_on_changed_real_tasks():
    _, t = task("e0df059f")
    assert rules.exclusions(t) == []
    t2 = copy.deepcopy(t)
    t2["config"].append({"type": "download", "parameters": {"files": [{"url": "https://example.org/a.txt",
                                                                        "path": "/home/user/a.txt"}]}})
    assert [x.code for x in rules.exclusions(t2)] == ["DOWNLOAD"]
    t3 = copy.deepcopy(t)
    t3["config"][0]["parameters"]["command"] = "wget -O /tmp/x https://example.org/x"
    assert [x.code for x in rules.exclusions(t3)] == ["WEB_FETCH"]
    t4 = copy.deepcopy(t)
    t4["config"][0]["parameters"]["command"] = "curl http://localhost:8080/ping"
    assert [x.code for x in rules.exclusions(t4)] == ["WEB_FETCH"], "curl is a fetch whatever the address"
    t5 = copy.deepcopy(t)
    t5["evaluator"]["func"] = "check_structure_sim_with_threshold"
    assert [x.code for x in rules.exclusions(t5)] == ["NEWER_DESKTOP_ENV"]
    # the instruction's needs do not count for an infeasible task: its answer is FAIL
    _, inf = task("5ca86c6f")  # "download the logo ... using only GIMP"
    assert inf["evaluator"]["func"] == "infeasible" and rules.exclusions(inf) == []
    feasible = copy.deepcopy(inf)
    feasible["evaluator"] = {"func": "exact_match", "result": {"type": "rule", "rules": {}}}
    feasible["instruction"] = "Please install GIMP's resynthesizer plug-in."
    assert [x.code for x in rules.exclusions(feasible)] == ["PACKAGE_INSTALL"]


@pytest.mark.parametrize("prefix,expected", [
    ("030eeff7", {"chrome", "socat"}),                        # launch google-chrome + socat, Chrome getter
    ("215dfd39", {"vlc"}),                                    # "VLC_VERBOSE=-1 vlc ..." (shell launch)
    ("2cd43775", {"libreoffice_impress"}),                    # libreoffice --impress
    ("ec4e3f68", {"gsettings", "gnome_shell_schemas"}),       # org.gnome.shell favorite-apps
    ("28cc3b7e", {"pulseaudio"}),                             # pactl in the getter
    ("b6781586", {"timedatectl"}),                            # timedatectl status
    ("937087b6", {"vlc", "xdg_utils"}),                       # default_video_player, related_apps vlc
    ("13584542", {"terminal", "accessibility"}),              # ctrl+alt+t, vm_terminal_output
    ("7767eef2", {"gimp"}),
])
def test_apps_from_setup_getters_and_related_apps(prefix, expected):
    _, t = task(prefix)
    assert set(catalog.task_apps(t)["all"]) == expected


def test_postconfig_pkill_needs_no_app():
    _, t = task("030eeff7")  # postconfig: pkill chrome, then google-chrome again
    got = catalog.task_apps(t)
    assert got["setup"] == ["chrome", "socat"] and "chrome" in got["evaluator"]


def test_image_fit_reads_the_manifest(tmp_path):
    store = tmp_path / "images"
    (store / "test").mkdir(parents=True)
    manifest = {"name": "test", "packages": {"vlc": "3.0.21", "libreoffice-impress": "4:7.4", "socat": "1.7"}}
    (store / "test" / "manifest.json").write_text(json.dumps(manifest))
    entries = {e.id: e for e in catalog.load_list()}
    vlc, chrome, imp = (by_prefix(entries, p) for p in ("215dfd39", "030eeff7", "2cd43775"))
    lacking = catalog.image_fit([vlc, chrome, imp], "test", store)
    assert vlc.key not in lacking and imp.key not in lacking
    assert set(lacking[chrome.key]) == {"chrome"} and "chromium" in lacking[chrome.key]["chrome"]
    with pytest.raises(FileNotFoundError, match="no image 'absent'"):
        catalog.image_fit([vlc], "absent", store)


def test_vscode_is_never_in_a_debian_image():
    assert catalog_apps.missing_apps(["vscode"], {"libreoffice-writer": "x"})["vscode"].startswith("needs code")


def test_the_cli_rejects_a_directory_without_tasks(tmp_path, capsys):
    assert catalog_main(["build", "--tasks", str(tmp_path), "--out", str(tmp_path / "x.json")]) == 2
    assert "no task files" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def _exported(module_dir: Path) -> set[str]:
    tree = ast.parse((module_dir / "__init__.py").read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            names |= {a.asname or a.name for a in node.names}
        elif isinstance(node, ast.FunctionDef):
            names.add(node.name)
    return names


def test_the_version_tables_match_the_installed_desktop_env():
    if not OSWORLD_SITE.is_dir():
        pytest.fail(f"desktop-env 1.0.2 is not installed at {OSWORLD_SITE} (python tests/osworld_harness.py)")
    metrics = _exported(OSWORLD_SITE / "evaluators" / "metrics")
    getters = {n[4:] for n in _exported(OSWORLD_SITE / "evaluators" / "getters") if n.startswith("get_")}
    assert OSWORLD_METRICS <= metrics and OSWORLD_GETTERS == getters
    setup_src = (OSWORLD_SITE / "controllers" / "setup.py").read_text()
    for stype in OSWORLD_STEP_TYPES:
        assert f"def _{stype}_setup(" in setup_src, stype
