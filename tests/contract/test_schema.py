"""Wire contract v1: every kind round-trips, and bad input always becomes a typed error."""

from __future__ import annotations

import copy
import json
import math

import orjson
import pytest
from gangwatch.schemas import KINDS, DecodeError, Step, decode, encode, encode_batch, to_dict
from gangwatch.schemas.jsonschema import export
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.contract.samples import SAMPLES

pytestmark = pytest.mark.contract


def test_every_kind_has_a_sample():
    assert set(SAMPLES) == set(KINDS)


@pytest.mark.parametrize("kind", sorted(SAMPLES))
def test_round_trip(kind):
    wire = SAMPLES[kind]
    [rec] = decode(orjson.dumps(wire))
    assert not isinstance(rec, DecodeError), rec
    assert type(rec) is KINDS[kind]
    assert to_dict(rec) == wire
    [again] = decode(encode(rec))
    assert again == rec


@pytest.mark.parametrize("kind", sorted(SAMPLES))
def test_unknown_fields_are_kept(kind):
    wire = {**SAMPLES[kind], "x_site": "dc-3", "x_nested": {"a": [1, 2]}}
    [rec] = decode(orjson.dumps(wire))
    assert rec.extra == {"x_site": "dc-3", "x_nested": {"a": [1, 2]}}
    assert orjson.loads(encode(rec)) == wire


def test_batch_unpacks_every_item_in_order():
    items = [SAMPLES["heartbeat"], SAMPLES["step"], {**SAMPLES["heartbeat"], "rank": "seven"}]
    out = decode(orjson.dumps({"kind": "batch", "v": 1, "ts": 1.0, "items": items}))
    assert [type(x).__name__ for x in out] == ["Heartbeat", "Step", "DecodeError"]
    assert out[2].field == "items[2].rank" and out[2].index == 2


def test_encode_batch_round_trips():
    recs = [r for r in (decode(orjson.dumps(SAMPLES[k]))[0] for k in ("step", "heartbeat", "gpu"))]
    assert decode(encode_batch(recs, ts=5.0)) == recs


def test_nan_loss_travels_as_string_and_python_nan_token_is_accepted():
    [rec] = decode(orjson.dumps({**SAMPLES["step"], "loss": "NaN", "grad_norm": "Infinity"}))
    assert math.isnan(rec.loss) and rec.grad_norm == math.inf
    assert b'"loss":"NaN"' in encode(rec)
    [rec2] = decode(json.dumps({**SAMPLES["step"], "loss": float("nan")}))  # Python's json writes NaN
    assert isinstance(rec2, Step) and math.isnan(rec2.loss)


@pytest.mark.parametrize("field,value,reason", [
    ("ts", float("nan"), "NaN"),
    ("step_s", float("inf"), "NaN or infinity"),
    ("step_s", -1.0, ">= 0"),
    ("rank", True, "integer"),
    ("rank", 1.5, "integer"),
    ("rank", 2**70, "64-bit"),
    ("job", "x" * 300, "longer than"),
    ("job", None, "required field is null"),
    ("v", 2, "version"),
    ("kind", "telepathy", "unknown kind"),
])
def test_bad_field_names_field_and_reason(field, value, reason):
    wire = {**SAMPLES["step"], field: value}
    [err] = decode(json.dumps(wire))
    assert isinstance(err, DecodeError)
    assert reason in err.reason
    assert err.field == field


def test_missing_required_field():
    wire = dict(SAMPLES["step"])
    del wire["step_s"]
    [err] = decode(orjson.dumps(wire))
    assert isinstance(err, DecodeError) and err.field == "step_s" and "required" in err.reason


def test_enum_violation():
    [err] = decode(orjson.dumps({**SAMPLES["framework"], "type": "coffee_break"}))
    assert isinstance(err, DecodeError) and err.field == "type" and "one of" in err.reason


