"""The ``osworld`` desktop image: what OSWorld's Ubuntu VM offers its tasks, from Debian 12.

Built on the engine's ``default`` image (X, openbox, D-Bus, LibreOffice Writer/Calc/Impress, the
guest's Python) with the applications OSWorld's tasks use: Chromium (as ``google-chrome``, its
profile in ``~/.config/google-chrome``, without its own sandbox: the session is the sandbox), GIMP,
VLC (web interface on 8080, password ``password``), Thunderbird, nautilus, socat, PulseAudio, a
terminal on ctrl+alt+t, the GNOME settings schemas with dconf, the AT-SPI stack with ``pyatspi``,
systemd's ``timedatectl`` answered by a D-Bus-activated ``systemd-timedated``, fonts metric-
compatible with the Office ones, and the GTK3 LibreOffice front end (its accessibility tree).
VS Code is not packaged for Debian: tasks that need it are reported apart. GNOME Shell as OSWorld's
Ubuntu shows it (top bar, dash-to-dock, Settings, Yaru; :mod:`.gnome`, one definition shared with the
images that try it), which a session shows when its spec asks for the ``gnome`` desktop.

``drums image build osworld`` builds it (the engine finds this spec through the
``drums.image_specs`` entry point); the provider, the gym env and ``drums up`` default to it.
"""
from __future__ import annotations

from pathlib import Path

from drums_core.host.images import FileSpec, ImageSpec

from . import gnome

NAME = "osworld"
BASE = "default"
FILES = Path(__file__).resolve().parent / "files"
TIMEZONE = "Asia/Hong_Kong"
USER_HOME = "/home/user"

PACKAGES = (
    "chromium", "gimp", "vlc", "thunderbird", "nautilus", "socat", "gnome-terminal",
    "pulseaudio", "pulseaudio-utils",
    "python3-pyatspi", "gir1.2-atspi-2.0", "at-spi2-core", "libatk-adaptor", "libgail-common", "libreoffice-gtk3",
    "gsettings-desktop-schemas", "gnome-shell-common", "dconf-cli", "dconf-gsettings-backend", "dconf-service",
    "libglib2.0-bin", "systemd", "tzdata", "dbus",
    "fonts-liberation2", "fonts-crosextra-carlito", "fonts-crosextra-caladea", "fonts-noto-core",
    "fonts-dejavu", "unzip", "zip", "curl", "bc", "gnome-settings-daemon-common", "totem",
    "librsvg2-common",
) + gnome.PACKAGES

# The video types OSWorld's default_video_player getter asks xdg-mime about: on OSWorld's Ubuntu
# they open in Videos (totem), so a task that makes VLC the default starts from there.
VIDEO_TYPES = ("3gpp", "3gpp2", "avi", "divx", "dv", "fli", "flv", "mp2t", "mp4", "mp4v-es", "mpeg",
               "mpeg-system", "msvideo", "ogg", "quicktime", "vnd.divx", "vnd.mpegurl", "vnd.rn-realvideo",
               "webm", "x-anim", "x-avi", "x-flc", "x-fli", "x-flv", "x-m4v", "x-matroska", "x-mpeg",
               "x-mpeg-system", "x-mpeg2", "x-ms-asf", "x-ms-wm", "x-ms-wmv", "x-ms-wmx", "x-ms-wvx",
               "x-msvideo", "x-nsv", "x-ogm", "x-ogm+ogg", "x-theora", "x-theora+ogg")
_AS_USER = f"runuser -u user -- env HOME={USER_HOME} LANG=en_US.UTF-8 timeout 180"

