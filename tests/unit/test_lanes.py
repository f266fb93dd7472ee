"""The lane table's arithmetic (tests/lanes.py): sums per lane, the span, budgets said and never failed on."""

from __future__ import annotations

import pytest

from tests.lanes import budgets, render, summary

pytestmark = pytest.mark.unit


def price(lane: str, start: float, wall: float, cpu: float, worker: str = "gw0") -> dict:
    return {"lane": lane, "start": start, "wall_s": wall, "cpu_s": cpu, "children_cpu_s": 0.0, "worker": worker}


def test_lanes_add_up_their_tests_and_a_lane_over_its_budget_is_named():
    tests = {"tests/unit/a.py::t1": price("unit", 100.0, 2.0, 1.5),
             "tests/unit/a.py::t2": price("unit", 101.0, 4.0, 3.5, "gw1"),
             "tests/integration/test_faults.py::t": price("fault", 100.0, 90.0, 9.0, "gw2")}
    s = summary(tests, {"tests/unit/a.py::t2": "failed"}, 100.0, 0.9, 2, budgets("unit=wall:5,fault=cpu:100"))
    unit = s["lanes"]["unit"]
    assert (unit["tests"], unit["failed"], unit["wall_s"], unit["cpu_s"], unit["span_s"], unit["workers"]) == \
        (2, 1, 6.0, 5.0, 5.0, 2)
    assert s["session"]["tests_cpu_s"] == 14.0 and s["session"]["tests_cpu_of_cores"] == 0.07
    assert [t["nodeid"] for t in s["tests"]][0] == "tests/integration/test_faults.py::t"  # slowest first
    lines = render(s)
    over = [line for line in lines if "over its budget" in line]
    assert len(over) == 1 and over[0].startswith("lane unit over its budget: wall 6 s")
    assert any(line.startswith("unit") and line.endswith("OVER") for line in lines)


@pytest.mark.parametrize("text", ["unit", "unit=5", "units=wall:5", "unit=clock:5", "unit=cpu:soon"])
def test_a_budget_that_is_not_lane_equals_seconds_is_refused_at_once(text):
    with pytest.raises(pytest.UsageError):
        budgets(text)
