"""Why an OSWorld task cannot run on a machine without the internet (or on desktop-env 1.0.2).

Each rule looks at one part of a task (setup and postconfig steps, evaluator getters, metrics,
the instruction) and returns :class:`Exclusion` records, each with a stable ``code`` and a sentence
naming what it found. A task with no exclusion is *offline*: it needs nothing from outside this
machine to be set up, solved or scored.

Codes:

``DOWNLOAD``          a setup step downloads a file (``download``) or syncs with a cloud service
                      (``googledrive``, ``login``, ``update_browse_history``)
``CLOUD_GETTER``      the evaluator reads from the web (``cloud_file``, ``googledrive_file``, ...)
``LIVE_SITE``         a step or the instruction opens a site of the internet (``chrome_open_tabs``,
                      a launch with a URL, a URL the agent must visit or stream)
``PACKAGE_INSTALL``   setup or the solution installs software (``apt``, ``pip``, ``conda``, an
                      extension or theme store)
``WEB_FETCH``         a setup command fetches from the web (``wget``, ``curl``, ``git clone``)
``NEWER_DESKTOP_ENV`` a getter, metric or step type that desktop-env 1.0.2 does not have
``KNOWN``             found by reading the task, where no rule above sees it (the reason says why)

Rules on the instruction (what the *solution* needs) skip infeasible tasks: their solution is
``FAIL``, which needs nothing.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from ..tasks import OSWORLD_GETTERS, OSWORLD_METRICS, OSWORLD_STEP_TYPES

__all__ = ["CODES", "Exclusion", "exclusions", "evaluator_funcs", "getter_configs", "steps"]

CODES = ("DOWNLOAD", "CLOUD_GETTER", "LIVE_SITE", "PACKAGE_INSTALL", "WEB_FETCH", "NEWER_DESKTOP_ENV", "KNOWN")

#: Setup step types that reach a service of the internet whatever their parameters.
NET_STEPS = {
    "download": "downloads {what}",
    "googledrive": "syncs files with Google Drive",
    "login": "logs into a web site",
    "update_browse_history": "downloads a browser history database from the web",
}

#: Getters that read from the web (on the host or through the guest's browser).
NET_GETTERS = {
    "cloud_file": "downloads its file from {what}",
    "googledrive_file": "reads a file from Google Drive",
    "info_from_website": "reads a live web page",
    "page_info": "loads a live web page",
    "pdf_from_url": "prints a live web page to PDF",
    "gotoRecreationPage_and_get_html_content": "browses recreation.gov",
    "rule_relativeTime": "asks a web service (ipapi) for the time zone",
}

#: Tasks no rule catches, read one by one (id prefix -> reason).
KNOWN = {
    "2373b66a": "the solution runs `sar` from sysstat, which is not installed: it must be installed "
                "with apt (OSWorld's VM has no sysstat either)",
}

_URL = re.compile(r"\bhttps?://[^\s\"'<>)]+", re.IGNORECASE)
_LOCAL_HOSTS = ("localhost", "127.0.0.1", "[::1]")
_INSTALL = re.compile(
    r"\b(?:apt(?:-get)?\s+(?:-\S+\s+)*(?:install|update|upgrade)|pip3?\s+install|python3?\s+-m\s+pip\s+install"
    r"|conda\s+(?:install|create)|snap\s+install|flatpak\s+install|npm\s+install"
    r"|code\s+--install-extension)\b", re.IGNORECASE)
_FETCH = re.compile(r"(?:^|[\s;&|(])(?:wget|curl|git\s+clone)\s", re.IGNORECASE)
_INSTRUCTION_INSTALL = re.compile(r"\binstall(?:ing|ed)?\b", re.IGNORECASE)


@dataclass(frozen=True)
class Exclusion:
    """One reason a task is not run here."""

    code: str
    reason: str

    def to_json(self) -> dict[str, str]:
        return asdict(self)


# ------------------------------------------------------------------------------------ task parts
def steps(task: Mapping[str, Any]) -> list[tuple[str, int, dict[str, Any]]]:
    """``(phase, index, step)`` for every ``config`` (phase ``setup``) and ``postconfig`` step."""
    out = [("setup", i, s) for i, s in enumerate(task.get("config") or []) if isinstance(s, Mapping)]
    post = (task.get("evaluator") or {}).get("postconfig") or []
    out += [("postconfig", i, s) for i, s in enumerate(post) if isinstance(s, Mapping)]
    return out


def getter_configs(task: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every ``result``/``expected`` getter config of the evaluator."""
    ev = task.get("evaluator") or {}
    out: list[dict[str, Any]] = []
    for key in ("result", "expected"):
        v = ev.get(key)
        for cfg in (v if isinstance(v, list) else [v]):
            if isinstance(cfg, Mapping) and cfg.get("type"):
                out.append(dict(cfg))
    return out


def evaluator_funcs(task: Mapping[str, Any]) -> list[str]:
    f = (task.get("evaluator") or {}).get("func")
    return [str(x) for x in (f if isinstance(f, list) else [f]) if x]


def is_infeasible(task: Mapping[str, Any]) -> bool:
    return evaluator_funcs(task) == ["infeasible"]


def command_text(params: Mapping[str, Any]) -> str:
    c = params.get("command", "")
    return " ".join(str(x) for x in c) if isinstance(c, list) else str(c)


