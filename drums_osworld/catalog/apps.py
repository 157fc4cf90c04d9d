"""Which applications an OSWorld task needs, and whether a desktop image has them.

A task's applications come from three places, all recorded (``by_source``):

- ``setup``: the programs its ``launch``/``execute``/``command``/``open`` steps (and postconfig)
  start, and the key presses that open a terminal (``ctrl+alt+t``);
- ``evaluator``: what its getters read (Chrome's profile, VLC's ``vlcrc``, GIMP's ``gimprc``,
  the accessibility tree, ``gsettings``, ``pactl``, ``timedatectl`` in ``vm_command_line``);
- ``related_apps``: the task file's own list (a hint: it names what the agent is meant to use).

An application is available in an image when every one of its package groups has at least one
package in the image's manifest (``/var/lib/drums/images/<name>/manifest.json``, ``packages``).
VS Code (``vscode``) is not packaged for Debian: no image built from Debian's archive has it.
"""
from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .rules import getter_configs, steps

__all__ = ["APPS", "App", "image_packages", "missing_apps", "task_apps"]


@dataclass(frozen=True)
class App:
    """An application, as Debian packages: every group must have one of its packages installed."""

    name: str
    packages: tuple[tuple[str, ...], ...]
    note: str = ""


APPS: dict[str, App] = {a.name: a for a in (
    App("chrome", (("chromium", "google-chrome-stable"),), "Chromium, started as google-chrome"),
    App("socat", (("socat",),), "forwards Chrome's DevTools port to 9222"),
    App("gimp", (("gimp",),)),
    App("vlc", (("vlc",),)),
    App("thunderbird", (("thunderbird",),)),
    App("libreoffice_writer", (("libreoffice-writer",),)),
    App("libreoffice_calc", (("libreoffice-calc",),)),
    App("libreoffice_impress", (("libreoffice-impress",),)),
    App("nautilus", (("nautilus",),)),
    App("terminal", (("gnome-terminal", "xfce4-terminal", "xterm"),), "opened by ctrl+alt+t"),
    App("pulseaudio", (("pulseaudio",), ("pulseaudio-utils",)), "pulseaudio and pactl"),
    App("gsettings", (("libglib2.0-bin",), ("dconf-gsettings-backend",)), "gsettings with a dconf backend"),
    App("gnome_desktop_schemas", (("gsettings-desktop-schemas",),), "org.gnome.desktop.*"),
    App("gnome_shell_schemas", (("gnome-shell-common",),), "org.gnome.shell"),
    App("gnome_settings_daemon_schemas", (("gnome-settings-daemon-common",),), "org.gnome.settings-daemon.*"),
    App("timedatectl", (("systemd",),)),
    App("xdg_utils", (("xdg-utils",),), "xdg-mime, xdg-open"),
    App("jq", (("jq",),)),
    App("bc", (("bc",),)),
    App("accessibility", (("at-spi2-core",), ("python3-pyatspi",)), "the AT-SPI tree (pyatspi)"),
    App("vscode", (("code",),), "VS Code is not packaged for Debian"),
)}

#: Program names (first word of a command) -> application.
_PROGRAMS = {
    "google-chrome": "chrome", "google-chrome-stable": "chrome", "chromium": "chrome", "chrome": "chrome",
    "socat": "socat", "gimp": "gimp", "vlc": "vlc", "cvlc": "vlc", "thunderbird": "thunderbird",
    "nautilus": "nautilus", "code": "vscode", "gnome-terminal": "terminal", "pactl": "pulseaudio",
    "pulseaudio": "pulseaudio", "gsettings": "gsettings", "dconf": "gsettings", "timedatectl": "timedatectl",
    "xdg-mime": "xdg_utils", "xdg-open": "xdg_utils", "jq": "jq", "bc": "bc",
}
_LIBREOFFICE = {"--writer": "libreoffice_writer", "--calc": "libreoffice_calc", "--impress": "libreoffice_impress"}
_SCHEMAS = (("org.gnome.desktop.", "gnome_desktop_schemas"), ("org.gnome.shell", "gnome_shell_schemas"),
            ("org.gnome.settings-daemon.", "gnome_settings_daemon_schemas"))
_DOC_EXT = {
    "libreoffice_writer": (".doc", ".docx", ".odt", ".rtf"),
    "libreoffice_calc": (".xls", ".xlsx", ".ods", ".csv"),
    "libreoffice_impress": (".ppt", ".pptx", ".odp"),
}
_RELATED = {
    "chrome": "chrome", "browser": "chrome", "gimp": "gimp", "vlc": "vlc", "ubuntu_media_player": "vlc",
    "thunderbird": "thunderbird", "vscode": "vscode", "vs_code": "vscode", "terminal": "terminal",
    "libreoffice_calc": "libreoffice_calc", "libreoffice calc": "libreoffice_calc", "calc": "libreoffice_calc",
    "libreoffice_writer": "libreoffice_writer", "writer": "libreoffice_writer",
    "libreoffice_impress": "libreoffice_impress", "libreoffice": "libreoffice_writer",
}
#: Getter type -> applications it reads from.
_GETTERS = {
    "chrome": ("bookmarks", "chrome_font_size", "chrome_language", "cookie_data", "data_delete_automacally",
               "default_search_engine", "enable_do_not_track", "enable_enhanced_safety_browsing",
               "enable_safe_browsing", "enabled_experiments", "find_installed_extension_name",
               "find_unpacked_extension_path", "history", "new_startup_page", "profile_name",
               "open_tabs_info", "active_tab_info", "active_tab_html_parse", "active_tab_url_parse",
               "active_url_from_accessTree", "shortcuts_on_desktop", "number_of_search_results",
               "url_dashPart", "url_path_parse", "macys_product_url_parse", "page_info", "pdf_from_url",
               "info_from_website", "gotoRecreationPage_and_get_html_content", "chrome_appearance_mode_ui"),
    "socat": ("open_tabs_info", "active_tab_info", "active_tab_html_parse", "active_tab_url_parse",
              "url_dashPart", "url_path_parse", "macys_product_url_parse", "page_info", "pdf_from_url",
              "number_of_search_results", "info_from_website", "gotoRecreationPage_and_get_html_content"),
    "vlc": ("vlc_config", "vlc_playing_info", "default_video_player"),
    "xdg_utils": ("default_video_player",),
    "gimp": ("gimp_config_file",),
    "vscode": ("vscode_config",),
    "accessibility": ("accessibility_tree", "active_url_from_accessTree", "vm_terminal_output"),
    "terminal": ("vm_terminal_output",),
}
_TERMINAL_KEYS = re.compile(r"""hotkey\(\s*\[?\s*['"]ctrl['"]\s*,\s*['"]alt['"]\s*,\s*['"]t['"]""")


