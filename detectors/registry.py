"""Finding types, declared once beside the detector that emits them, and the registry triage reads them from.

A detector declares each finding type it emits as a `FindingType`: the type's
name on the wire, its evidence (one or more `Evidence` dataclasses, see
`schemas.evidence`) and its triage `Policy`. The detector lists them in its
`finding_types` and builds its findings through them (`FINDING.finding(...)`),
so a finding cannot carry evidence its type does not declare.

    HANG = FindingType("hang", HangEvidence, Policy(incident="hang", onset="last_progress_ts", sweep=True, ...))

    class HangDetector:
        finding_types = (HANG,)

Registering a detector (`Registry.register`, done for every detector of
`detectors.catalog`) registers its finding types, and checks them: a type
without a policy, a policy rule that names a field no evidence declares, two
shapes of one type that the same object would fit, two detectors declaring one
type with different incident classes, all fail at import. Triage, localization
and the node profile then ask a finding's `Typed` view (`Registry.typed(f)`)
instead of keeping tables of their own: the class it opens, its weight, its
onset, ... A type nobody registered, or evidence no declared shape fits, is an
error, never a silent weight of 0.

A policy answer is a constant or a function of the finding and its typed
evidence (`lambda f, ev: 0.9 if ev.whole_node else 0.7`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from gangwatch.detectors.base import finding
from gangwatch.detectors.sweeps import SweepEvidence
from gangwatch.schemas import Finding
from gangwatch.schemas.classes import CLASSES
from gangwatch.schemas.evidence import Evidence, EvidenceMismatch

T = TypeVar("T")
Rule = Any  # T | Callable[[Finding, Evidence], T]
INCIDENT_CLASSES = tuple(n for n, c in CLASSES.items() if c.opened_by_findings)  # classes a finding may open
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


@dataclass(frozen=True)
class Policy:
    """How triage treats the findings of one declaration: each answer a constant or `(finding, evidence) -> answer`.

    `incident` and `opens`: the incident class the finding opens, or raises an open incident to (a hang found
    to be a dead node becomes a fail-stop); `opens` False for this finding (a precursor, a blip) means it only
    joins an open incident as evidence. With `incident` None it never opens one.
    `verdict`: it names its node on its own (a dead node, a fatal Xid): arriving after the decision, the
    incident is decided again for it. Otherwise it corroborates.
    `node_level`: it is about the machine, not one rank's software: it outranks a sweep's group of suspects.
    `weight`: how strongly it points at its node for localization (0: not at all); weights of one node combine
    as `1 - prod(1 - w)`. `risk`: what it adds to its node's risk score (decayed over event time).
    `onset`: the evidence field holding when the fault began (None, or a shape without it: the finding's ts).
    `job_level`: a fact about the whole job (never evidence against a node): escalated, saying `describe`.
    `sweep`: opening an incident asks for a stack + flight-recorder sweep, saying `describe`.
    `sweep_result`: the analysis of one finished sweep (its evidence is `SweepEvidence`): decide right after
    it; only the most specific suspects of a sweep count (`specificity`: per finding of one sweep and one
    declaration, 1 for the most specific).
    `software`: a process failed in software (exit, exception, OOM): restarting it in place may do.
    `slowdown_frac`: a straggler's cost, the fraction by which it slows the job (None: not a straggler).
    `slow_floor`: with a straggler, what the ranks not flagged add to the job's step (heterogeneous or merely
    noisy ones): replacing stragglers gains only down to it. `explains_slow`: hardware evidence of its node
    that explains a straggler there (throttling, a degrading link): a straggler it corroborates in the same
    window is decided without waiting for the full hysteresis hold.
    `root_cause`: a sweep's result that names a root cause on its own (nothing it waits for is itself a
    suspect): several of them are several culprits, each named, not one culprit somewhere in a group.
    `suspects`: weak suspects `(ranks, nodes)`, used only when nothing else names a culprit.
    `signature`: a software failure's signature (cause, rank, message without its numbers): the same one
    recurring after a restart with no progress is a crash loop, one incident.
    `withdraws`: the id of an earlier finding this one shows wrong (a late record of a rank reported silent):
    triage takes it out of its incident, cancels what was not decided yet, and gives an eviction back.
    `job_state`: the state of the job's life it reports (`detectors.life`): no fault, never gathered as
    evidence; triage keeps it to know when the job's silence is expected.
    `frozen`: a rank alive but frozen (stopped, traced, in uninterruptible sleep, as its node's agent sees it):
    it names the rank a stall waits on, and its node, but evicts nothing on its own; the stall waits for it to
    thaw up to `stall_budget_s`, then a human is told who is frozen and how, saying `describe`.
    `evicts`: False where it names its node but what it saw has an innocent reading too (a job of one node
    silent with its agent: the node lost, or the job ended without a word): the node is named, and a human
    decides, told `describe`.
    `waits`: how long the decision of an incident it opens waits (one of `schemas.classes.WAITS`), where not
    its class's (None): a node's silence that only the stream saw waits for late records.
    `grade`: a finer grade kept in the node profile (hardware severity). `label`: how an incident's summary
    names it (default: the type).
    """

    incident: str | None = None
    opens: Rule = True
    verdict: Rule = False
    node_level: Rule = False
    weight: Rule = 0.0
    risk: Rule = 0.1
    onset: str | None = None
    job_level: bool = False
    sweep: bool = False
    sweep_result: bool = False
    specificity: Callable[[Sequence[Typed]], list[float]] | None = None
    software: Rule = False
    slowdown_frac: Rule | None = None
    slow_floor: Rule | None = None
    explains_slow: Rule = False
    root_cause: Rule = False
    suspects: Rule | None = None
    signature: Rule | None = None
    withdraws: Rule | None = None
    job_state: Rule | None = None
    frozen: bool = False
    evicts: Rule = True
    waits: Rule | None = None
    grade: Rule | None = None
    label: Rule | None = None
    describe: Rule | None = None


@dataclass(frozen=True)
class FindingType:
    """One finding type as one detector emits it: wire name, evidence shape(s), triage policy."""

    name: str
    evidence: type[Evidence] | tuple[type[Evidence], ...]
    policy: Policy

    def __post_init__(self) -> None:
        if not isinstance(self.evidence, tuple):
            object.__setattr__(self, "evidence", (self.evidence,))

    @property
    def shapes(self) -> tuple[type[Evidence], ...]:
        return self.evidence  # type: ignore[return-value]

    def finding(self, *, evidence: Evidence, **kw: Any) -> Finding:
        """A finding of this type (see `detectors.base.finding` for the other arguments)."""
        if type(evidence) not in self.shapes:
            raise TypeError(f"{self.name} findings carry {[c.__name__ for c in self.shapes]} evidence, "
                            f"not {type(evidence).__name__}")
        return finding(type=self.name, evidence=evidence.encode(), **kw)


def _ask(rule: Any, f: Finding, ev: Evidence) -> Any:
    return rule(f, ev) if callable(rule) else rule


@dataclass(frozen=True, slots=True)
class Typed:
    """A finding with its evidence read back as its declared dataclass, and the policy of that declaration."""

    finding: Finding
    evidence: Evidence
    declared: FindingType

    @property
    def policy(self) -> Policy:
        return self.declared.policy

    def _ask(self, rule: Any) -> Any:
        return _ask(rule, self.finding, self.evidence)

    @property
    def incident_class(self) -> str | None:
        """The incident class this finding opens or raises an open incident to (None: it only joins one)."""
        p = self.policy
        return p.incident if p.incident is not None and self._ask(p.opens) else None

    @property
    def verdict(self) -> bool:
        return bool(self._ask(self.policy.verdict))

    @property
    def node_level(self) -> bool:
        return bool(self._ask(self.policy.node_level))

    @property
    def weight(self) -> float:
        return float(self._ask(self.policy.weight))

    @property
    def risk(self) -> float:
        return float(self._ask(self.policy.risk))

    @property
    def onset_ts(self) -> float:
        """When the fault began, as far as this finding tells (never after the finding itself)."""
        name = self.policy.onset
        v = getattr(self.evidence, name, None) if name else None
        return min(float(v), self.finding.ts) if isinstance(v, (int, float)) else self.finding.ts

    @property
    def software(self) -> bool:
        return bool(self._ask(self.policy.software))

    @property
    def slowdown_frac(self) -> float | None:
        rule = self.policy.slowdown_frac
        return None if rule is None else self._ask(rule)

    @property
    def slow_floor(self) -> float:
        rule = self.policy.slow_floor
        return 0.0 if rule is None else float(self._ask(rule))

    @property
    def explains_slow(self) -> bool:
        return bool(self._ask(self.policy.explains_slow))

    @property
    def root_cause(self) -> bool:
        return bool(self._ask(self.policy.root_cause))

    @property
    def suspects(self) -> tuple[list[int], list[str]] | None:
        rule = self.policy.suspects
        return None if rule is None else self._ask(rule)

    @property
    def signature(self) -> str | None:
        rule = self.policy.signature
        return None if rule is None else self._ask(rule)

    @property
    def withdraws(self) -> str | None:
        rule = self.policy.withdraws
        return None if rule is None else self._ask(rule)

    @property
    def job_state(self) -> str | None:
        rule = self.policy.job_state
        return None if rule is None else self._ask(rule)

    @property
    def frozen(self) -> bool:
        return self.policy.frozen

    @property
    def evicts(self) -> bool:
        return bool(self._ask(self.policy.evicts))

    @property
    def waits(self) -> str | None:
        rule = self.policy.waits
        return None if rule is None else self._ask(rule)

    @property
    def grade(self) -> str | None:
        rule = self.policy.grade
        return None if rule is None else self._ask(rule)

    @property
    def label(self) -> str:
        rule = self.policy.label
        return self.finding.type if rule is None else str(self._ask(rule))

    @property
    def describe(self) -> str | None:
        rule = self.policy.describe
        return None if rule is None else str(self._ask(rule))


class UnknownFindingType(KeyError):
    """A finding whose type no registered detector declares."""


class RegistrationError(TypeError):
    """A detector's finding types are incomplete or contradict what is registered."""


class Registry:
    """The detectors, and every finding type they emit with its shapes and policies."""

    def __init__(self) -> None:
        self.detectors: tuple[type, ...] = ()
        self._shapes: dict[str, list[tuple[type[Evidence], FindingType]]] = {}

    @classmethod
    def of(cls, detectors: Iterable[type]) -> Registry:
        """A registry of these detector classes, in that order."""
        reg = cls()
        for det_cls in detectors:
            reg.register(det_cls)
        return reg

    @property
    def types(self) -> dict[str, tuple[FindingType, ...]]:
        """Every registered type name -> its declarations (one per detector that emits it)."""
        out: dict[str, tuple[FindingType, ...]] = {}
        for name, shapes in self._shapes.items():
            out[name] = tuple(dict.fromkeys(ft for _, ft in shapes))
        return out

    def register(self, det_cls: type) -> type:
        """Register a detector class and its finding types (checked); returns the class."""
        if det_cls in self.detectors:
            return det_cls
        declared = getattr(det_cls, "finding_types", None)
        if not declared or not all(isinstance(ft, FindingType) for ft in declared):
            raise RegistrationError(f"{det_cls.__name__}: `finding_types` must list its FindingType declarations")
        if any(getattr(d, "name", None) == getattr(det_cls, "name", None) for d in self.detectors):
            raise RegistrationError(f"{det_cls.__name__}: detector name {det_cls.name!r} is taken")
        staged = {name: list(shapes) for name, shapes in self._shapes.items()}
        for ft in declared:
            _check(ft)
            others = staged.setdefault(ft.name, [])
            for _, other in others:
                if (other.policy.incident, other.policy.job_level) != (ft.policy.incident, ft.policy.job_level):
                    raise RegistrationError(f"{ft.name}: declared with incident class {ft.policy.incident!r} "
                                            f"here, {other.policy.incident!r} elsewhere")
            for shape in ft.shapes:
                if any(shape is s for s, _ in others):
                    raise RegistrationError(f"{ft.name}: {shape.__name__} declared twice")
                for s, _ in others:
                    if _overlap(shape, s):
                        raise RegistrationError(f"{ft.name}: one evidence object could be {shape.__name__} or "
                                                f"{s.__name__}; give one a key of its own")
                others.append((shape, ft))
        self._shapes = staged
        self.detectors = (*self.detectors, det_cls)
        return det_cls

    def declaration(self, f: Finding) -> tuple[type[Evidence], FindingType]:
        """The shape that wrote `f.evidence` and the declaration it belongs to."""
        shapes = self._shapes.get(f.type)
        if shapes is None:
            raise UnknownFindingType(f"finding type {f.type!r} (detector {f.detector!r}) is not registered: "
                                     "list its detector in detectors/catalog.py")
        for shape, ft in shapes:
            if shape.fits(f.evidence):
                return shape, ft
        raise EvidenceMismatch(f"{f.type} finding {f.id} (detector {f.detector!r}): evidence keys "
                               f"{sorted(f.evidence)} fit none of {[s.__name__ for s, _ in shapes]}")

    def typed(self, f: Finding) -> Typed:
        shape, ft = self.declaration(f)
        return Typed(f, shape.decode(f.evidence), ft)


def _overlap(a: type[Evidence], b: type[Evidence]) -> bool:
    """Whether one object could fit both shapes (all required keys of both, no key either lacks)."""
    sa, sb = a.shape(), b.shape()
    return (sa.required | sb.required) <= (sa.allowed & sb.allowed)


def _check(ft: FindingType) -> None:
    """A declaration is complete and names only fields its evidence declares."""
    where = f"finding type {ft.name!r}"
    if not _NAME.match(ft.name):
        raise RegistrationError(f"{where}: a type name is lower_snake_case, at most 64 characters")
    if not isinstance(ft.policy, Policy):
        raise RegistrationError(f"{where}: no triage Policy")
    p = ft.policy
    for shape in ft.shapes:
        if not (isinstance(shape, type) and issubclass(shape, Evidence) and dataclasses.is_dataclass(shape)):
            raise RegistrationError(f"{where}: {shape!r} is not an Evidence dataclass")
        slotted = all("__slots__" in k.__dict__ for k in shape.__mro__[:-1])
        if not (shape.__dataclass_params__.frozen and slotted):  # type: ignore[attr-defined]
            raise RegistrationError(f"{where}: {shape.__name__} must be a frozen, slotted dataclass")
    if p.incident is not None and p.incident not in INCIDENT_CLASSES:
        raise RegistrationError(f"{where}: incident class {p.incident!r} is not one of {INCIDENT_CLASSES}")
    if p.onset is not None and not any(p.onset in s.fields() for s in ft.shapes):
        raise RegistrationError(f"{where}: onset field {p.onset!r} is declared by none of its evidence shapes")
    if p.job_level and (p.weight != 0.0 or p.describe is None):
        raise RegistrationError(f"{where}: a job-level finding lends no weight to a node and says what it means "
                                "(describe)")
    if p.sweep and p.describe is None:
        raise RegistrationError(f"{where}: asking for a sweep needs a `describe` (the reason the action gives)")
    if p.frozen and p.describe is None:
        raise RegistrationError(f"{where}: a frozen rank's finding says who is frozen and how (describe)")
    if p.sweep_result and not all(issubclass(s, SweepEvidence) for s in ft.shapes):
        raise RegistrationError(f"{where}: the result of a sweep carries SweepEvidence (its snapshot)")