# Run in the image as root, in order, after the packages are in.
COMMANDS = (
    # google-chrome and google-chrome-stable are the wrapper (Debian's chromium under Chrome's names)
    "ln -sf /usr/local/bin/google-chrome /usr/local/bin/google-chrome-stable",
    "sed 's/^Exec=chromium/Exec=google-chrome/; s/^Name=Chromium/Name=Google Chrome/' "
    "/usr/share/applications/chromium.desktop >/usr/share/applications/google-chrome.desktop",
    # timedatectl: the system bus activates timedated itself (no systemd as pid 1 in a session)
    "install -m 0644 /usr/local/share/drums/timedated.service "
    "/usr/share/dbus-1/system-services/org.freedesktop.timedate1.service",
    f"ln -sf /usr/share/zoneinfo/{TIMEZONE} /etc/localtime && echo {TIMEZONE} >/etc/timezone",
    # GNOME settings: a system dconf database under the user's own, with OSWorld's defaults
    "mkdir -p /etc/dconf/profile /etc/dconf/db/local.d && printf 'user-db:user\\nsystem-db:local\\n' "
    ">/etc/dconf/profile/user && install -m 0644 /usr/local/share/drums/dconf-defaults "
    "/etc/dconf/db/local.d/00-drums && dconf update",
    # ctrl+alt+t opens a terminal, as on OSWorld's Ubuntu
    "python3 -c \"import re,pathlib; p=pathlib.Path('/etc/xdg/openbox/rc.xml'); s=p.read_text(); "
    "k='<keybind key=\\\"C-A-t\\\"><action name=\\\"Execute\\\">"
    "<command>x-terminal-emulator</command></action></keybind>'; "
    "p.write_text(s if 'C-A-t' in s else s.replace('<keyboard>', '<keyboard>'+k, 1))\"",
    "update-alternatives --set x-terminal-emulator /usr/bin/gnome-terminal.wrapper",
    # the user's own settings: VLC's web interface, Chrome's profile folder, no keyring prompt
    f"mkdir -p {USER_HOME}/.config/vlc {USER_HOME}/.config/google-chrome {USER_HOME}/.local/share/keyrings "
    f"&& install -m 0644 /usr/local/share/drums/vlcrc {USER_HOME}/.config/vlc/vlcrc "
    f"&& touch {USER_HOME}/.local/share/keyrings/login.keyring "
    f"&& chown -R 1000:1000 {USER_HOME}/.config {USER_HOME}/.local",
    # what a desktop that has been used once has (OSWorld's getters read these right after a reset):
    # Chrome's profile with its Preferences and an empty Bookmarks file, GIMP's gimprc and its sessionrc
    # (Debian's default layout, as GIMP writes it back on quitting), LibreOffice's
    # user profile (registrymodifications.xcu)
    f"{_AS_USER} google-chrome --headless=new --dump-dom about:blank >/dev/null 2>&1 || true; "
    f"test -f {USER_HOME}/.config/google-chrome/Default/Preferences",
    f"install -o 1000 -g 1000 -m 0644 /usr/local/share/drums/chrome-bookmarks "
    f"{USER_HOME}/.config/google-chrome/Default/Bookmarks",
    # Chromium 156 writes content-setting defaults on its first run, which older Chrome (OSWorld's
    # VM) leaves out until a setting changes; a getter takes their presence for a changed setting.
    # The headless run also saved its 780x580 window placement, which the first windowed start would
    # reuse (settings pages then take their narrow layout): a desktop's Chrome sizes its own window
    "python3 -c \"import json; p='" + USER_HOME + "/.config/google-chrome/Default/Preferences'; "
    "d=json.load(open(p)); d.get('profile', {}).pop('default_content_setting_values', None); "
    "d.get('browser', {}).pop('window_placement', None); "
    "json.dump(d, open(p, 'w'))\"",
    f"{_AS_USER} gimp -i -b '(gimp-quit 0)' >/dev/null 2>&1 || true; mkdir -p {USER_HOME}/.config/GIMP/2.10 && "
    f"{{ test -f {USER_HOME}/.config/GIMP/2.10/gimprc || printf '# GIMP gimprc\\n' "
    f">{USER_HOME}/.config/GIMP/2.10/gimprc; }} && install -m 0644 /etc/gimp/2.0/sessionrc "
    f"{USER_HOME}/.config/GIMP/2.10/sessionrc",
    # LibreOffice as after its first start: no start centre template picker, tip or first-run bar
    # (an Impress task's setup walks the menus with fixed pauses and expects none of them)
    f"mkdir -p {USER_HOME}/.config/libreoffice/4/user && install -m 0600 "
    f"/usr/local/share/drums/registrymodifications.xcu {USER_HOME}/.config/libreoffice/4/user/",
    f"{_AS_USER} soffice --headless --terminate_after_init >/dev/null 2>&1 || true; "
    f"grep -q ShowTipOfTheDay {USER_HOME}/.config/libreoffice/4/user/registrymodifications.xcu",
    f"chown -R 1000:1000 {USER_HOME}",
    # PulseAudio starts at 40% volume, not 100% (OSWorld's "turn it up to the max" task starts low)
    "install -m 0644 /usr/local/share/drums/pulse-volume.pa /etc/pulse/default.pa.d/drums-volume.pa",
    "printf '[Default Applications]\\n' >/etc/xdg/mimeapps.list && for t in "
    + " ".join(VIDEO_TYPES) + "; do echo \"video/$t=org.gnome.Totem.desktop\" >>/etc/xdg/mimeapps.list; done",
    *gnome.COMMANDS,
    "rm -rf /usr/local/share/drums",
)


