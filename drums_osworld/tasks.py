"""OSWorld-format task files: load, validate, list.

A task is OSWorld's JSON (``evaluation_examples/examples/<domain>/<id>.json``): ``id``,
``instruction``, ``config`` (setup steps), ``evaluator`` (``func``, ``result``, ``expected``,
``options``, ``conj``, ``postconfig``), plus informational fields OSWorld ignores. Drums tasks may
add ``drums_solution`` and ``drums_wrong_solution``: lists of actions as OSWorld's ``pyautogui``
action space sends them (pyautogui code strings, or ``WAIT``/``DONE``/``FAIL``).

:func:`load_task` accepts a path, a dict or a :class:`Task` and raises :class:`TaskError`
(a ``ValueError``) naming every problem found, so a malformed task fails before it touches a desktop.
With ``require_drums_support=True`` it also rejects step types, getters and metrics that OSWorld has
but Drums' own offline implementation (``drums_osworld.evaluation``) does not.
"""
from __future__ import annotations

import copy
import json
import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from drums_core.errors import InvalidArgument
from drums_core.reasons import Reason

from .actions import SPECIAL_ACTIONS

__all__ = [
    "OSWORLD_GETTERS",
    "OSWORLD_METRICS",
    "OSWORLD_STEP_TYPES",
    "SPECIAL_ACTIONS",
    "Task",
    "TaskError",
    "find_task",
    "list_tasks",
    "load_task",
    "load_tasks",
    "tasks_dir",
    "validate_task",
]

#: Metric names exported by ``desktop_env.evaluators.metrics`` in desktop-env 1.0.2.
OSWORLD_METRICS = frozenset("""
    check_accessibility_tree check_auto_saving_time check_brightness_decrease_and_structure_sim
    check_config_status check_contrast_increase_and_structure_sim check_csv
    check_direct_json_object check_enabled_experiments check_file_exists
    check_file_exists_and_structure_sim check_font_size check_global_key_play_pause
    check_gnome_favorite_apps check_green_background check_highlighted_words
    check_history_deleted check_html_background_image check_image_file_size check_image_mirror
    check_image_size check_image_stretch_and_center check_include_exclude
    check_italic_font_size_14 check_json check_json_keybindings check_json_settings
    check_left_panel check_libre_locale check_line_number check_list check_moved_jpgs
    check_mp3_meta check_no_duplicates check_one_instance_when_started_from_file
    check_page_number_colors check_palette_and_structure_sim check_pdf_pages
    check_presenter_console_disable check_python_file_by_gold_file
    check_python_file_by_test_suite check_qt_bgcone check_qt_max_volume check_qt_minimal_view
    check_qt_slider_colours check_saturation_increase_and_structure_sim check_sharper
    check_slide_numbers_color check_slide_orientation_Portrait check_strikethrough
    check_structure_sim check_structure_sim_resized check_tabstops check_text_enlarged
    check_textbox_on_leftside check_thunderbird_filter check_thunderbird_folder
    check_thunderbird_prefs check_transition check_triangle_position compare_answer
    compare_archive compare_audios compare_conference_city_in_order compare_config
    compare_contains_image compare_csv compare_docx_files
    compare_docx_files_and_ignore_new_lines compare_docx_images compare_docx_lines
    compare_docx_tables compare_epub compare_font_names compare_highlighted_text compare_htmls
    compare_image_list compare_image_text compare_images compare_init_lines
    compare_insert_equation compare_line_spacing compare_pdf_images compare_pdfs
    compare_pptx_files compare_python_pure_text compare_references compare_result_files
    compare_subscript_contains compare_table compare_terminal_and_txt compare_text_file
    compare_time_in_speedtest_results compare_triangle_positions compare_unique_train_records
    compare_videos compare_zip_files contains_page_break decrease_brightness diff_text_file
    evaluate_alignment evaluate_colored_words_in_tables evaluate_conversion
    evaluate_presentation_fill_to_rgb_distance evaluate_spacing
    evaluate_strike_through_last_paragraph exact_match file_contains find_default_font
    fuzzy_match fuzzy_place_math get_unique_train_ids has_page_numbers_in_footers
    increase_saturation infeasible is_added_to_steam_cart is_cookie_deleted
    is_expected_active_tab is_expected_active_tab_approximate is_expected_bookmarks
    is_expected_installed_extensions is_expected_search_query is_expected_tabs
    is_expected_url_pattern_match is_extension_installed is_first_line_centered
    is_gold_text_included_in_pdf is_in_list is_in_vm_clickboard is_included_all_json_objects
    is_shortcut_on_desktop is_utc_0 is_vlc_fullscreen is_vlc_playing is_vlc_recordings_folder
    literal_match match_in_list run_sqlite3
""".split())

