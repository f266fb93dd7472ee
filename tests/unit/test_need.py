"""tests/helpers.py's one rule for what a test needs from its environment: a skip, but a failure in CI."""

from __future__ import annotations

import pytest

from tests.helpers import REQUIRE_ENV, missing, need, need_module

pytestmark = pytest.mark.unit


def test_something_missing_skips_here_and_fails_in_ci(monkeypatch):
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="no frobnicator"):
        need(None, "no frobnicator")
    with pytest.raises(pytest.skip.Exception, match="gangwatch_no_such_module is not importable"):
        need_module("gangwatch_no_such_module")
    monkeypatch.setenv(REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="no frobnicator .*GANGWATCH_REQUIRE_SERVICES=1"):
        need("", "no frobnicator")
    with pytest.raises(pytest.fail.Exception, match="gangwatch_no_such_module is not importable .*: for the demo"):
        need_module("gangwatch_no_such_module", "for the demo")
    with pytest.raises(pytest.fail.Exception, match="/dev/nothing"):
        missing("/dev/nothing is not readable here")


def test_what_is_there_is_handed_back(monkeypatch):
    monkeypatch.setenv(REQUIRE_ENV, "1")
    assert need("/usr/bin/chromium", "no chromium") == "/usr/bin/chromium"
    assert need_module("json").dumps([1]) == "[1]"
