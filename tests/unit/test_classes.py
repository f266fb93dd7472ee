"""Incident classes are declared once (schemas/classes.py): each part that treats classes differently reads the
declaration, and a class declared without one of its fields cannot be made."""

from __future__ import annotations

import dataclasses

import pytest
from gangwatch.schemas import DecodeError, decode_obj
from gangwatch.schemas.classes import CLASSES, Floor, IncidentClass, rank
from gangwatch.schemas.records import INCIDENT_CLASSES

pytestmark = pytest.mark.unit


def test_every_class_the_contract_allows_is_declared_and_no_other():
    assert tuple(CLASSES) == INCIDENT_CLASSES
    def incident(cls: str):
        return decode_obj({"kind": "incident", "v": 1, "ts": 1.0, "job": "j", "id": "i", "class": cls,
                           "onset_ts": 0.0, "detected_ts": 1.0})

    assert [incident(name).cls for name in CLASSES] == list(CLASSES)  # the contract takes every declared name
    assert isinstance(incident("flaky"), DecodeError)  # and no other


def test_a_class_without_one_of_its_fields_or_with_a_bad_one_cannot_be_made():
    fields = {f.name for f in dataclasses.fields(IncidentClass)}
    whole = dict(name="x", meaning="m", rank=1, severity="warning", opened_by_findings=True, stops_the_job=False,
                 keeps_training=True, self_resolves=False, waits="settle", decided_by="culprit",
                 floor=Floor())
    assert set(whole) == fields
    for missing in fields:
        with pytest.raises(TypeError):
            IncidentClass(**{k: v for k, v in whole.items() if k != missing})
    with pytest.raises(ValueError, match="severity"):
        IncidentClass(**{**whole, "severity": "page"})
    with pytest.raises(ValueError, match="both stop and train on"):
        IncidentClass(**{**whole, "stops_the_job": True})


def test_the_parts_read_the_declaration():
    from gangwatch.detectors.registry import INCIDENT_CLASSES as OPENED_BY_FINDINGS
    from gangwatch.triage.shadow import STOPS_THE_JOB

    from gangwatch.evaluation.scoring import FLOORS

    assert set(OPENED_BY_FINDINGS) == {"fail_stop", "fail_slow", "hang", "sdc", "unknown"}
    assert STOPS_THE_JOB == {"fail_stop", "hang", "stall", "unknown"}
    assert set(FLOORS) == {"fail_stop", "fail_slow", "hang", "sdc", "planned"} and FLOORS["fail_stop"].detect_s == 11
    assert {n for n, c in CLASSES.items() if c.severity == "critical"} == {"fail_stop", "hang", "sdc", "unknown"}
    # precedence: silent corruption explains more than a dead node, which explains more than a hang
    assert rank("sdc") > rank("fail_stop") > rank("hang") > rank("fail_slow") > rank("unknown") > rank("nothing")