#: Getter types (``get_<type>``) exported by ``desktop_env.evaluators.getters`` in desktop-env 1.0.2.
OSWORLD_GETTERS = frozenset("""
    accessibility_tree active_tab_html_parse active_tab_info active_tab_url_parse
    active_url_from_accessTree audio_in_slide background_image_in_slide bookmarks cache_file
    chrome_font_size chrome_language cloud_file conference_city_in_order content_from_vm_file
    cookie_data data_delete_automacally default_search_engine default_video_player
    enable_do_not_track enable_enhanced_safety_browsing enable_safe_browsing enabled_experiments
    find_installed_extension_name find_unpacked_extension_path gimp_config_file googledrive_file
    gotoRecreationPage_and_get_html_content history info_from_website list_directory
    macys_product_url_parse new_startup_page number_of_search_results open_tabs_info page_info
    pdf_from_url profile_name replay rule rule_relativeTime shortcuts_on_desktop time_diff_range
    url_dashPart url_path_parse vlc_config vlc_playing_info vm_command_error vm_command_line
    vm_file vm_screen_size vm_terminal_output vm_wallpaper vm_window_size vscode_config
""".split())

# Setup step types of OSWorld 1.0.2's SetupController (``_<type>_setup``): their parameter names,
# the required ones, and whether the method takes ``**kwargs`` (then any name is accepted).
_ANY = None
OSWORLD_STEP_TYPES: dict[str, tuple[frozenset[str] | None, frozenset[str]]] = {
    "download": (frozenset({"files"}), frozenset({"files"})),
    "upload_file": (frozenset({"files"}), frozenset({"files"})),
    "change_wallpaper": (frozenset({"path"}), frozenset({"path"})),
    "tidy_desktop": (_ANY, frozenset()),
    "open": (frozenset({"path"}), frozenset({"path"})),
    "launch": (frozenset({"command", "shell"}), frozenset({"command"})),
    "execute": (frozenset({"command", "stdout", "stderr", "shell", "until"}), frozenset({"command"})),
    "execute_with_verification": (
        frozenset({"command", "verification", "max_wait_time", "check_interval", "shell"}),
        frozenset({"command"}),
    ),
    # ``_command_setup(command, **kwargs)`` forwards to ``_execute_setup``.
    "command": (frozenset({"command", "stdout", "stderr", "shell", "until"}), frozenset({"command"})),
    "sleep": (frozenset({"seconds"}), frozenset({"seconds"})),
    "act": (frozenset({"action_seq"}), frozenset({"action_seq"})),
    "replay": (frozenset({"trajectory"}), frozenset({"trajectory"})),
    "activate_window": (frozenset({"window_name", "strict", "by_class"}), frozenset({"window_name"})),
    "close_window": (frozenset({"window_name", "strict", "by_class"}), frozenset({"window_name"})),
    "proxy": (frozenset({"client_password"}), frozenset()),
    "chrome_open_tabs": (frozenset({"urls_to_open"}), frozenset({"urls_to_open"})),
    "chrome_close_tabs": (frozenset({"urls_to_close"}), frozenset({"urls_to_close"})),
    "googledrive": (_ANY, frozenset()),
    "login": (_ANY, frozenset()),
    "update_browse_history": (_ANY, frozenset()),
}

