"""The layout by layer (README: Layout): the engine (``drums_core``) imports nothing of the layer above
it (``drums_osworld``), checked statically over every module; the folders of each layer exist; the
modules run with ``python -m`` keep their names; the CLI finds what the upper layer adds to it
through the entry-point group ``drums.cli``; the guest's package imports inside a bare Python."""
from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UPPER = "drums_osworld"

CORE_TOP = {"__init__", "client", "cli", "cli_registry", "errors", "reasons", "config", "records", "lazy", "protocol"}
CORE_LAYERS = {
    "daemon": {"server", "recovery", "purge"},
    "session": {"supervisor", "restore_steps", "init", "launch", "enter", "containment", "cgroups", "rootfs",
                "display", "processes", "criu", "faults", "audit", "netns", "netpolicy", "nat", "cgroup_fs",
                "watched_dirs", "kernel_caps",
                "cgroup_kill", "cgroup_session", "cgroup_drivers"},
    "store": {"snapshots", "budget", "transfer"},
    "host": {"doctor", "hoststate", "linux", "procs", "safepath", "hostnet", "images", "image_spec", "image_store",
             "image_hash", "image_recipe", "idshift", "ownedpaths", "mounttable"},
    "sweep": {"ledger", "driver", "run", "step_processes", "step_mounts", "step_links", "step_dirs", "parts", "live",
              "hostops", "report", "cli", "instance"},
}
OSWORLD_TOP = {"__init__", "actions", "progress", "tasks", "desktop", "setup_journal"}
OSWORLD_LAYERS = {
    "gym": {"env"}, "farm": {"pool", "node", "local"}, "guest": {"client", "a11y_guard", "server"},
    "apps": {"demo", "rollouts", "run"}, "provider": {"provider"}, "snapshot": {"branch", "reuse"},
    "catalog": set(), "image": set(), "evaluation": set(), "bench": set(),
}