def _remote_urls(text: str) -> list[str]:
    out = []
    for url in _URL.findall(text):
        host = re.sub(r"^https?://", "", url, flags=re.IGNORECASE).split("/", 1)[0].split(":", 1)[0].lower()
        if host not in _LOCAL_HOSTS:
            out.append(url)
    return out


def _where(phase: str, index: int, stype: str) -> str:
    return f"{phase} step {index + 1} ({stype})"


def _short(text: str, n: int = 90) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 3] + "..."


# ------------------------------------------------------------------------------------ the rules
def _step_rules(task: Mapping[str, Any]) -> Iterable[Exclusion]:
    for phase, i, step in steps(task):
        stype = str(step.get("type"))
        params = step.get("parameters") or {}
        where = _where(phase, i, stype)
        if stype not in OSWORLD_STEP_TYPES:
            yield Exclusion("NEWER_DESKTOP_ENV", f"{where}: desktop-env 1.0.2 has no setup step {stype!r}")
            continue
        if stype in NET_STEPS:
            what = "a file"
            if stype == "download":
                urls = [f.get("url", "") for f in params.get("files") or [] if isinstance(f, Mapping)]
                more = f" and {len(urls) - 2} more" if len(urls) > 2 else ""
                what = ", ".join(_short(u, 70) for u in urls[:2]) + more
            yield Exclusion("DOWNLOAD", f"{where} {NET_STEPS[stype].format(what=what)}")
        elif stype in ("chrome_open_tabs", "chrome_close_tabs"):
            urls = params.get("urls_to_open") or params.get("urls_to_close") or []
            remote = [u for u in urls if _remote_urls(str(u)) or not str(u).startswith(("chrome:", "about:", "file:"))]
            if remote:
                yield Exclusion("LIVE_SITE", f"{where} opens {_short(remote[0], 70)}"
                                             + (f" and {len(remote) - 1} more" if len(remote) > 1 else ""))
        elif stype in ("launch", "execute", "command", "execute_with_verification", "open"):
            text = str(params.get("path", "")) if stype == "open" else command_text(params)
            m = _INSTALL.search(text)
            if m:
                yield Exclusion("PACKAGE_INSTALL", f"{where} installs software: {_short(m.group(0))}")
            elif _FETCH.search(text):
                yield Exclusion("WEB_FETCH", f"{where} fetches from the web: {_short(text)}")
            elif _remote_urls(text):
                code = "LIVE_SITE" if stype in ("launch", "open") else "WEB_FETCH"
                yield Exclusion(code, f"{where} reaches {_short(_remote_urls(text)[0], 70)}")


def _evaluator_rules(task: Mapping[str, Any]) -> Iterable[Exclusion]:
    for f in evaluator_funcs(task):
        if f not in OSWORLD_METRICS:
            yield Exclusion("NEWER_DESKTOP_ENV", f"metric {f!r} is not in desktop-env 1.0.2")
    for cfg in getter_configs(task):
        gtype = str(cfg["type"])
        if gtype not in OSWORLD_GETTERS:
            yield Exclusion("NEWER_DESKTOP_ENV", f"getter {gtype!r} is not in desktop-env 1.0.2")
        elif gtype in NET_GETTERS:
            what = _short(str(cfg.get("path", "the web")), 70)
            yield Exclusion("CLOUD_GETTER", f"getter {gtype} {NET_GETTERS[gtype].format(what=what)}")
        elif gtype in ("vm_command_line", "vm_command_error"):
            text = command_text(cfg)
            if _INSTALL.search(text) or _FETCH.search(text) or _remote_urls(text):
                yield Exclusion("WEB_FETCH", f"getter {gtype} runs {_short(text)}")


def _instruction_rules(task: Mapping[str, Any]) -> Iterable[Exclusion]:
    if is_infeasible(task):
        return
    text = str(task.get("instruction", ""))
    urls = _remote_urls(text)
    if urls:
        yield Exclusion("LIVE_SITE", f"the instruction sends the agent to {_short(urls[0], 70)}")
    elif _INSTRUCTION_INSTALL.search(text):
        yield Exclusion("PACKAGE_INSTALL", f"the solution installs software: \"{_short(text, 100)}\"")


def _known(task: Mapping[str, Any]) -> Iterable[Exclusion]:
    tid = str(task.get("id", ""))
    for prefix, reason in KNOWN.items():
        if tid.startswith(prefix):
            yield Exclusion("KNOWN", reason)


def exclusions(task: Mapping[str, Any]) -> list[Exclusion]:
    """Every reason ``task`` cannot run offline on desktop-env 1.0.2 (empty: it can), deduplicated."""
    seen: set[tuple[str, str]] = set()
    out = []
    for rule in (_step_rules, _evaluator_rules, _instruction_rules, _known):
        for ex in rule(task):
            if (ex.code, ex.reason) not in seen:
                seen.add((ex.code, ex.reason))
                out.append(ex)
    return out


def fingerprint(task: Mapping[str, Any]) -> str:
    """A short hash of a task's content (the list records it, so a changed task file is noticed)."""
    import hashlib

    return hashlib.sha256(json.dumps(task, sort_keys=True).encode()).hexdigest()[:16]