_PYAUTOGUI_PREFIX = "import pyautogui; import time; pyautogui.FAILSAFE = False; "
_SOLUTION_FIELDS = ("drums_solution", "drums_wrong_solution")


class TaskError(InvalidArgument, ValueError):
    """A task file or dict is malformed, or uses something Drums cannot run.

    ``problems`` lists every problem found (each a short sentence naming the field);
    ``source`` names the file (or ``<dict>``). Nothing was run.
    """

    default_reason = Reason.TASK_INVALID

    def __init__(self, problems: Iterable[str] | str, *, source: str = "<dict>",
                 reason: str | None = None) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        self.source = source
        if len(self.problems) == 1:
            message = f"invalid task {source}: {self.problems[0]}"
        else:
            message = f"invalid task {source}:\n  - " + "\n  - ".join(self.problems)
        super().__init__(message, reason=reason, detail={"source": source, "problems": self.problems})


@dataclass(frozen=True)
class Task:
    """A validated task. ``raw`` is the task dict as OSWorld's ``DesktopEnv.reset`` takes it."""

    raw: Mapping[str, Any]
    path: Path | None = None
    drums_supported: bool = field(default=False, compare=False)

    @property
    def id(self) -> str:
        """The task's id."""
        return self.raw["id"]

    @property
    def instruction(self) -> str:
        """What the agent is asked to do."""
        return self.raw["instruction"]

    @property
    def config(self) -> list[dict[str, Any]]:
        """The task's setup steps (empty when it has none)."""
        return self.raw.get("config", [])

    @property
    def evaluator(self) -> dict[str, Any]:
        """The task's evaluator section (``func``, ``result``, ``expected``, ...)."""
        return self.raw["evaluator"]

    @property
    def domain(self) -> str:
        """The task's domain: its directory under ``tasks/``, else its ``snapshot`` field."""
        if self.path is not None and self.path.parent.name and self.path.parent.name != "tasks":
            return self.path.parent.name
        return str(self.raw.get("snapshot", ""))

    @property
    def solution(self) -> list[str] | None:
        """Drums' reference solution (pyautogui code per step), if the task has one."""
        return self.raw.get("drums_solution")

    @property
    def wrong_solution(self) -> list[str] | None:
        """A solution that must score 0, if the task has one."""
        return self.raw.get("drums_wrong_solution")

    def to_dict(self) -> dict[str, Any]:
        """A deep copy of the task dict (extra ``drums_*`` fields included; OSWorld ignores them)."""
        return copy.deepcopy(dict(self.raw))

    def __repr__(self) -> str:
        return f"Task({self.id!r}, path={str(self.path) if self.path else None!r})"


# -- validation -------------------------------------------------------------------------------
def _is_str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _check_command(where: str, params: Mapping[str, Any], problems: list[str]) -> None:
    command = params.get("command")
    if isinstance(command, str):
        if not command.strip():
            problems.append(f"{where}: 'command' is empty")
    elif _is_str_list(command):
        if not command:
            problems.append(f"{where}: 'command' is empty")
    else:
        problems.append(f"{where}: 'command' must be a string or a list of strings, "
                        f"got {type(command).__name__}")
    if "shell" in params and not isinstance(params["shell"], bool):
        problems.append(f"{where}: 'shell' must be true or false")


@dataclass(frozen=True)
class _Kinds:
    """How to check the ``type`` of one kind of task object (a setup step, a getter config)."""

    not_object: str                  # the problem when it is no object
    no_type: str                     # ... when it has no string type
    osworld: Any                     # the types OSWorld 1.0.2 has
    unknown: Any                     # type -> the problem when OSWorld does not have it
    drums: Any                       # the types Drums implements
    unsupported: Any                 # type -> the problem when Drums does not implement it