def test_nested_error_path():
    wire = copy.deepcopy(SAMPLES["job"])
    wire["ranks"][1]["node"] = 7
    [err] = decode(orjson.dumps(wire))
    assert err.field == "ranks[1].node"


@pytest.mark.parametrize("data", [b"", b"\xff\xfe\x00", b"[1,2]", b'"str"', b"{", b"null", b"{}" * 3])
def test_not_an_object(data):
    [err] = decode(data)
    assert isinstance(err, DecodeError) and err.reason


def test_schema_export_writes_every_kind(tmp_path):
    paths = export(tmp_path)
    names = {p.name for p in paths}
    assert names == {f"{k}.schema.json" for k in [*KINDS, "batch"]}
    step = orjson.loads((tmp_path / "step.schema.json").read_bytes())
    assert set(step["required"]) == {"kind", "v", "ts", "job", "rank", "step", "step_s"}
    assert orjson.loads((tmp_path / "incident.schema.json").read_bytes())["properties"]["class"]["enum"]


# --- property tests: malformed input never escapes as an exception, never vanishes ----------------

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=50),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@st.composite
def _mutated(draw):
    kind = draw(st.sampled_from(sorted(SAMPLES)))
    wire = copy.deepcopy(SAMPLES[kind])
    ops = draw(st.lists(st.sampled_from(["delete", "retype", "nan", "huge", "version", "extra"]), min_size=1,
                        max_size=3))
    for op in ops:
        keys = sorted(wire)
        key = draw(st.sampled_from(keys))
        if op == "delete":
            wire.pop(key, None)
        elif op == "retype":
            wire[key] = draw(_json_values)
        elif op == "nan":
            wire[key] = float("nan")
        elif op == "huge":
            wire[key] = "x" * draw(st.integers(min_value=300, max_value=70_000))
        elif op == "version":
            wire["v"] = draw(st.one_of(st.integers(), st.text(max_size=3), st.none()))
        else:
            wire[draw(st.text(min_size=1, max_size=10))] = draw(_json_values)
    return wire


@settings(max_examples=400, deadline=None)
@given(_mutated())
def test_mutated_records_yield_a_record_or_a_typed_error(wire):
    out = decode(json.dumps(wire))  # json writes NaN tokens, like a sloppy Python producer
    assert len(out) == 1
    [res] = out
    if isinstance(res, DecodeError):
        assert res.reason
    else:  # accepted: then it must survive a round trip
        assert orjson.loads(encode(res)) is not None


@settings(max_examples=200, deadline=None)
@given(st.lists(_mutated(), min_size=0, max_size=6))
def test_batch_of_mutated_records_loses_nothing(items):
    out = decode(json.dumps({"kind": "batch", "v": 1, "ts": 1.0, "items": items}))
    assert len(out) == len(items)
    for i, res in enumerate(out):
        if isinstance(res, DecodeError):
            assert res.index == i


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_never_raise(data):
    out = decode(data)
    assert len(out) >= 1
    assert all(isinstance(x, DecodeError) or type(x) in KINDS.values() for x in out)


def test_an_integer_beyond_64_bits_fails_its_own_field_not_the_batch_and_never_the_encoder():
    """Python's json (the fallback for NaN tokens) reads any integer; orjson cannot write one beyond 64 bits."""
    big = "-9223372036854775809"
    [ok] = decode(f'{{"kind": "heartbeat", "v": 1, "ts": 1.0, "job": "j", "rank": 1, "w": NaN, "x": [{big}]}}')
    assert orjson.loads(encode(ok))["x"] == [float(big)]
    items = (f'{{"kind": "heartbeat", "v": 1, "ts": 1.0, "job": "j", "rank": {big}, "w": NaN}}',
             '{"kind": "heartbeat", "v": 1, "ts": 1.0, "job": "j", "rank": 2}')
    bad, good = decode('{{"kind": "batch", "v": 1, "ts": 1.0, "items": [{}, {}]}}'.format(*items))
    assert isinstance(bad, DecodeError) and bad.field == "items[0].rank" and good.rank == 2
