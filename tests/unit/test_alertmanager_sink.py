"""AlertmanagerSink without an Alertmanager: what it sends, when, and under which labels.

The sink runs inline (`background=False`) with a fake sender and a fake clock, so
every POST body can be read back. The real Alertmanager is exercised in
tests/integration/test_alertmanager.py.
"""

from __future__ import annotations

import datetime as dt
import json

import pytest
from gangwatch.schemas import Action, Finding, Incident, Outputs
from gangwatch.sinks.alertmanager import AlertmanagerSink

pytestmark = pytest.mark.unit

T0 = 1_800_000_000.0  # the fake wall clock's start


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


class Fake:
    """Records each POST body; answers with the next status of `answers` (then 200)."""

    def __init__(self, *answers: int | None) -> None:
        self.bodies: list[list[dict]] = []
        self.answers = list(answers)

    def __call__(self, body: bytes) -> tuple[int | None, str]:
        self.bodies.append(json.loads(body))
        status = self.answers.pop(0) if self.answers else 200
        return status, "" if status == 200 else f"HTTP {status}: no"


def ts(iso: str) -> float:
    return dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def sink(fake: Fake, clock: Clock, **kw) -> AlertmanagerSink:
    return AlertmanagerSink("http://am.example:9093", background=False, send=fake, clock=clock, resend_s=60, **kw)


def xid(node: str = "n003", gpu: int = 1) -> Finding:
    return Finding(id="f-xid", ts=T0 - 5, job="j1", type="hw_fault", detector="hardware.xid", rank=25, node=node,
                   gpu=gpu, score=1.0, evidence={"severity": "fatal", "source": "xid", "code": 79,
                                                 "name": "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS"})


def incident(**kw) -> Incident:
    base = dict(id="i-1", ts=T0, job="j1", cls="hang", onset_ts=T0 - 10, detected_ts=T0 - 8,
                extra={"findings": ["f-xid"], "actions": []})
    return Incident(**{**base, **kw})


def by_node(body: list[dict]) -> dict[str | None, dict]:
    return {a["labels"].get("node"): a for a in body}


def test_url_is_normalized_and_checked():
    assert sink(Fake(), Clock()).url == "http://am.example:9093/api/v2/alerts"
    assert AlertmanagerSink("https://u:p@am/x/", background=False).url == "https://am/x/api/v2/alerts"
    with pytest.raises(ValueError, match="http"):
        AlertmanagerSink("am:9093", background=False)
    with pytest.raises(ValueError, match="ttl_s"):
        AlertmanagerSink("http://am", resend_s=10, ttl_s=5, background=False)


def test_open_incident_fires_with_labels_and_annotations_then_moves_to_its_culprit():
    fake, clock = Fake(), Clock()
    s = sink(fake, clock, labels={"cluster": "eu1"})
    s.write(Outputs(findings=[xid()], incidents=[incident()]))
    s.flush()
    [[alert]] = fake.bodies
    assert alert["labels"] == {"alertname": "GangwatchIncident", "job": "j1", "incident": "i-1", "class": "hang",
                               "severity": "critical", "cluster": "eu1"}  # not localized yet: no node
    assert ts(alert["startsAt"]) == T0 - 10 and ts(alert["endsAt"]) == T0 + 240  # onset; now + 4 x resend
    assert "still gathering evidence" in alert["annotations"]["reason"]
    report = alert["annotations"]["report"].split()  # the post-mortem command, with the store it reads
    assert report[:4] == ["gangwatch", "report", "--incident", "i-1"] and "--store" in report

    # the decision: a replace of n003, the class raised to fail_stop
    clock.now += 5
    act = Action(id="a-1", ts=clock.now, job="j1", incident="i-1", type="replace", nodes=["n003"],
                 reason="ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS, fail_stop; culprit n003 (confidence 0.97)")
    s.write(Outputs(actions=[act], incidents=[incident(cls="fail_stop", culprit_nodes=["n003"], path="hot")]))
    s.flush()
    sent = by_node(fake.bodies[1])
    assert set(sent) == {None, "n003"}
    assert ts(sent[None]["endsAt"]) == clock.now  # the old identity (no node, class hang) is resolved now
    new = sent["n003"]
    assert new["labels"]["class"] == "fail_stop" and new["labels"]["gpu"] == "1"
    assert new["annotations"]["reason"].startswith("replace n003: ROBUST_CHANNEL")
    assert "hw_fault n003 GPU 1 rank 25: ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS (Xid 79, fatal)" in \
        new["annotations"]["evidence"]
    assert new["annotations"]["summary"] == "fail_stop in job j1 on n003 GPU 1, path hot"
    assert [a["labels"]["node"] for a in s.firing()] == ["n003"]