def _known_type(where: str, obj: Any, problems: list[str], drums: bool, kinds: _Kinds) -> str | None:
    """The ``type`` of ``obj`` when OSWorld has it, else None (the problem noted). With ``drums``, a
    type Drums does not implement is a problem too, but is returned: its parameters are still checked."""
    if not isinstance(obj, Mapping):
        problems.append(f"{where}: {kinds.not_object}")
        return None
    kind = obj.get("type")
    if not isinstance(kind, str):
        problems.append(f"{where}: {kinds.no_type}")
        return None
    if kind not in kinds.osworld:
        problems.append(f"{where}: {kinds.unknown(kind)}")
        return None
    if drums and kind not in kinds.drums:
        problems.append(f"{where}: {kinds.unsupported(kind)}")
    return kind


def _check_step(where: str, step: Any, problems: list[str], drums: bool) -> None:
    from drums_osworld.evaluation.setup import SUPPORTED_STEP_TYPES

    stype = _known_type(where, step, problems, drums, _Kinds(
        not_object="a step must be an object with 'type' and 'parameters'", no_type="missing step 'type'",
        osworld=OSWORLD_STEP_TYPES,
        unknown=lambda t: f"unknown step type {t!r} (OSWorld's are: {', '.join(sorted(OSWORLD_STEP_TYPES))})",
        drums=SUPPORTED_STEP_TYPES,
        unsupported=lambda t: (f"step type {t!r} is OSWorld's but Drums' offline setup does not implement it "
                               f"(supported: {', '.join(sorted(SUPPORTED_STEP_TYPES))})")))
    if stype is None:
        return
    if "parameters" not in step:
        problems.append(f"{where}: missing 'parameters' (OSWorld requires it, even if empty)")
        return
    params = step["parameters"]
    if not isinstance(params, Mapping):
        problems.append(f"{where}: 'parameters' must be an object")
        return
    allowed, required = OSWORLD_STEP_TYPES[stype]
    for name in sorted(required - set(params)):
        problems.append(f"{where}: {stype} step is missing parameter {name!r}")
    if allowed is not None:
        for name in sorted(set(params) - allowed):
            problems.append(f"{where}: {stype} step has unknown parameter {name!r} "
                            f"(allowed: {', '.join(sorted(allowed))})")
    if required - set(params):
        return
    if stype in ("launch", "execute", "command", "execute_with_verification"):
        _check_command(where, params, problems)
        for name in ("stdout", "stderr"):
            if name in params and not isinstance(params[name], str):
                problems.append(f"{where}: {name!r} must be a file name in the cache directory")
            elif name in params and params[name] and (os.path.isabs(params[name]) or ".." in Path(params[name]).parts):
                problems.append(f"{where}: {name!r} must be a relative name inside the cache directory")
        if "until" in params and not isinstance(params["until"], Mapping):
            problems.append(f"{where}: 'until' must be an object (returncode/stdout/stderr)")
    elif stype == "sleep":
        seconds = params["seconds"]
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds < 0:
            problems.append(f"{where}: 'seconds' must be a non-negative number")
    elif stype == "open":
        if not isinstance(params["path"], str) or not params["path"]:
            problems.append(f"{where}: 'path' must be a non-empty string")
    elif stype in ("activate_window", "close_window"):
        if not isinstance(params["window_name"], str) or not params["window_name"]:
            problems.append(f"{where}: 'window_name' must be a non-empty string")
        for name in ("strict", "by_class"):
            if name in params and not isinstance(params[name], bool):
                problems.append(f"{where}: {name!r} must be true or false")
    elif stype in ("upload_file", "download"):
        files = params["files"]
        keys = ("local_path", "path") if stype == "upload_file" else ("url", "path")
        if not isinstance(files, list) or not files:
            problems.append(f"{where}: 'files' must be a non-empty list")
            return
        for j, f in enumerate(files):
            if not isinstance(f, Mapping) or not all(isinstance(f.get(k), str) and f.get(k) for k in keys):
                problems.append(f"{where}: files[{j}] must be an object with non-empty "
                                f"{' and '.join(repr(k) for k in keys)}")