def osworld_spec() -> ImageSpec:
    """The spec of the ``osworld`` image (see the module's docstring)."""
    files = (
        FileSpec(str(FILES / "google-chrome"), "/usr/local/bin/google-chrome", 0o755),
        FileSpec(str(FILES / "vlcrc"), "/usr/local/share/drums/vlcrc", 0o644),
        FileSpec(str(FILES / "dconf-defaults"), "/usr/local/share/drums/dconf-defaults", 0o644),
        FileSpec(str(FILES / "timedated.service"), "/usr/local/share/drums/timedated.service", 0o644),
        FileSpec(str(FILES / "chrome-bookmarks"), "/usr/local/share/drums/chrome-bookmarks", 0o644),
        FileSpec(str(FILES / "pulse-volume.pa"), "/usr/local/share/drums/pulse-volume.pa", 0o644),
        FileSpec(str(FILES / "registrymodifications.xcu"), "/usr/local/share/drums/registrymodifications.xcu",
                 0o644),
        *gnome.files(),
    )
    return ImageSpec(name=NAME, base=BASE, packages=PACKAGES, files=files, commands=COMMANDS)


# PulseAudio as OSWorld's VM runs it, on a null sink (a session has no sound card): ``pactl`` and
# the VLC tasks' audio work; no realtime priority (no rtkit in a session), never exits when idle.
PULSEAUDIO = ["pulseaudio", "--daemonize=no", "--exit-idle-time=-1", "--realtime=no", "--high-priority=no",
              "--log-target=stderr"]


# Thunderbird's child processes would each enter user, ipc and net namespaces of their own (its
# sandbox), which CRIU cannot dump ("Can't dump nested ipc namespace"): as with Chromium, the
# session is the sandbox.
MOZILLA_NO_SANDBOX = {f"MOZ_DISABLE_{part}_SANDBOX": "1"
                      for part in ("CONTENT", "GMP", "RDD", "SOCKET_PROCESS", "UTILITY", "GPU")}


def desktop_extras() -> dict:
    """What a desktop of this image adds to the session spec: the system bus (timedatectl), the
    AT-SPI bus with toolkits exporting to it (LibreOffice through its GTK3 front end), PulseAudio."""
    return {"system_bus": True, "accessibility": True,
            "env": {"LANG": "en_US.UTF-8", "SAL_USE_VCLPLUGIN": "gtk3", "XDG_CURRENT_DESKTOP": "GNOME",
                    "XDG_SESSION_TYPE": "x11",
                    "GTK_MODULES": "gail:atk-bridge", "ACCESSIBILITY_ENABLED": "1",
                    "QT_LINUX_ACCESSIBILITY_ALWAYS_ON": "1", **MOZILLA_NO_SANDBOX},
            "programs": [{"name": "pulseaudio", "argv": PULSEAUDIO}]}
