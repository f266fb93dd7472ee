"""The shipped Prometheus alert rules, checked and unit-tested by Prometheus's own `promtool`.

- `promtool check rules deploy/prometheus/rules/gangwatch.rules.yml`: the file loads as Prometheus loads it
  (PromQL parses, templates of the annotations parse, no duplicate rule).
- `promtool test rules deploy/prometheus/rules/gangwatch.rules.test.yml`: every alert fires on the series
  where it must, with its labels and rendered annotations, and stays quiet where it must not.
- The unit tests can fail: each alert is broken twice in a copy of the rules, once so that it never fires
  and once so that it always fires (no `for`), and promtool must fail on the copy, on that alert: the case
  where it must fire, and a case where it must not.

That the rules name only series gangwatch exports is tests/unit/test_alert_rules_names.py. promtool comes
from Debian's `prometheus` package (.ci/run installs it); without it the tests skip with the reason, and
fail under GANGWATCH_REQUIRE_SERVICES=1.
"""

from __future__ import annotations

import copy
import re
import subprocess
from pathlib import Path

import pytest

from tests.helpers import REPO, need_module
from tests.integration.daemons import require_program

yaml = need_module("yaml", "PyYAML (the `dev` extra)")

pytestmark = pytest.mark.integration

RULES_DIR = REPO / "deploy" / "prometheus" / "rules"
RULES = RULES_DIR / "gangwatch.rules.yml"
RULE_TESTS = RULES_DIR / "gangwatch.rules.test.yml"


@pytest.fixture(scope="module")
def promtool() -> str:
    return require_program("promtool", package="prometheus")


def run(promtool: str, *args: str | Path, cwd: Path = RULES_DIR) -> subprocess.CompletedProcess:
    """promtool's stdout and stderr as one stream, in order (it says which file on stdout, a failure on stderr)."""
    return subprocess.run([promtool, *map(str, args)], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=120)


def alerts() -> list[str]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule["alert"] for group in doc["groups"] for rule in group["rules"] if "alert" in rule]


def test_promtool_checks_the_rules(promtool):
    done = run(promtool, "check", "rules", RULES)
    assert done.returncode == 0, done.stdout
    assert f"SUCCESS: {len(alerts())} rules found" in done.stdout, done.stdout


def test_promtool_unit_tests_of_the_rules_pass(promtool):
    done = run(promtool, "test", "rules", RULE_TESTS)
    assert done.returncode == 0, done.stdout
    assert "SUCCESS" in done.stdout, done.stdout


def test_every_alert_has_a_case_where_it_fires_and_one_where_it_must_not():
    cases: dict[str, list[list]] = {}
    for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for case in test["alert_rule_test"]:
            cases.setdefault(case["alertname"], []).append(case.get("exp_alerts") or [])
    for alert in alerts():
        got = cases.get(alert, [])
        assert any(got), f"{alert}: no case in {RULE_TESTS.name} where it must fire"
        assert any(not exp for exp in got), f"{alert}: no case in {RULE_TESTS.name} where it must not fire"


def test_the_unit_tests_fail_on_broken_rules(promtool, tmp_path):
    """Each alert broken in a copy of the rules, two ways; one promtool run over every copy."""
    doc = yaml.safe_load(RULES.read_text())
    breaks = {"never": {"expr": "vector(1) > 2"}, "always": {"expr": "vector(1)"}}
    runs = []
    for alert in alerts():
        for how, change in breaks.items():
            broken = copy.deepcopy(doc)
            for group in broken["groups"]:
                for rule in group["rules"]:
                    if rule.get("alert") == alert:
                        rule.update(change)
                        rule.pop("for", None)
            where = tmp_path / f"{alert}-{how}"
            where.mkdir()
            (where / RULES.name).write_text(yaml.safe_dump(broken, sort_keys=False))
            (where / RULE_TESTS.name).write_text(RULE_TESTS.read_text())
            runs.append((alert, how, where / RULE_TESTS.name))
    assert doc["groups"] and len(runs) == 2 * len(alerts())
    done = run(promtool, "test", "rules", *(path for _, _, path in runs), cwd=tmp_path)
    assert done.returncode != 0, done.stdout
    # promtool writes one section per file: "Unit Testing:  PATH" then SUCCESS or FAILED with each failed case
    sections = dict(re.findall(r"Unit Testing:\s+(\S+)\n(.*?)(?=Unit Testing:|\Z)", done.stdout, re.S))
    for alert, how, path in runs:
        out = sections.get(str(path))
        assert out is not None, f"promtool said nothing of {path}:\n{done.stdout[-3000:]}"
        assert "FAILED" in out, f"{alert} broken ({how}) and its unit tests still pass:\n{out}"
        failed = re.findall(rf"alertname: {alert}, time: \S+,\s*\n\s*exp:(\[\]|\[)", out)
        if how == "never":  # a case where it must fire failed
            assert "[" in failed, f"{alert} never fires and no case where it must fire failed:\n{out}"
        else:  # a case where it must not fire failed
            assert "[]" in failed, f"{alert} always fires and no case where it must stay quiet failed:\n{out}"
