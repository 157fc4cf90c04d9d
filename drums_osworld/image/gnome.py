"""GNOME Shell in the ``osworld`` image: one definition, used by the image's spec and by any image
made from it to try the same additions (:func:`additions_spec`).

What OSWorld's Ubuntu VM shows (issue 30): GNOME Shell 43 on X11 (software rendering in the
session's Xvfb), its settings daemons, Settings (``gnome-control-center``), dash-to-dock on the left
with the favourites, Yaru's theme and icons, a wallpaper. The session's init starts it through
``gnome-session --builtin --session=drums`` (:data:`SESSION_NAME`, the file ``gnome-drums.session``:
Debian's ``gnome.session`` without the power and USB-protection daemons, which cannot run in a
session). Autostart entries the session does not want are hidden (:data:`HIDDEN_AUTOSTART`).
"""
from __future__ import annotations

from pathlib import Path

from drums_core.host.images import FileSpec, ImageSpec

FILES = Path(__file__).resolve().parent / "files"
STAGING = "/usr/local/share/drums"  # where a build's files wait for its commands (removed by the last one)
SESSION_NAME = "drums"  # /usr/share/gnome-session/sessions/<name>.session
# The share of the screen that differs from its top-left pixel (the top bar's black) once the shell
# has painted: the wallpaper covers ~95%; before, the screen is uniform black (for seconds on a
# busy host: mutter advertises itself well before the shell's first frame).
READY_NONBLANK = 0.5

# Installed with --no-install-recommends, like every package of an image (158 packages, ~545 MiB
# over the osworld image, as the feasibility probe measured). vim: OSWorld's task ec4e3f68 pins
# vim.desktop to the dock, which shows only applications that are installed.
PACKAGES = (
    "gnome-shell", "gnome-session-bin", "gnome-control-center", "gnome-shell-extension-dashtodock",
    "gnome-settings-daemon", "mutter", "yaru-theme-gtk", "yaru-theme-icon", "gnome-backgrounds", "vim",
)

# /etc/xdg/autostart entries gnome-session would start that this desktop does not run:
# - gsd-power needs org.freedesktop.login1 and exits at start; gsd-usb-protection crashes without a
#   screen saver and "respawns too quickly" (together they bring up gnome-session's "Oh no" window);
# - tracker-miner-fs-3 indexes the home folder: memory and inotify instances (the host's per-user
#   128 are shared by every session), nothing an OSWorld task reads; Files still starts it on demand;
# - the AT-SPI bus and PulseAudio: the session's init and its programs start them already.
HIDDEN_AUTOSTART = (
    "org.gnome.SettingsDaemon.Power", "org.gnome.SettingsDaemon.UsbProtection", "tracker-miner-fs-3",
    "at-spi-dbus-bus", "pulseaudio",
)

COMMANDS = (
    f"install -D -m 0644 {STAGING}/gnome-drums.session /usr/share/gnome-session/sessions/{SESSION_NAME}.session",
    # over the osworld defaults (00-drums): the extension, the dock, the theme, the wallpaper
    f"mkdir -p /etc/dconf/db/local.d && install -m 0644 {STAGING}/dconf-gnome /etc/dconf/db/local.d/01-gnome "
    "&& dconf update && test -f /usr/share/backgrounds/gnome/adwaita-l.webp",
    # Hidden=true in the [Desktop Entry] group (a missing file fails the build: the list is checked)
    "for name in " + " ".join(HIDDEN_AUTOSTART) + "; do "
    "sed -i '/^\\[Desktop Entry\\]/a Hidden=true' /etc/xdg/autostart/$name.desktop || exit 1; done",
    "test -f /usr/share/applications/vim.desktop && test -d "
    "/usr/share/gnome-shell/extensions/dash-to-dock@micxgx.gmail.com",
)


def files() -> tuple[FileSpec, ...]:
    """The host files the :data:`COMMANDS` install (staged under :data:`STAGING`)."""
    return (
        FileSpec(str(FILES / "gnome-drums.session"), f"{STAGING}/gnome-drums.session", 0o644),
        FileSpec(str(FILES / "dconf-gnome"), f"{STAGING}/dconf-gnome", 0o644),
    )


def additions_spec(name: str, base: str) -> ImageSpec:
    """An image made of ``base`` (an ``osworld`` image built without GNOME) plus exactly these
    additions: how they are tried without rebuilding ``osworld`` (``drums image build NAME --spec``
    with this spec's JSON)."""
    return ImageSpec(name=name, base=base, packages=PACKAGES, files=files(),
                     commands=(*COMMANDS, f"rm -rf {STAGING}"))


def session_desktop() -> dict:
    """The session spec's ``desktop`` (:class:`drums_core.session.model.SessionSpec`) that starts this
    GNOME: ``gnome-session --builtin`` (no systemd in a session) with the session file above, on
    X11 in the session's Xvfb with GLX (Mesa's llvmpipe: a session has no /dev/dri), in the
    environment a GNOME on Xorg login has; programs start once mutter advertises GNOME Shell, and a
    cold boot is ready once the shell has drawn its wallpaper (:data:`READY_NONBLANK`)."""
    return {"name": "gnome", "argv": ["gnome-session", "--builtin", f"--session={SESSION_NAME}"],
            "env": {"XDG_SESSION_TYPE": "x11", "XDG_CURRENT_DESKTOP": "GNOME", "XDG_SESSION_DESKTOP": "gnome",
                    "DESKTOP_SESSION": "gnome", "GDMSESSION": "gnome"},
            "x_extensions": ["GLX"], "wm_name": "GNOME Shell", "ready_nonblank": READY_NONBLANK}
