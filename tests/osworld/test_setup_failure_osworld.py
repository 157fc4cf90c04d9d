"""Failed setup is not a score, through OSWorld's own ``DesktopEnv(provider_name="drums")``.

OSWorld 1.0.2's ``SetupController`` only logs a launch the guest refuses, and a launch of a missing
program through a shell even succeeds at the HTTP level; ``reset`` returns and ``evaluate`` would
give a plausible score. The provider journals the setup in the guest, puts the report on
``env.provider.setup_report``, logs a warning naming the steps, never saves such a desktop as a
``post_setup`` state, and with ``DRUMS_STRICT_SETUP=1`` (or the provider option) raises from
``reset``. The task is OSWorld's e0df059f with two failing launches first. Real daemon, CRIU, guest.
"""
from __future__ import annotations

import json
import textwrap

E0DF = "os/e0df059f-28a6-4169-924f-b9623e7184cc.json"

PRELUDE = f'''
    import copy
    from drums_osworld.setup_journal import SetupFailed
    from drums_osworld.snapshot import set_reuse_mode, delete_post_setup
    records = []
    class _H(logging.Handler):
        def emit(self, r):
            if r.levelno >= logging.WARNING and r.name.startswith("drums"):
                records.append(r.getMessage())
    logging.getLogger().addHandler(_H())
    task = copy.deepcopy(load_task({E0DF!r}))
    task["id"] = "drums-broken-osworld-setup"
    task["config"] = [{{"type": "launch", "parameters": {{"command": ["code", "--new-window"]}}}},
                      {{"type": "launch", "parameters": {{"command": "drums-no-such-app --x", "shell": True}}}},
                      {{"type": "sleep", "parameters": {{"seconds": 0.5}}}}] + task["config"]
'''


def check_report(rep: dict) -> None:
    assert rep["ok"] is False
    assert {(i["step"], i["type"]) for i in rep["issues"]} == {(0, "launch"), (1, "launch")}, rep
    assert "vscode" in rep["missing_apps"]


def test_reset_reports_failed_steps_and_strict_raises(osworld, client):
    out = osworld.run(textwrap.dedent(PRELUDE) + textwrap.dedent('''
        res = {}
        env = DesktopEnv(provider_name="drums", action_space="pyautogui", require_a11y_tree=False)
        try:
            env.reset(task_config=task)
            res["report"] = env.provider.setup_report.to_json()
            res["warnings"] = [m for m in records if "drums-broken-osworld-setup" in m]
            good = load_task(E0DF)
            env.reset(task_config=good)
            res["good"] = env.provider.setup_report.to_json()
            res["good_score"] = env.evaluate()
            env.provider.strict_setup = True
            try:
                env.reset(task_config=task)
                res["strict"] = "returned"
            except SetupFailed as e:
                res["strict"] = [e.reason, e.detail["setup"]["ok"], str(e)]
        finally:
            env.close()
        emit(res)
    ''').replace("E0DF", repr(E0DF)))
    print(json.dumps(out, indent=1))
    check_report(out["report"])
    assert out["warnings"] and "step 1 (launch)" in out["warnings"][0] and "do not score" in out["warnings"][0]
    assert out["good"]["ok"] is True and out["good_score"] == 0.0
    assert out["strict"][0] == "SETUP_FAILED" and out["strict"][1] is False and "step 2 (launch)" in out["strict"][2]


def test_env_var_makes_reset_strict_and_post_setup_never_saves_a_failed_setup(osworld, client):
    out = osworld.run(textwrap.dedent(PRELUDE) + textwrap.dedent('''
        res = {}
        env = DesktopEnv(provider_name="drums", action_space="pyautogui", require_a11y_tree=False)
        try:
            res["strict_default"] = env.provider.strict_setup
            env.provider.strict_setup = False
            set_reuse_mode(env, "post_setup")
            for i in range(2):
                env.reset(task_config=task)
                res[f"reset{i}"] = {"ok": env.provider.setup_report.ok,
                                    "saved": "saved_post_setup" in env.provider.timings,
                                    "from_saved": bool(env.provider.timings.get("from_saved_state"))}
            res["post_setup_snapshots"] = delete_post_setup(task)
        finally:
            env.close()
        emit(res)
    '''), DRUMS_STRICT_SETUP="1")
    assert out["strict_default"] is True
    for i in range(2):  # both resets set up again: nothing was saved from a failed setup
        assert out[f"reset{i}"] == {"ok": False, "saved": False, "from_saved": False}, out
    assert out["post_setup_snapshots"] == []