def _words(text: str) -> list[str]:
    try:
        return shlex.split(text, comments=False)
    except ValueError:
        return text.split()


def _command_apps(command: Any) -> set[str]:
    """Applications a command line starts (every simple command of a shell string is looked at)."""
    text = " ".join(str(x) for x in command) if isinstance(command, list) else str(command)
    found: set[str] = set()
    for part in re.split(r"[;&|\n()]+|\$\(", text):
        words = [w for w in _words(part) if w]
        while words and (re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0])
                         or words[0] in ("sudo", "-S", "exec", "nohup", "env")):
            words = words[1:]
        if not words:
            continue
        prog = words[0].rsplit("/", 1)[-1]
        if prog in ("libreoffice", "soffice"):
            flags = [_LIBREOFFICE[w] for w in words[1:] if w in _LIBREOFFICE]
            found.update(flags or ["libreoffice_writer"])
        elif prog in _PROGRAMS:
            found.add(_PROGRAMS[prog])
        for w in words[1:]:  # a program given to a helper (timeout 10 gsettings ..., pkill vlc is not a start)
            if prog in ("timeout", "xargs", "bash", "sh") and w.rsplit("/", 1)[-1] in _PROGRAMS:
                found.add(_PROGRAMS[w.rsplit("/", 1)[-1]])
                break
    if "gsettings" in text or "gsettings" in found:
        found.add("gsettings")
        for prefix, app in _SCHEMAS:
            if prefix in text:
                found.add(app)
    if _TERMINAL_KEYS.search(text):
        found.add("terminal")
    if re.search(r"\btimedatectl\b", text):
        found.add("timedatectl")
    if re.search(r"\bpactl\b", text):
        found.add("pulseaudio")
    return found


def task_apps(task: Mapping[str, Any]) -> dict[str, list[str]]:
    """``{"setup": [...], "evaluator": [...], "related_apps": [...], "all": [...]}``, each sorted."""
    setup: set[str] = set()
    evaluator: set[str] = set()
    for phase, _, step in steps(task):
        stype = step.get("type")
        params = step.get("parameters") or {}
        target = setup if phase == "setup" else evaluator
        if stype in ("launch", "execute", "command", "execute_with_verification"):
            cmd = params.get("command", "")
            words = cmd if isinstance(cmd, list) else _words(str(cmd))
            if words and str(words[0]).rsplit("/", 1)[-1] in ("pkill", "killall"):
                continue  # stopping a program needs none
            target |= _command_apps(cmd)
        elif stype == "open":
            path = str(params.get("path", "")).lower()
            target |= {app for app, exts in _DOC_EXT.items() if path.endswith(exts)}
        elif stype in ("chrome_open_tabs", "chrome_close_tabs"):
            target |= {"chrome", "socat"}
    for cfg in getter_configs(task):
        gtype = str(cfg["type"])
        evaluator |= {app for app, getters in _GETTERS.items() if gtype in getters}
        if gtype in ("vm_command_line", "vm_command_error"):
            evaluator |= _command_apps(cfg.get("command", ""))
    related = {_RELATED[str(a).strip().lower()] for a in task.get("related_apps") or []
               if str(a).strip().lower() in _RELATED}
    return {"setup": sorted(setup), "evaluator": sorted(evaluator), "related_apps": sorted(related),
            "all": sorted(setup | evaluator | related)}


def image_packages(image: str, store: str | Path | None = None) -> dict[str, str]:
    """``{package: version}`` from an image's manifest (raises FileNotFoundError naming the path)."""
    import os

    base = Path(store or os.environ.get("DRUMS_IMAGE_STORE", "/var/lib/drums/images"))
    path = base / image / "manifest.json"
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"no image {image!r}: {path} does not exist (drums image ls)") from None
    pkgs = manifest.get("packages") or {}
    if isinstance(pkgs, list):
        pkgs = {str(p): "" for p in pkgs}
    return {str(k): str(v) for k, v in pkgs.items()}


def missing_apps(apps: Iterable[str], packages: Mapping[str, str]) -> dict[str, str]:
    """``{app: why}`` for each application the packages do not provide."""
    out = {}
    for name in apps:
        app = APPS.get(name)
        if app is None:
            continue
        lacking = [g for g in app.packages if not any(p in packages for p in g)]
        if lacking:
            note = f" ({app.note})" if app.note else ""
            out[name] = "needs " + " and ".join(" or ".join(g) for g in lacking) + note
    return out
