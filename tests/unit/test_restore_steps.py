"""The restore's named steps and the one translation of a failed step's error (no session needed)."""
from __future__ import annotations

import logging
import subprocess

import pytest

from drums_core.errors import FailedPrecondition, Internal, Unavailable
from drums_core.session.restore_steps import RestoreStep, StepTrace, rolled_back, step_of


def _leave(step: RestoreStep, exc: BaseException) -> BaseException:
    trace = StepTrace("sess", "snap")
    with pytest.raises(type(exc)) as caught:
        with trace.step(step):
            raise exc
    return caught.value


def test_a_step_names_what_left_it_and_the_first_step_wins(caplog):
    caplog.set_level(logging.DEBUG, logger="drums.restore")
    exc = _leave(RestoreStep.CRIU, OSError("boom"))
    assert step_of(exc) is RestoreStep.CRIU
    trace = StepTrace("sess", "snap")
    with pytest.raises(OSError):
        with trace.step(RestoreStep.READINESS):
            raise exc  # re-raised through a later step: still criu's
    assert step_of(exc) is RestoreStep.CRIU
    with trace.step(RestoreStep.NETWORK):
        pass
    assert set(trace.seconds) == {"network"}
    assert "step criu failed after" in caplog.text and "step network done in" in caplog.text


def test_rolled_back_translates_each_kind_once():
    never = lambda: pytest.fail("images are checked only when CRIU failed")  # noqa: E731
    err = rolled_back(_leave(RestoreStep.NETWORK, OSError("no link")), "s1", never)
    assert isinstance(err, Unavailable) and err.reason == "RESTORE_FAILED"
    assert err.message == "restore of s1 failed at step network and was rolled back: no link"
    assert err.detail == {"step": "network"}
    err = rolled_back(_leave(RestoreStep.PREPARE_ROOT, subprocess.CalledProcessError(32, ["mount"])), "s1", never)
    assert isinstance(err, Unavailable) and "at step prepare-root" in err.message
    busy = _leave(RestoreStep.NETWORK, Internal("link in use", reason="LINK_BUSY", detail={"link": "dvh1"}))
    err = rolled_back(busy, "s1", never)
    assert isinstance(err, Unavailable) and err.reason == "LINK_BUSY"
    assert err.detail == {"link": "dvh1", "step": "network"}
    other = rolled_back(_leave(RestoreStep.RESEED, FailedPrecondition("no", detail=["a"])), "s1", never)
    assert type(other) is FailedPrecondition and other.detail == ["a"] and "at step reseed: no" in other.message
    bug = _leave(RestoreStep.READINESS, KeyError("x"))
    assert rolled_back(bug, "s1", never) is bug
    outside = ValueError("before any step")
    assert rolled_back(outside, "s1", never).detail is None


def test_criu_failure_on_corrupt_images_is_internal_and_on_whole_ones_unavailable():
    criu_failed = _leave(RestoreStep.CRIU, Unavailable("criu exited 1", reason="CRIU_FAILED",
                                                       detail={"criu_log": ["a", "b", "Error (pie): x"]}))
    err = rolled_back(criu_failed, "s2", lambda: "pages-1.img is 10 bytes short")
    assert isinstance(err, Internal) and err.reason == "IMAGES_CORRUPT"
    assert err.detail == {"criu_log": ["a", "b", "Error (pie): x"], "verify": "pages-1.img is 10 bytes short",
                          "step": "criu"}
    assert "at step criu on corrupt images" in err.message
    err = rolled_back(criu_failed, "s2", lambda: None)
    assert isinstance(err, Unavailable) and err.reason == "CRIU_FAILED" and err.detail["step"] == "criu"
