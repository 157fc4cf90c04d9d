"""The guest server's routes, one Flask blueprint an area; :func:`register` adds them all to an app.

- :mod:`.execute` - commands and scripts;
- :mod:`.files` - downloads, uploads, directory listings;
- :mod:`.screen` - screenshots, the screen size, the pointer;
- :mod:`.accessibility` - the accessibility tree and the terminal's text;
- :mod:`.desktop` - windows, opening files and apps, the wallpaper;
- :mod:`.system` - the platform, screen recording, Drums' reseed and health.

Every handler reaches the server's shared state through :func:`drums_osworld.guest.state.current`.
The ``/drums/setup_log`` routes are :mod:`drums_osworld.guest.setup_log`'s.
"""
from __future__ import annotations

from flask import Flask

from . import accessibility, desktop, execute, files, screen, system

# Endpoint -> (methods, who calls it in OSWorld 1.0.2). Kept next to the code for reviewers.
ENDPOINTS = {
    "/screenshot": ("GET", "PythonController.get_screenshot (every observation)"),
    "/accessibility": ("GET", "PythonController.get_accessibility_tree"),
    "/terminal": ("GET", "PythonController.get_terminal_output; SetupController.setup probe"),
    "/execute": ("POST", "execute_python_command (every action); getters vm_command_line/error"),
    "/setup/execute": ("POST", "setup/postconfig `execute` and `command` steps"),
    "/setup/execute_with_verification": ("POST", "setup `execute_with_verification`"),
    "/setup/launch": ("POST", "setup `launch`"),
    "/setup/upload": ("POST", "setup `download`, `upload_file`, `update_browse_history`"),
    "/setup/open_file": ("POST", "setup `open`"),
    "/setup/activate_window": ("POST", "setup `activate_window`"),
    "/setup/close_window": ("POST", "setup `close_window`"),
    "/setup/change_wallpaper": ("POST", "setup `change_wallpaper`"),
    "/file": ("POST", "PythonController.get_file (getter vm_file and friends)"),
    "/screen_size": ("POST", "getter vm_screen_size"),
    "/window_size": ("POST", "getter vm_window_size"),
    "/wallpaper": ("POST", "getter vm_wallpaper"),
    "/desktop_path": ("POST", "Chrome getter get_shortcuts_on_desktop"),
    "/list_directory": ("POST", "getter list_directory"),
    "/platform": ("GET", "-"),
    "/cursor_position": ("GET", "-"),
    "/start_recording": ("POST", "lib_run_single (every episode)"),
    "/end_recording": ("POST", "lib_run_single (every episode)"),
    "/run_python": ("POST", "PythonController.run_python_script"),
    "/run_bash_script": ("POST", "PythonController.run_bash_script"),
    "/drums/reseed": ("POST", "Drums engine after restore"),
    "/drums/health": ("GET", "Drums engine and tests"),
    "/drums/setup_log": ("GET", "Drums provider, gym env, rollouts: how the last setup went (guest/setup_log.py)"),
}

BLUEPRINTS = (execute.bp, files.bp, screen.bp, desktop.bp, accessibility.bp, system.bp)


def register(app: Flask) -> None:
    """Add every route of the guest server's API to ``app``."""
    for bp in BLUEPRINTS:
        app.register_blueprint(bp)