def _check_steps(where: str, label: str, steps: Any, problems: list[str], drums: bool) -> None:
    if not isinstance(steps, list):
        problems.append(f"{label} must be a list of setup steps")
        return
    for i, step in enumerate(steps):
        _check_step(f"{where}[{i}]", step, problems, drums)


def _check_getter(where: str, cfg: Any, problems: list[str], drums: bool) -> None:
    from drums_osworld.evaluation.getters import GETTERS

    gtype = _known_type(where, cfg, problems, drums, _Kinds(
        not_object="a getter config must be an object with a 'type'", no_type="missing getter 'type'",
        osworld=OSWORLD_GETTERS, unknown=lambda t: f"unknown getter type {t!r} (no get_{t} in OSWorld 1.0.2)",
        drums=GETTERS,
        unsupported=lambda t: f"getter {t!r} is OSWorld's but Drums does not implement it "
                              f"(supported: {', '.join(sorted(GETTERS))})"))
    if gtype is None:
        return
    if gtype in ("vm_command_line", "vm_command_error"):
        if "command" not in cfg:
            problems.append(f"{where}: {gtype} needs 'command'")
        else:
            _check_command(where, cfg, problems)
    elif gtype == "rule":
        if "rules" not in cfg:
            problems.append(f"{where}: rule needs 'rules'")
    elif gtype == "cache_file":
        if not isinstance(cfg.get("path"), str) or not cfg["path"]:
            problems.append(f"{where}: cache_file needs a 'path' (a name in the task's cache directory)")
    elif gtype == "vm_file":
        for name in ("path", "dest"):
            if name not in cfg:
                problems.append(f"{where}: vm_file needs {name!r}")
        if "path" in cfg and "dest" in cfg:
            if cfg.get("multi", False):
                if not (_is_str_list(cfg["path"]) and _is_str_list(cfg["dest"])
                        and len(cfg["path"]) == len(cfg["dest"])):
                    problems.append(f"{where}: vm_file with multi needs 'path' and 'dest' as lists "
                                    "of strings of the same length")
            elif not (isinstance(cfg["path"], str) and isinstance(cfg["dest"], str)):
                problems.append(f"{where}: vm_file 'path' and 'dest' must be strings (or lists with multi)")
            dests = cfg["dest"] if isinstance(cfg["dest"], list) else [cfg["dest"]]
            for d in dests:
                if isinstance(d, str) and (os.path.isabs(d) or ".." in Path(d).parts or not d):
                    problems.append(f"{where}: vm_file 'dest' {d!r} must be a relative name in the cache dir")
        if "gives" in cfg and not (isinstance(cfg["gives"], list)
                                   and all(isinstance(g, int) for g in cfg["gives"])):
            problems.append(f"{where}: vm_file 'gives' must be a list of indices")


def _check_actions(name: str, actions: Any, problems: list[str]) -> None:
    if not isinstance(actions, list) or not actions:
        problems.append(f"{name}: must be a non-empty list of actions (pyautogui code strings or "
                        "WAIT/DONE/FAIL)")
        return
    for i, action in enumerate(actions):
        if not isinstance(action, str):
            problems.append(f"{name}[{i}]: must be a string, got {type(action).__name__}")
            continue
        if action in SPECIAL_ACTIONS:
            continue
        try:
            compile(_PYAUTOGUI_PREFIX + action, f"<{name}[{i}]>", "exec")
        except SyntaxError as exc:
            problems.append(f"{name}[{i}]: not valid Python after OSWorld's pyautogui prefix: "
                            f"{exc.msg} (line {exc.lineno})")


