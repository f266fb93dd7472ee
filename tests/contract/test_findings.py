"""The finding-type contract: every type a detector emits is declared once, beside it, with typed evidence and a
triage policy, and triage reads nothing else.

Checked on the registry (`detectors.catalog.REGISTRY`), so a detector added to the catalog is covered
automatically:

- every detector declares finding types, each with a `Policy` and `Evidence` dataclasses (the registration
  guard itself is tested with broken declarations: a missing policy, an onset no evidence declares, two shapes
  one object fits, two incident classes for one type);
- evidence round-trips through its dataclass: built from its annotations (with optional fields set and unset),
  encoded, read back, it is the same value and the same keys in the same order; and every finding the detectors
  emit on the contract scenarios is read back as a shape of a type its own detector declares, re-encoding to the
  very same bytes, each value of its annotated type;
- every policy answer can be computed from the declared fields alone (the evidence classes are slotted: reading
  a field they do not declare raises), for every shape;
- triage/ reads no evidence by string key (`evidence[...]`, `evidence.get(...)`, `getattr(..., "name")`), and
  a field it reads as `<typed>.evidence.<name>` is one some registered shape declares.
"""

from __future__ import annotations

import ast
import dataclasses
import types
import typing
from dataclasses import dataclass
from typing import Any, ClassVar

import orjson
import pytest
from gangwatch.detectors.catalog import DEFAULT_DETECTORS, DETECTORS, REGISTRY
from gangwatch.detectors.monitor import DEFAULT_DETECTORS as MONITOR_DETECTORS
from gangwatch.detectors.registry import FindingType, Policy, RegistrationError, Registry, Typed
from gangwatch.schemas import Finding
from gangwatch.schemas.evidence import Evidence, EvidenceMismatch, absent

from tests.contract.harness import DET_IDS, REPO, SC_IDS, reference
from tests.contract.harness import DETECTORS as HARNESS_DETECTORS

pytestmark = pytest.mark.contract

SHAPES = [(name, ft, shape) for name, fts in REGISTRY.types.items() for ft in fts for shape in ft.shapes]
SHAPE_IDS = [f"{name}:{shape.__name__}" for name, _, shape in SHAPES]


# --- the registry -------------------------------------------------------------------------------


def test_the_catalog_is_what_every_job_runs():
    assert DEFAULT_DETECTORS == MONITOR_DETECTORS == REGISTRY.detectors
    assert len(DETECTORS) == len(DEFAULT_DETECTORS) and set(HARNESS_DETECTORS.values()) == set(DEFAULT_DETECTORS)


@pytest.mark.parametrize("det_cls", DEFAULT_DETECTORS, ids=lambda c: c.name)
def test_every_detector_declares_its_finding_types(det_cls):
    assert det_cls.finding_types, f"{det_cls.__name__} declares no finding types"
    for ft in det_cls.finding_types:
        assert isinstance(ft, FindingType) and isinstance(ft.policy, Policy), ft
        assert ft.shapes and all(issubclass(s, Evidence) for s in ft.shapes), ft


@pytest.mark.parametrize("det_name", DET_IDS)
def test_findings_are_of_types_their_detector_declares(det_name):
    det_cls = HARNESS_DETECTORS[det_name]
    found = [f for sc in SC_IDS for f in reference(det_name, sc)]
    assert found, f"{det_name} found nothing in any scenario: this would check nothing"
    for f in found:
        shape, ft = REGISTRY.declaration(f)
        assert ft in det_cls.finding_types, f"{det_name} emits {f.type} as {shape.__name__}, declared elsewhere"


# --- evidence round trip ------------------------------------------------------------------------


@pytest.mark.parametrize("det_name", DET_IDS)
def test_emitted_evidence_round_trips_through_its_dataclass(det_name):
    found = [f for sc in SC_IDS for f in reference(det_name, sc)]
    assert found, f"{det_name} found nothing in any scenario: this would check nothing"
    for f in found:
        t = REGISTRY.typed(f)
        again = t.evidence.encode()
        assert list(again) == list(f.evidence), (f.type, type(t.evidence).__name__, "key order")
        assert orjson.dumps(again) == orjson.dumps(f.evidence), (f.type, type(t.evidence).__name__)
        for name in type(t.evidence).fields():
            value = getattr(t.evidence, name)
            assert conforms(value, hints(type(t.evidence))[name]), \
                f"{type(t.evidence).__name__}.{name} = {value!r} is not a {hints(type(t.evidence))[name]}"


def hints(shape: type) -> dict[str, Any]:
    return typing.get_type_hints(shape)