def test_closing_resolves_at_the_recovery_time_and_stops_resending():
    fake, clock = Fake(), Clock()
    s = sink(fake, clock)
    s.write(Outputs(incidents=[incident(culprit_nodes=["n1", "n2"])]))
    s.flush()
    clock.now += 30
    s.write(Outputs(incidents=[incident(culprit_nodes=["n1", "n2"], recovered_ts=T0 + 20)]))
    s.flush()
    resolved = by_node(fake.bodies[1])
    assert set(resolved) == {"n1", "n2"}
    assert all(ts(a["endsAt"]) == T0 + 20 for a in resolved.values())
    assert s.firing() == []
    clock.now += 600
    s.flush()
    assert len(fake.bodies) == 2  # nothing open: nothing re-sent


def test_open_alerts_are_resent_with_a_fresh_end_before_it_passes():
    fake, clock = Fake(), Clock()
    s = sink(fake, clock)
    s.write(Outputs(incidents=[incident(cls="fail_slow", culprit_nodes=["n7"])]))
    s.flush()
    assert fake.bodies[0][0]["labels"]["severity"] == "warning"
    clock.now += 59
    s.flush()
    assert len(fake.bodies) == 1  # not due yet
    clock.now += 1
    s.flush()
    [again] = fake.bodies[1]
    assert ts(again["endsAt"]) == clock.now + 240
    assert ts(again["startsAt"]) == T0 - 10  # the same alert, not a new one


def test_a_failed_post_is_retried_and_a_refused_one_dropped():
    fake, clock = Fake(None, 503, 400), Clock()
    s = sink(fake, clock)
    s.write(Outputs(incidents=[incident()]))
    s.flush()  # connection error
    assert s.pending() == 1
    s.flush()  # 503
    assert s.pending() == 1 and s.failures == 2
    s.flush()  # 400: Alertmanager says the alert is invalid; sending it again cannot help
    assert s.pending() == 0 and s.posts == 0
    assert len(fake.bodies) == 3 and fake.bodies[0] == fake.bodies[2]


def test_closed_before_it_was_ever_seen_open_is_sent_resolved_once():
    fake, clock = Fake(), Clock()
    s = sink(fake, clock, report_url="https://grafana.example/d/gw?incident={incident}&job={job}")
    s.write(Outputs(incidents=[incident(cls="planned", recovered_ts=T0 + 100)]))  # recovery after "now"
    s.flush()
    [[alert]] = fake.bodies
    assert alert["labels"]["severity"] == "info"
    assert ts(alert["endsAt"]) == T0  # an end in the future would keep it firing: clamped to now
    assert alert["generatorURL"] == "https://grafana.example/d/gw?incident=i-1&job=j1"


def test_report_url_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("GANGWATCH_ALERTMANAGER_REPORT_URL", "http://r/{job}/{incident}")
    fake = Fake()
    s = sink(fake, Clock())
    s.write(Outputs(incidents=[incident()]))
    s.flush()
    assert fake.bodies[0][0]["annotations"]["report"] == "http://r/j1/i-1"


def test_a_finding_delivered_twice_is_one_line_of_evidence():
    """At-least-once delivery: the finding arrives again and the incident lists its id twice; one line, not two."""
    fake, clock = Fake(), Clock()
    s = sink(fake, clock)
    twice = incident(culprit_nodes=["n003"], extra={"findings": ["f-xid", "f-xid"], "actions": []})
    s.write(Outputs(findings=[xid()], incidents=[twice]))
    s.write(Outputs(findings=[xid()], incidents=[twice]))  # the re-publish
    s.flush()
    [alert] = fake.bodies[-1]
    assert alert["annotations"]["evidence"].count("hw_fault n003 GPU 1 rank 25") == 1