def validate_task(raw: Any, *, require_drums_support: bool = False) -> list[str]:
    """Every problem in the task dict ``raw``, as sentences; an empty list means it is valid."""
    from drums_osworld.evaluation.metrics import METRICS

    problems: list[str] = []
    if not isinstance(raw, Mapping):
        return [f"a task must be a JSON object, got {type(raw).__name__}"]
    for name in ("id", "instruction", "evaluator"):
        if name not in raw:
            problems.append(f"missing required field {name!r}")
    if "config" not in raw:
        problems.append("missing required field 'config' (use [] for a task without setup)")
    if "id" in raw and (not isinstance(raw["id"], str) or not raw["id"].strip()
                        or "/" in raw["id"] or raw["id"] in (".", "..")):
        problems.append("'id' must be a non-empty string without '/' (it names the cache directory)")
    if "instruction" in raw and (not isinstance(raw["instruction"], str) or not raw["instruction"].strip()):
        problems.append("'instruction' must be a non-empty string")

    _check_steps("config", "'config'", raw.get("config", []), problems, require_drums_support)

    ev = raw.get("evaluator")
    if "evaluator" in raw and not isinstance(ev, Mapping):
        problems.append("'evaluator' must be an object")
        ev = None
    if ev is not None:
        _validate_evaluator(ev, problems, require_drums_support, METRICS)

    for name in _SOLUTION_FIELDS:
        if name in raw:
            _check_actions(name, raw[name], problems)
    return problems


def _validate_evaluator(ev: Mapping[str, Any], problems: list[str], drums: bool,
                        drums_metrics: Mapping[str, Any]) -> None:
    _check_steps("evaluator.postconfig", "evaluator.postconfig", ev.get("postconfig", []), problems, drums)

    if "func" not in ev:
        problems.append("evaluator: missing 'func' (a metric name or a list of names)")
        return
    func = ev["func"]
    names = func if isinstance(func, list) else [func]
    if not names or not all(isinstance(n, str) for n in names):
        problems.append("evaluator.func must be a metric name or a non-empty list of names")
        return
    for n in names:
        if n not in OSWORLD_METRICS:
            problems.append(f"evaluator.func: unknown metric {n!r} (not in OSWorld 1.0.2's metrics)")
        elif drums and n not in drums_metrics:
            problems.append(f"evaluator.func: metric {n!r} is OSWorld's but Drums does not implement it "
                            f"(supported: {', '.join(sorted(drums_metrics))})")
    if func == "infeasible":
        return  # DesktopEnv.evaluate returns before any getter or metric runs

    if "conj" in ev and ev["conj"] not in ("and", "or"):
        problems.append(f"evaluator.conj must be 'and' or 'or', got {ev['conj']!r}")

    if isinstance(func, list):
        n = len(func)
        result = ev.get("result")
        if not isinstance(result, list) or len(result) != n:
            problems.append(f"evaluator.result must be a list of {n} getter configs (one per metric)")
        else:
            for i, cfg in enumerate(result):
                _check_getter(f"evaluator.result[{i}]", cfg, problems, drums)
        if "expected" in ev:
            expected = ev["expected"]
            if not isinstance(expected, list) or len(expected) != n:
                problems.append(f"evaluator.expected must be a list of {n} getter configs (one per metric)")
            else:
                for i, cfg in enumerate(expected):
                    if not cfg:
                        problems.append(f"evaluator.expected[{i}] is empty: OSWorld 1.0.2 calls the "
                                        "expected getter of every metric when 'expected' is present")
                    else:
                        _check_getter(f"evaluator.expected[{i}]", cfg, problems, drums)
        if "options" in ev:
            options = ev["options"]
            if not isinstance(options, list) or len(options) != n:
                problems.append(f"evaluator.options must be a list of {n} objects (or nulls) for a list func")
            elif not all(o is None or isinstance(o, Mapping) for o in options):
                problems.append("evaluator.options entries must be objects or null")
    else:
        result = ev.get("result")
        if not result:
            problems.append("evaluator: missing 'result' getter config")
        elif isinstance(result, list):
            problems.append("evaluator.result must be one getter config when func is a single name")
        else:
            _check_getter("evaluator.result", result, problems, drums)
        if ev.get("expected"):
            if isinstance(ev["expected"], list):
                problems.append("evaluator.expected must be one getter config when func is a single name")
            else:
                _check_getter("evaluator.expected", ev["expected"], problems, drums)
        if "options" in ev and not isinstance(ev["options"], Mapping):
            problems.append("evaluator.options must be an object when func is a single name")