def _imports_of(path: Path, text: str | None = None) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in a file of the checkout, relative ones resolved,
    plus the string arguments of ``importlib.import_module`` / ``__import__`` calls."""
    package = list(path.relative_to(REPO).parts[:-1])  # a module's package; an __init__'s is its folder
    found = []
    source = path.read_text() if text is None else text
    for node in ast.walk(ast.parse(source, str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            found.append((node.lineno, name))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            f = node.func
            fname = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if fname in ("import_module", "__import__"):
                found.append((node.lineno, node.args[0].value))
    return found


def test_no_module_of_drums_core_imports_drums_osworld():
    files = sorted((REPO / "drums_core").rglob("*.py"))
    assert len(files) > 40, files  # the walk found the engine
    bad = [f"{p.relative_to(REPO)}:{line}: {name}" for p in files for line, name in _imports_of(p)
           if name == UPPER or name.startswith(UPPER + ".")]
    assert not bad, f"the engine imports the layer above it: {bad}"


def test_the_import_check_sees_relative_and_dynamic_imports():
    # the checker itself: an absolute, a dynamic and a relative import climbing out of drums_core
    text = ("import drums_osworld.gym\nimportlib.import_module('drums_osworld.desktop')\n"
            "from ...drums_osworld import tasks\n")
    names = sorted(n for _, n in _imports_of(REPO / "drums_core" / "session" / "probe.py", text))
    assert names == ["drums_osworld", "drums_osworld.desktop", "drums_osworld.gym"], names


def _modules(folder: Path) -> set[str]:
    return {p.stem for p in folder.glob("*.py")}


def _check_layout(package: str, top_level: set[str], layers: dict[str, set[str]]) -> None:
    top = REPO / package
    assert _modules(top) <= top_level, f"modules at {package}'s top level that belong in a layer: " \
                                       f"{sorted(_modules(top) - top_level)}"
    for layer, modules in layers.items():
        assert (top / layer / "__init__.py").is_file(), f"{package}/{layer}/ is not a package"
        lacking = sorted(modules - _modules(top / layer))
        assert not lacking, f"{package}/{layer}/ lacks {lacking}"


def test_drums_core_is_laid_out_by_layer():
    _check_layout("drums_core", CORE_TOP, CORE_LAYERS)


def test_drums_osworld_is_laid_out_by_layer():
    _check_layout("drums_osworld", OSWORLD_TOP, OSWORLD_LAYERS)


@pytest.mark.parametrize("module", ["drums_core.daemon", "drums_core.sweep", "drums_core.session.launch",
                                    "drums_core.session.init", "drums_core.session.enter", "drums_core.host.doctor",
                                    "drums_core.host.images", "drums_osworld.guest", "drums_osworld.apps.demo",
                                    "drums_osworld.apps.run", "drums_osworld.bench"])
def test_modules_run_with_python_m_are_there(module):
    spec = importlib.util.find_spec(module)
    assert spec is not None, module
    if spec.submodule_search_locations is not None:  # a package: `python -m` runs its __main__
        assert importlib.util.find_spec(module + ".__main__") is not None, module


def test_sweep_package_reexports_the_sweep():
    import drums_core.sweep as pkg

    from drums_core.sweep import cli, driver, instance, report

    homes = {"sweep": driver, "sweep_instance": instance, "session_selector": driver, "RunReport": report,
             "RunStatus": report, "SweepReport": report, "main": cli}
    for name, mod in homes.items():
        assert getattr(pkg, name) is getattr(mod, name), name
    assert callable(pkg.sweep) and pkg.sweep.__module__ == "drums_core.sweep.driver"


def _python(code: str, *, path: list[str], bare: bool = False) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    argv = [sys.executable, *(["-S"] if bare else []), "-c", code]
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd="/", timeout=60)


def test_cli_loads_the_upper_layers_commands_from_the_entry_point_group(tmp_path):
    # a real distribution's metadata declaring the group (what setup.cfg declares for the installed drums)
    dist = tmp_path / "drums_entry_probe-0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: drums-entry-probe\nVersion: 0\n")
    (dist / "entry_points.txt").write_text("[drums.cli]\nosworld = drums_osworld:register_cli\n")
    code = ("import sys\nfrom drums_core import cli, cli_registry\n"
            "assert 'drums_osworld' not in sys.modules\n"
            "print(cli.passthrough('bench'), cli.passthrough('rollouts'), cli_registry.desktop())")
    out = _python(code, path=[str(tmp_path), str(REPO)])
    assert out.returncode == 0, out.stderr
    assert "drums_osworld.bench" in out.stdout and "drums_osworld.apps.rollouts" in out.stdout, out.stdout
    assert "cli_desktop" in out.stdout, out.stdout


def test_setup_cfg_declares_the_cli_group():
    import configparser

    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    group = cfg["options.entry_points"]["drums.cli"]
    assert "drums_osworld:register_cli" in group, group


@pytest.mark.parametrize("argv,what", [(["bench", "branch"], "`drums bench`"),
                                       (["rollouts", "--task", "t"], "`drums rollouts`"),
                                       (["up"], "the desktop `drums up` boots")])
def test_cli_without_a_provider_says_so(argv, what):
    # a Python without site-packages: no installed drums metadata, nothing registered
    code = f"import sys\nfrom drums_core.cli import main\nsys.exit(main({argv!r}))"
    env = dict(os.environ, PYTHONPATH=str(REPO), DRUMS_INSTANCE="no-such-instance-layers")
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, env=env, cwd="/",
                         timeout=60)
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and "no installed package provides" in lines[0] and what in lines[0], out.stderr


def test_the_guest_package_imports_in_a_bare_python():
    # inside a desktop the code layer holds both packages and the image's Python has neither OSWorld
    # nor gymnasium: importing the guest's package must need no third-party package
    code = "import drums_osworld.guest, drums_osworld.guest.a11y_guard; print('ok')"
    out = _python(code, path=[str(REPO)], bare=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def _import_graph(packages: tuple[str, ...]) -> dict[str, set[str]]:
    """file -> files it imports (checkout-relative paths), for every module of ``packages``: an import
    of a package leads to its ``__init__``, ``from pkg import name`` to ``pkg/name`` when that is a
    module; imports for type checking only count too (a circle is a circle to a reader)."""
    def target(module: str) -> str | None:
        base = REPO.joinpath(*module.split("."))
        for p in (base.with_suffix(".py"), base / "__init__.py"):
            if p.is_file():
                return str(p.relative_to(REPO))
        return None

    graph: dict[str, set[str]] = {}
    for package in packages:
        for path in sorted((REPO / package).rglob("*.py")):
            here = str(path.relative_to(REPO))
            parts = list(path.relative_to(REPO).parts[:-1])
            edges = graph.setdefault(here, set())
            for node in ast.walk(ast.parse(path.read_text(), here)):
                names: list[str] = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    mod = ".".join(parts[: len(parts) - (node.level - 1)] + ([node.module] if node.module else [])) \
                        if node.level else (node.module or "")
                    subs = [f"{mod}.{a.name}" for a in node.names if target(f"{mod}.{a.name}")]
                    names = subs if subs and len(subs) == len(node.names) else [mod, *subs]
                for name in names:
                    if name.split(".")[0] in packages and (t := target(name)) and t != here:
                        edges.add(t)
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one file (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles():
    """No file of drums_core or drums_osworld reaches itself through imports, type-checking ones included
    (the two of an earlier layout: farm/pool <-> farm/scheduler, gym/branching <-> gym/env)."""
    graph = _import_graph(("drums_core", "drums_osworld"))
    assert len(graph) > 150, len(graph)
    assert _circles(graph) == []


def test_the_circle_check_finds_a_circle():
    assert _circles({"a.py": {"b.py"}, "b.py": {"c.py"}, "c.py": {"a.py"}, "d.py": {"a.py"}}) == [["a.py", "b.py",
                                                                                                      "c.py"]]
