"""Statuses are enums that still serialise to the strings scripts read (issue 17)."""
from __future__ import annotations

import json
from dataclasses import asdict

from drums_core.session.model import Liveness, Session, SessionSpec, State
from drums_core.sweep import RunReport, RunStatus


def test_run_report_status_is_an_enum_serialised_as_before():
    r = RunReport(run="r1")
    assert r.status is RunStatus.PENDING
    r.status = RunStatus.SKIPPED_ALIVE
    assert json.loads(json.dumps(asdict(r)))["status"] == "skipped-alive"
    assert "status=skipped-alive " in r.summary()
    assert {s.value for s in RunStatus} == {"pending", "swept", "survivors", "incomplete", "failed-closed",
                                            "skipped-alive", "busy", "absent", "dry-run"}


def test_session_liveness_is_an_enum_serialised_as_before():
    s = Session(id="s1", slot=0, state=State.RUNNING, spec=SessionSpec.from_dict({}), dir="/d", root="/r",
                ifname="dvh0", host_address="169.254.0.1", address="169.254.0.2", display=100,
                hostname="h", machine_id="m", created=0.0)
    assert s.liveness is Liveness.UNCHECKED
    s.liveness = Liveness.OK
    public = json.loads(json.dumps(s.public()))
    assert public["liveness"] == "ok" and public["state"] == "RUNNING"