# -- loading ----------------------------------------------------------------------------------
def load_task(source: str | os.PathLike[str] | Mapping[str, Any] | Task, *,
              require_drums_support: bool = False) -> Task:
    """Load and validate a task from a JSON file path, a dict or a :class:`Task`.

    Raises :class:`TaskError` listing every problem (unreadable file, bad JSON, missing fields,
    unknown step types, getters or metrics, inconsistent list evaluators, invalid solutions).
    """
    path: Path | None = None
    if isinstance(source, Task):
        if not require_drums_support or source.drums_supported:
            return source
        raw, path = source.raw, source.path
    elif isinstance(source, Mapping):
        raw = copy.deepcopy(dict(source))
    elif isinstance(source, (str, os.PathLike)):
        path = Path(source)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise TaskError(f"cannot read the task file: {exc.strerror or exc}", source=str(path),
                            reason=Reason.TASK_UNREADABLE) from exc
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TaskError(f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
                            source=str(path), reason=Reason.TASK_NOT_JSON) from exc
    else:
        raise TaskError(f"a task is a path, a dict or a Task, not {type(source).__name__}")
    where = str(path) if path is not None else "<dict>"
    problems = validate_task(raw, require_drums_support=require_drums_support)
    if problems:
        raise TaskError(problems, source=where)
    return Task(raw=raw, path=path, drums_supported=require_drums_support)


def tasks_dir() -> Path:
    """The directory of Drums' bundled tasks.

    ``$DRUMS_TASKS_DIR`` when set; else the ``tasks/`` directory next to the package (a source
    checkout); else ``<prefix>/share/drums/tasks``.
    """
    env = os.environ.get("DRUMS_TASKS_DIR")
    if env:
        return Path(env)
    here = Path(__file__).resolve().parent.parent / "tasks"
    if here.is_dir():
        return here
    return Path(sys.prefix) / "share" / "drums" / "tasks"


def list_tasks(root: str | os.PathLike[str] | None = None) -> list[Path]:
    """The task files under ``root`` (default :func:`tasks_dir`), as ``<domain>/<id>.json``, sorted."""
    base = Path(root) if root is not None else tasks_dir()
    if not base.is_dir():
        return []
    return sorted(p for p in base.rglob("*.json") if p.is_file())


def load_tasks(root: str | os.PathLike[str] | None = None, *,
               require_drums_support: bool = True) -> list[Task]:
    """Every task under ``root``, validated (raises :class:`TaskError` at the first bad one)."""
    return [load_task(p, require_drums_support=require_drums_support) for p in list_tasks(root)]


def find_task(name: str, root: str | os.PathLike[str] | None = None) -> Path:
    """The file of the task named ``name``: its id, ``<domain>/<id>``, or a unique id prefix."""
    files = list_tasks(root)
    key = name[:-5] if name.endswith(".json") else name
    exact = [p for p in files if p.stem == key or f"{p.parent.name}/{p.stem}" == key]
    if exact:
        return exact[0]
    prefixed = [p for p in files if p.stem.startswith(key)]
    if len(prefixed) == 1:
        return prefixed[0]
    where = root if root is not None else tasks_dir()
    if prefixed:
        raise TaskError(f"task name {name!r} is ambiguous: "
                        f"{', '.join(p.stem for p in prefixed)}", source=str(where), reason=Reason.TASK_AMBIGUOUS)
    raise TaskError(f"no task named {name!r}", source=str(where), reason=Reason.TASK_NOT_FOUND)
