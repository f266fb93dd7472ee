"""The shipped queries' files and how parameters reach their text (gangwatch/report/queries.py)."""

from __future__ import annotations

import pytest

from gangwatch.report.queries import BUILTINS, catalog, parse, render

pytestmark = pytest.mark.unit

SOURCE = """-- Failures of one job: each row a finding.
-- param job String '': the job
-- param limit Int64 5: at most this many
SELECT id FROM gw_findings FINAL WHERE job = {job} LIMIT {limit}
"""


def test_a_query_file_declares_what_it_answers_and_its_parameters():
    q = parse("f", SOURCE)
    assert q.doc == "Failures of one job: each row a finding." and q.summary == "Failures of one job"
    assert [(p.name, p.type, p.default) for p in q.params.values()] == [("job", "String", "''"),
                                                                         ("limit", "Int64", "5")]
    assert render(q, {}) == "SELECT id FROM gw_findings FINAL WHERE job = '' LIMIT 5"


def test_a_value_is_a_literal_of_its_type_and_cannot_change_the_query():
    q = parse("f", SOURCE)
    assert render(q, {"job": "x' OR 1=1 --"}).endswith("WHERE job = 'x\\' OR 1=1 --' LIMIT 5")
    assert render(q, {"job": "a\\'b"}).endswith("WHERE job = 'a\\\\\\'b' LIMIT 5")
    for bad, says in (({"limit": "5; DROP TABLE gw_findings"}, "want an integer"), ({"limit": "1e3"}, "integer"),
                      ({"nope": "1"}, "f takes no --param nope (it takes: job, limit)")):
        with pytest.raises(ValueError, match=said(says)):
            render(q, bad)


@pytest.mark.parametrize("source, says", [
    ("-- x\n-- param job Text '': j\nSELECT {job}", "want '-- param NAME String|Float64|Int64 DEFAULT: what'"),
    ("-- x\nSELECT {job}", "uses {job} but declares no such param"),
    ("-- x\n-- param job String '': j\nSELECT 1", "declares param job but never uses it"),
    ("-- x\n-- param n Int64 1.5: n\nSELECT {n}", "want an integer"),
    ("-- x\n-- param data_end Float64 0: e\nSELECT {data_end}", "declares param data_end, a name every query has"),
])
def test_a_mistake_in_a_query_file_is_named(source, says):
    with pytest.raises(ValueError, match=said(says)):
        parse("bad", source)


def said(text: str) -> str:
    import re

    return re.escape(text)


def test_every_shipped_query_parses_and_documents_itself():
    shipped = catalog()
    assert len(shipped) >= 5
    for q in shipped.values():
        assert len(q.doc) > 40 and all(p.doc for p in q.params.values()), q.name
        assert "{" not in render(q, {})


def test_a_window_without_an_end_ends_at_the_datas_last_event_never_the_wall_clock():
    q = parse("f", "-- x\n-- param until Float64 0: e\nSELECT if({until} > 0, {until}, {data_end})")
    assert render(q, {}) == f"SELECT if(0.0 > 0, 0.0, {BUILTINS['data_end']})"
    assert "max(ts) AS t FROM gw_findings" in BUILTINS["data_end"] and "now()" not in BUILTINS["data_end"]
    assert not [q.name for q in catalog().values() if "now()" in q.text]