def conforms(value: Any, tp: Any) -> bool:
    """`value` is of annotation `tp` (ints pass for floats; Any passes)."""
    if tp is Any:
        return True
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return any(conforms(value, a) for a in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if tp is float:
        return type(value) in (float, int)
    if tp in (int, str, bool):
        return type(value) is tp
    if origin is list:
        (item,) = typing.get_args(tp)
        return type(value) is list and all(conforms(v, item) for v in value)
    if origin is dict:
        k, v = typing.get_args(tp)
        return type(value) is dict and all(conforms(a, k) and conforms(b, v) for a, b in value.items())
    raise TypeError(f"evidence annotation {tp!r} is not plain JSON")


def sample(tp: Any, *, none: bool) -> Any:
    """A value of annotation `tp`; `none`: None where the annotation allows it."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if none and type(None) in args:
            return None
        return sample(next(a for a in args if a is not type(None)), none=none)
    if tp is Any:
        return "any"
    if origin is list:
        return [sample(typing.get_args(tp)[0], none=none)]
    if origin is dict:
        return {"k": sample(typing.get_args(tp)[1], none=none)}
    return {int: 3, float: 2.5, str: "s", bool: True}[tp]


def build(shape: type[Evidence], *, none: bool) -> Evidence:
    return shape(**{f.name: sample(hints(shape)[f.name], none=none) for f in dataclasses.fields(shape)})


@pytest.mark.parametrize(("name", "ft", "shape"), SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("none", [False, True], ids=["set", "unset"])
def test_every_shape_round_trips(name, ft, shape, none):
    ev = build(shape, none=none)
    obj = ev.encode()
    assert list(obj) == [n for n in shape.fields() if not (getattr(ev, n) is None and n in shape.shape().omit)]
    back = shape.decode(orjson.loads(orjson.dumps(obj)))
    assert back == ev and type(back) is shape
    f = Finding(id="f-1", ts=100.0, job="j", type=name, detector="probe", evidence=obj)
    assert REGISTRY.declaration(f) == (shape, ft), "another shape of the type takes this object"


def test_decode_is_strict():
    @dataclass(frozen=True, slots=True, kw_only=True)
    class Probe(Evidence):
        a: int
        b: str | None = absent()

    assert Probe.decode({"a": 1}) == Probe(a=1) and Probe(a=1).encode() == {"a": 1}
    assert Probe(a=1, b="x").encode() == {"a": 1, "b": "x"}
    for bad in ({}, {"a": 1, "c": 2}):
        with pytest.raises(EvidenceMismatch):
            Probe.decode(bad)


# --- policies read declared fields only ---------------------------------------------------------


ANSWERS = ("incident_class", "verdict", "node_level", "weight", "risk", "onset_ts", "software", "slowdown_frac",
           "suspects", "grade", "label", "describe")


@pytest.mark.parametrize(("name", "ft", "shape"), SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("none", [False, True], ids=["set", "unset"])
@pytest.mark.parametrize("rank", [7, None], ids=["rank", "no-rank"])
def test_every_policy_answer_comes_from_declared_fields(name, ft, shape, none, rank):
    ev = build(shape, none=none)
    f = Finding(id="f-1", ts=100.0, job="j", type=name, detector="probe", rank=rank, node="n001",
                evidence=ev.encode())
    t = REGISTRY.typed(f)
    answers = {a: getattr(t, a) for a in ANSWERS}  # AttributeError: a rule reads a field no shape declares
    assert answers["incident_class"] in (None, "fail_stop", "fail_slow", "hang", "sdc", "unknown")
    assert 0.0 <= answers["weight"] <= 1.0 and answers["risk"] >= 0.0
    assert answers["onset_ts"] <= f.ts
    if ft.policy.job_level:
        assert answers["weight"] == 0.0 and answers["describe"]
    if ft.policy.sweep:
        assert answers["describe"]
    if ft.policy.sweep_result and ft.policy.specificity is not None:
        spec = ft.policy.specificity([t, t])
        assert len(spec) == 2 and all(0.0 <= s <= 1.0 for s in spec)


# --- triage reads evidence only through its types -----------------------------------------------


def _triage_files():
    return sorted((REPO / "triage").rglob("*.py"))


def string_keyed_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """`x.evidence["key"]`, `x.evidence.get(...)` (any dict method), the same through a name bound to
    `x.evidence`, and `getattr(x, "literal")`, in one module."""
    aliases = {t.id for node in ast.walk(tree) if isinstance(node, ast.Assign)
               and isinstance(node.value, ast.Attribute) and node.value.attr == "evidence"
               for t in node.targets if isinstance(t, ast.Name)}

    def is_evidence(x: ast.AST) -> bool:
        return (isinstance(x, ast.Attribute) and x.attr == "evidence") or (isinstance(x, ast.Name) and x.id in aliases)

    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and is_evidence(node.value) and isinstance(node.slice, ast.Constant) \
                and isinstance(node.slice.value, str):
            bad.append((node.lineno, f"evidence[{node.slice.value!r}]"))
        elif isinstance(node, ast.Attribute) and is_evidence(node.value) \
                and node.attr in ("get", "items", "keys", "values", "__getitem__", "setdefault", "pop"):
            bad.append((node.lineno, f"evidence.{node.attr}"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" \
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant):
            bad.append((node.lineno, f"getattr(..., {node.args[1].value!r})"))
    return bad


def test_triage_reads_no_evidence_by_string_key():
    bad = [f"{p.relative_to(REPO)}:{line}: {what}" for p in _triage_files()
           for line, what in string_keyed_reads(ast.parse(p.read_text()))]
    assert not bad, "triage reads evidence through typed views (detectors.catalog.typed), not keys:\n" + "\n".join(bad)


def test_triage_reads_only_declared_evidence_fields():
    declared = {n for _, _, shape in SHAPES for n in shape.fields()}
    bad = []
    for p in _triage_files():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) \
                    and node.value.attr == "evidence" and node.attr not in declared:
                bad.append(f"{p.relative_to(REPO)}:{node.lineno}: evidence.{node.attr}")
    assert not bad, "no registered evidence shape declares:\n" + "\n".join(bad)


def test_the_string_key_check_sees_them():
    src = ("def f(x, t):\n    a = x.evidence['cause']\n    b = x.evidence.get('severity')\n    ev = x.evidence\n"
           "    c = ev['name'], ev.get('count'), x.evidence[:16]\n"
           "    return getattr(t.evidence, 'whole_node'), t.evidence.whole_node\n")
    assert sorted(w for _, w in string_keyed_reads(ast.parse(src))) == sorted([
        "evidence['cause']", "evidence.get", "evidence['name']", "evidence.get", "getattr(..., 'whole_node')"])


# --- the registration guard ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class _A(Evidence):
    cause: str
    first_ts: float


@dataclass(frozen=True, slots=True, kw_only=True)
class _B(Evidence):
    cause: str
    first_ts: float
    extra_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class _Unslotted(Evidence):
    cause: str


def _detector(*fts: FindingType, name: str = "probe") -> type:
    class Probe:
        finding_types: ClassVar = fts

    Probe.name = name
    return Probe


@pytest.mark.parametrize(("fts", "why"), [
    ((), "finding_types"),
    ((FindingType("probe_x", _A, None),), "no triage Policy"),
    ((FindingType("probe_x", _A, Policy(onset="last_seen_ts")),), "onset field"),
    ((FindingType("probe_x", (_A, _B), Policy()),), "could be"),
    ((FindingType("probe_x", _Unslotted, Policy()),), "slotted"),
    ((FindingType("Probe X", _A, Policy()),), "lower_snake_case"),
    ((FindingType("probe_x", _A, Policy(incident="meltdown")),), "incident class"),
    ((FindingType("probe_x", _A, Policy(incident="unknown", job_level=True, weight=0.5)),), "job-level"),
    ((FindingType("probe_x", _A, Policy(incident="hang", sweep=True)),), "describe"),
    ((FindingType("probe_x", _A, Policy(sweep_result=True)),), "SweepEvidence"),
    ((FindingType("hw_fault", _A, Policy(incident="hang")),), "incident class"),  # hw_fault is a fail-stop's
])
def test_registration_refuses_an_incomplete_declaration(fts, why):
    reg = Registry()
    for det in REGISTRY.detectors:
        reg.register(det)
    with pytest.raises(RegistrationError, match=why):
        reg.register(_detector(*fts))
    assert reg.detectors == REGISTRY.detectors  # nothing half-registered


def test_an_unregistered_type_or_shape_is_an_error_not_a_weight_of_zero():
    from gangwatch.detectors.registry import UnknownFindingType

    with pytest.raises(UnknownFindingType):
        REGISTRY.typed(Finding(id="f", ts=1.0, job="j", type="meteor_strike", detector="sky"))
    with pytest.raises(EvidenceMismatch):
        REGISTRY.typed(Finding(id="f", ts=1.0, job="j", type="hang", detector="hang.progress", evidence={}))


def test_a_detector_registers_its_types_with_it():
    reg = Registry()
    probe = _detector(FindingType("probe_x", _A, Policy(incident="hang", weight=0.5, onset="first_ts")))
    assert reg.register(probe) is probe and reg.register(probe) is probe  # once
    t = reg.typed(probe.finding_types[0].finding(ts=10.0, job="j", detector="probe", key=1, node="n1",
                                                  evidence=_A(cause="c", first_ts=4.0)))
    assert isinstance(t, Typed) and (t.incident_class, t.weight, t.onset_ts) == ("hang", 0.5, 4.0)
    with pytest.raises(TypeError):
        probe.finding_types[0].finding(ts=10.0, job="j", detector="probe", key=1, evidence=_B(cause="c", first_ts=1))
