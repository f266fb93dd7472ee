"""The shipped Prometheus alert rules name only series gangwatch really exports, with labels they really carry.

deploy/prometheus/rules/gangwatch.rules.yml is checked by Prometheus's own tool in
tests/integration/test_alert_rules.py (`promtool check rules`, `promtool test rules`). promtool
cannot know whether a name exists: a rule on a misspelt or renamed series is valid PromQL and
never fires. So here every `gangwatch_*` name in the rules' expressions, and in the input series
of their unit tests, must be a series of the code's own metric definitions: the worker's
(`streams/metrics.py` `WorkerMetrics`, and Faust's sensor under `FAUST_PREFIX`) and the
producers' (`producers/metrics.py`, every `Family`), with the sample suffixes prometheus-client
writes (`_total` of a counter, `_bucket` / `_count` / `_sum` of a histogram). Every label a
selector matches on must be one of that series' labels (or `job`, `instance`, which Prometheus
adds, or `le` of a bucket).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers import need_module

yaml = need_module("yaml", "PyYAML (the `dev` extra)")
need_module("prometheus_client", "prometheus-client (the `worker` extra)")

from gangwatch.producers import metrics as producer_metrics  # noqa: E402 - after the skip
from prometheus_client import CollectorRegistry  # noqa: E402

pytestmark = pytest.mark.unit

RULES_DIR = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "rules"
RULES = RULES_DIR / "gangwatch.rules.yml"
RULE_TESTS = RULES_DIR / "gangwatch.rules.test.yml"
SCRAPE_LABELS = {"job", "instance"}
SUFFIXES = {"counter": ("_total", "_created"), "gauge": ("",), "histogram": ("_bucket", "_count", "_sum", "_created"),
            "summary": ("", "_count", "_sum", "_created"), "info": ("_info",)}
SELECTOR = re.compile(r"\b(gangwatch_[A-Za-z0-9_]+)\s*(\{[^}]*\})?")
MATCHER = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)\s*(?:\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*')")


def exported() -> dict[str, set[str]]:
    """Every sample name the code defines, with the label names it can carry."""
    from gangwatch.streams.metrics import FAUST_PREFIX, WorkerMetrics

    registry = CollectorRegistry()
    WorkerMetrics(registry)
    faust = need_module("faust.sensors.prometheus", "Faust (the `worker` extra)")
    faust.FaustMetrics.create(registry, FAUST_PREFIX)
    names: dict[str, set[str]] = {}
    for family in registry.collect():
        labels = set()
        for m in registry._names_to_collectors.values():  # the label names of a family with no child yet
            if getattr(m, "_name", None) == family.name:
                labels = set(getattr(m, "_labelnames", ()))
        for suffix in SUFFIXES[family.type]:
            names[family.name + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
    for value in vars(producer_metrics).values():
        if isinstance(value, producer_metrics.Family):
            for suffix in SUFFIXES[value.type]:
                names[value.name + suffix] = set(value.labels)
    return names


def selectors(expr: str) -> list[tuple[str, set[str]]]:
    """Each `gangwatch_*` name of a PromQL expression, with the label names its selector matches on."""
    found = []
    for m in SELECTOR.finditer(expr):
        found.append((m.group(1), {lm.group(1) for lm in MATCHER.finditer(m.group(2) or "")}))
    return found


def rule_exprs() -> list[tuple[str, str]]:
    doc = yaml.safe_load(RULES.read_text())
    return [(rule.get("alert") or rule.get("record"), rule["expr"])
            for group in doc["groups"] for rule in group["rules"]]


def test_the_rules_name_only_series_and_labels_the_code_exports():
    names = exported()
    assert "gangwatch_consumer_lag_records" in names and "gangwatch_producer_spool_bytes" in names, sorted(names)
    used = 0
    for alert, expr in rule_exprs():
        for name, labels in selectors(expr):
            used += 1
            assert name in names, f"{alert}: {name} is no series gangwatch exports (streams/metrics.py, " \
                                  f"producers/metrics.py)"
            extra = labels - names[name] - SCRAPE_LABELS
            assert not extra, f"{alert}: {name} has no label {sorted(extra)} (it has {sorted(names[name])})"
    assert used >= 15  # the extraction found the rules' series


def test_the_rules_unit_tests_feed_series_the_code_exports():
    names = exported()
    doc = yaml.safe_load(RULE_TESTS.read_text())
    for case in doc["tests"]:
        for series in case["input_series"]:
            for name, labels in selectors(series["series"]):
                assert name in names, f"{case['name']}: input series {name} is not exported by gangwatch"
                extra = labels - names[name] - SCRAPE_LABELS
                assert not extra, f"{case['name']}: {name} has no label {sorted(extra)}"


def test_a_misspelt_name_or_label_is_caught():
    names = exported()
    assert names["gangwatch_sink_queue_depth"] == {"sink"}
    assert names["gangwatch_incident_stage_seconds_bucket"] == {"stage", "class", "le"}
    assert names["gangwatch_agent_polls_total"] == {"collector"}
    (name, labels), = selectors('rate(gangwatch_sink_failure_total{job="gangwatch-worker", sink="x"}[5m])')
    assert name not in names
    (name, labels), = selectors('gangwatch_sink_queue_depth{job="gangwatch-worker", sinks="x"}')
    assert labels - names[name] - SCRAPE_LABELS == {"sinks"}
