"""The ``drums`` CLI's one convention, checked without a daemon or root: global options before or
after the command, help on every option of every command (passthrough commands' own parsers
included), one-line usage errors with exit status 2, every exit status documented, and the purge's
refusals and its care with symbolic links on a scratch state root."""
from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

import drums_osworld  # noqa: F401 - registers what it adds to the CLI (bench, rollouts, up's desktop)
from drums_core import cli
from drums_core.config import Instance
from drums_core.errors import FailedPrecondition
from tests.support.suite import DRUMS_CLI

REPO = Path(__file__).resolve().parents[2]

# the required arguments of each command, to parse it alone
REQUIRED = {"up": [], "ls": [], "checkpoint": ["s1"], "restore": ["snap"], "destroy": ["s1"],
            "screenshot": ["s1", "-o", "/tmp/x.png"], "exec": ["s1", "--", "true"], "snapshots": [],
            "delete-snapshot": ["snap"], "spill": ["snap"], "audit": ["s1", "s2"], "sweep": [],
            "shutdown": []}


def _walk(parser: argparse.ArgumentParser, path: str):
    """(where, action) for every action of ``parser`` and of its subcommands, recursively."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield f"{path} {name} (the command itself)", argparse.Action([], name, help=helps.get(name))
                yield from _walk(sub, f"{path} {name}")
        elif not isinstance(action, argparse._HelpAction):
            yield path, action


def _all_parsers():
    parser, cmds = cli.build_parser()
    yield "drums", parser
    for name in (*cli.PASSTHROUGH, *cli.PROVIDED):
        module, build, _ = cli.passthrough(name)
        yield f"drums {name}", getattr(importlib.import_module(module), build)()


def test_every_option_of_every_command_has_help():
    missing = []
    count = 0
    for where, parser in _all_parsers():
        for path, action in _walk(parser, where):
            count += 1
            if not (action.help or "").strip() or action.help == argparse.SUPPRESS:
                missing.append(f"{path}: {'/'.join(action.option_strings) or action.dest}")
    assert count > 80  # the walk reached the subcommands and the passthrough parsers
    assert not missing, f"options without help: {missing}"


def test_commands_and_passthrough_table_agree():
    _, cmds = cli.build_parser()
    assert set(REQUIRED) | set(cli.PASSTHROUGH) | set(cli.PROVIDED) == set(cmds)


@pytest.mark.parametrize("cmd", sorted(REQUIRED))
def test_global_options_before_or_after_the_command(cmd):
    glob = ["--json", "--instance", "other", "--slot-base", "2950", "--slot-count", "3"]
    req = REQUIRED[cmd]
    before, _ = cli.parse(glob + [cmd] + req)
    if "--" in req:  # after `--` everything is the command's: the options go before it
        cut = req.index("--")
        after, _ = cli.parse([cmd] + req[:cut] + glob + req[cut:])
    else:
        after, _ = cli.parse([cmd] + req + glob)
    plain, _ = cli.parse([cmd] + req)
    assert vars(before) == vars(after)
    assert (before.json, before.instance, before.slot_base, before.slot_count) == (True, "other", 2950, 3)
    assert (plain.json, plain.instance, plain.slot_base, plain.slot_count) == (False, None, None, None)
    # mixed: one before, one after
    mixed, _ = cli.parse(["--instance", "other", cmd] + (req if "--" not in req else req[:req.index("--")])
                         + ["--json"] + (req[req.index("--"):] if "--" in req else []))
    assert mixed.json is True and mixed.instance == "other"


def test_exec_options_after_double_dash_belong_to_the_command():
    args, _ = cli.parse(["exec", "s1", "--json", "--", "ls", "--json", "--instance", "x"])
    assert args.json is True and args.instance is None
    assert args.argv == ["ls", "--json", "--instance", "x"]


@pytest.mark.parametrize("argv,forwarded", [
    (["doctor", "--json"], ["--json"]),
    (["--json", "doctor"], ["--json"]),
    (["--instance", "x", "doctor"], []),  # the doctor checks the host, not an instance
    (["image", "ls", "--json"], ["--json", "ls"]),
    (["rollouts", "--task", "t", "--instance", "x"], ["--instance", "x", "--task", "t"]),
    (["--instance", "x", "--slot-base", "7", "bench", "branch", "--quick"],
     ["--instance", "x", "--slot-base", "7", "branch", "--quick"]),
    (["bench", "--help"], ["--help"]),
])
def test_passthrough_commands_get_the_global_options(argv, forwarded):
    args, rest = cli.parse(argv)
    assert cli.passthrough_argv(args, rest) == forwarded


def test_screen_values():
    assert cli._screen("1280x720") == (1280, 720)
    assert cli._screen("800X600") == (800, 600)
    for bad in ("abc", "1920", "1920x", "x1080", "-1x5", "0x0", "99999x10", "1920x1080x24"):
        with pytest.raises(argparse.ArgumentTypeError):
            cli._screen(bad)


def _drums(*args: str, cwd: str = "/") -> subprocess.CompletedProcess:
    # an instance nobody runs and no daemon autostart: every case below must fail at parse time
    env = dict(os.environ, PYTHONPATH=str(REPO), DRUMS_INSTANCE="no-such-instance-cli-unit")
    return subprocess.run([*DRUMS_CLI, *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=60)


@pytest.mark.parametrize("argv", [
    ["up", "--screen", "abc"],
    ["up", "--screen", "10x10"],
    ["up", "--network", "bogus"],
    ["up", "--network", "none", "--upstream", "eth0"],
    ["up", "--program", "xterm '"],
    [],
    ["frobnicate"],
    ["ls", "--bogus"],
    ["--instance", "../etc", "ls"],
    ["ls", "--slot-base", "-1"],
    ["restore", "snap", "--count", "0"],
    ["restore", "snap", "--count", "two"],
    ["restore"],
    ["exec", "s1"],
    ["exec", "s1", "--user", "bob", "--", "true"],
    ["exec", "s1", "--timeout", "-3", "--", "true"],
    ["screenshot", "s1"],
    ["screenshot", "s1", "-o", "/no/such/dir/x.png"],
    ["shutdown", "--dry-run"],
    ["sweep", "--force"],
    ["doctor", "--bogus"],
    ["image", "frob"],
    ["bench", "no-such-suite"],
    ["rollouts", "--task"],
])
def test_usage_errors_exit_2_with_one_line(argv):
    out = _drums(*argv)
    assert out.returncode == 2, (argv, out.stdout, out.stderr)
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and "error:" in lines[0] and "Traceback" not in out.stderr, (argv, out.stderr)
    assert out.stdout == ""


def test_bad_instance_settings_in_the_environment_are_usage_errors(monkeypatch):
    for var, value in (("DRUMS_SLOT_BASE", "abc"), ("DRUMS_INSTANCE", "../etc")):
        env = dict(os.environ, PYTHONPATH=str(REPO), DRUMS_INSTANCE="no-such-instance-cli-unit")
        env[var] = value
        out = subprocess.run([sys.executable, "-m", "drums_core.cli", "ls"], capture_output=True, text=True,
                             env=env, cwd="/", timeout=60)
        assert out.returncode == 2 and len(out.stderr.splitlines()) == 1 and "environment" in out.stderr, out.stderr
    # the global options win over the environment
    monkeypatch.setenv("DRUMS_INSTANCE", "../etc")
    monkeypatch.setenv("DRUMS_SLOT_BASE", "abc")
    args, _ = cli.parse(["ls", "--instance", "fine", "--slot-base", "5"])
    assert (args.target.name, args.target.slot_base) == ("fine", 5)


def test_up_bad_screen_message_names_the_format():
    out = _drums("up", "--screen", "abc")
    assert out.stderr.strip().startswith("drums up: error: argument --screen: 'abc' is not WIDTHxHEIGHT")


def test_help_documents_every_exit_status():
    out = _drums("--help")
    assert out.returncode == 0
    text = out.stdout
    epilog = text[text.index("exit status:"):]
    for code in ("0", "1", "2", "3", "125", "126", "127"):
        assert f"\n  {code} " in epilog, code
    assert "drums ls --json" in text and "drums --json ls" in text


def test_every_command_help_runs_from_any_directory(tmp_path):
    _, cmds = cli.build_parser()
    for name in cmds:
        out = _drums(name, "--help", cwd=str(tmp_path))
        assert out.returncode == 0 and "usage:" in out.stdout, (name, out.stderr)


# ------------------------------------------------------------------ purge on a scratch state root
def _scratch(tmp_path) -> Instance:
    inst = Instance(name="purgeunit", slot_base=0, slot_count=1, state_root=tmp_path / "run")
    for d in (inst.sessions_dir, inst.snapshots_dir / "abc", inst.images_dir):
        d.mkdir(parents=True)
    for suffix in (".lock", ".log", ".stderr"):
        (inst.state_root / f"purgeunit{suffix}").write_text("x")
    return inst


def test_purge_removes_the_state_without_following_links(tmp_path):
    from drums_core.daemon.purge import plan_purge, purge

    inst = _scratch(tmp_path)
    canary = tmp_path / "outside"
    canary.mkdir()
    (canary / "keep").write_text("precious")
    os.symlink(canary, inst.snapshots_dir / "abc" / "escape")  # as a session's file in a layer could be
    os.symlink(canary / "keep", inst.state_dir / "file-link")
    spill = tmp_path / "spill" / "purgeunit"
    (spill / "abc").mkdir(parents=True)
    os.symlink(canary, spill / "abc" / "escape")
    plan = plan_purge(inst, spill_dir=spill)
    assert plan.daemon_pid is None and plan.state_dir == str(inst.state_dir) and plan.spill_dir == str(spill)
    assert [s["id"] for s in plan.snapshots] == ["abc"]
    assert any("remove " + str(inst.state_dir) in line for line in plan.lines())
    report = purge(inst, plan)
    assert not inst.state_dir.exists() and not spill.exists()
    assert sorted(os.listdir(inst.state_root)) == []
    assert (canary / "keep").read_text() == "precious"
    assert str(inst.state_dir) in report.removed


def test_purge_refuses_a_state_dir_that_is_a_symlink(tmp_path):
    from drums_core.daemon.purge import plan_purge, purge

    inst = Instance(name="purgeunit", state_root=tmp_path / "run")
    inst.state_root.mkdir()
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "keep").write_text("x")
    os.symlink(target, inst.state_dir)
    with pytest.raises(FailedPrecondition) as exc:
        purge(inst, plan_purge(inst, spill_dir=None))
    assert exc.value.reason == "PURGE_REFUSED"
    assert (target / "keep").exists() and inst.state_dir.is_symlink()


def test_purge_refuses_while_a_run_of_the_instance_is_alive(tmp_path):
    from drums_core.sweep.ledger import Ledger
    from drums_core.daemon.purge import plan_purge, purge

    inst = _scratch(tmp_path)
    Ledger.create(inst.ledger_root, "purgeunit-0123456789ab")  # owned by this (live) process
    with pytest.raises(FailedPrecondition) as exc:
        purge(inst, plan_purge(inst, spill_dir=None))
    assert exc.value.reason == "PURGE_REFUSED" and "could not be stopped" in exc.value.message
    assert (inst.snapshots_dir / "abc").is_dir() and (inst.state_root / "purgeunit.log").exists()


def test_purge_refuses_a_shallow_spill_dir(tmp_path):
    from drums_core.daemon.purge import PurgePlan, purge

    inst = _scratch(tmp_path)
    with pytest.raises(FailedPrecondition):
        purge(inst, PurgePlan(instance=inst.name, spill_dir="/var"))
    assert inst.state_dir.is_dir()
