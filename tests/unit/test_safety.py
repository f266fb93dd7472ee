"""Guards: blast radius, silences, planned windows."""

from __future__ import annotations

import pytest
from gangwatch.schemas import Ops
from gangwatch.triage.budgets import Safety
from gangwatch.triage.decide import Decision
from gangwatch.triage.safety import Guards

pytestmark = pytest.mark.unit


def replace(*nodes):
    return Decision("replace", tuple(nodes), "hot", "because")


def test_allowed_evictions_scale_with_job_size():
    g = Guards(Safety(max_evict_nodes=16, max_evict_frac=0.25))
    assert [g.allowed_evictions(n) for n in (1, 4, 16, 256, 1000)] == [1, 1, 4, 16, 16]


def test_within_limit_passes_and_is_counted():
    g = Guards(Safety())
    assert g.review([replace("n1")], now=100.0, job_nodes=16) == [replace("n1")]
    assert g.evictions == [(100.0, "n1")]


def test_over_limit_escalates_instead():
    g = Guards(Safety())
    [d] = g.review([replace(*[f"n{i}" for i in range(16)])], now=0.0, job_nodes=16)
    assert d.type == "escalate" and d.path == "manual" and "blast-radius" in d.reason
    assert g.evictions == []


def test_limit_counts_earlier_evictions_in_the_window():
    g = Guards(Safety(window_s=600))
    for i, t in enumerate((0.0, 10.0, 20.0, 30.0)):
        assert g.review([replace(f"n{i}")], now=t, job_nodes=16)[0].type == "replace"
    assert g.review([replace("n9")], now=40.0, job_nodes=16)[0].type == "escalate"
    assert g.review([replace("n9")], now=700.0, job_nodes=16)[0].type == "replace"  # window moved on


def test_silenced_node_gets_no_action():
    g = Guards(Safety())
    g.on_ops(Ops(ts=0.0, type="silence", node="n1", until_ts=100.0), planned_window_s=1800)
    assert g.review([replace("n1")], now=50.0, job_nodes=16) == []
    assert g.review([replace("n1")], now=150.0, job_nodes=16)[0].type == "replace"


def test_job_silence_mutes_everything():
    g = Guards(Safety())
    g.on_ops(Ops(ts=0.0, type="silence", job="j1", until_ts=100.0), planned_window_s=1800)
    assert g.review([replace("n1"), Decision("escalate", (), "manual", "x")], now=5.0, job_nodes=16) == []


def test_planned_window():
    g = Guards(Safety())
    g.on_ops(Ops(ts=100.0, type="maintenance", node="n7", planned=True), planned_window_s=600)
    assert g.is_planned(200.0) and not g.is_planned(800.0) and not g.is_planned(50.0)
