"""Helpers shared by the test tiers: where the real material lives, driving a detector, plain-JSON checks."""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn, TypeVar

import pytest

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"
REQUIRE_ENV = "GANGWATCH_REQUIRE_SERVICES"  # "1" in CI (.ci/run): everything a test needs is there

T = TypeVar("T")


def required() -> bool:
    """Whether this run promised every service, program and package the tests use (CI)."""
    return os.environ.get(REQUIRE_ENV) == "1"


def missing(why: str) -> NoReturn:
    """Something the test needs from its environment is not there: skip it saying `why`, or, under
    GANGWATCH_REQUIRE_SERVICES=1 (CI), fail it, so that a missing package, program, service or port cannot
    turn into a green run that ran nothing. Works inside a test, a fixture or at module level.

    The one rule for every environment skip of the suite (torch, py-spy, Chromium, Kafka, ClickHouse and its
    HTTP port, Slurm, Prometheus, ...). What CI does not have by design is no environment skip: a test that
    needs a real GPU is marked `gpu` and skipped without one (tests/conftest.py)."""
    if required():
        pytest.fail(f"{why} ({REQUIRE_ENV}=1: a missing requirement fails the run)", pytrace=False)
    pytest.skip(why, allow_module_level=True)


def need(thing: T, why: str) -> T:
    """`thing` when it is there (truthy); else `missing(why)`."""
    if not thing:
        missing(why)
    return thing


def need_module(name: str, why: str = "") -> ModuleType:
    """`pytest.importorskip` under the rule of `missing`: the module, or a skip (a failure in CI)."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        missing(f"{name} is not importable ({e}){': ' + why if why else ''}")


def data_path(sub: str) -> Path:
    """Real test material under `tests/data/` (see its README for what each file is and where it comes from)."""
    path = DATA / sub
    if not path.exists():
        pytest.fail(f"real test material missing: {path} (tests/data/README.md lists what belongs there)")
    return path


def drive(det: Any, recs: list, tail: float = 0.0) -> list:
    """Advance a detector to each record's time and observe it; then advance to the end and `tail` past it."""
    found = []
    for rec in recs:
        found += det.advance(rec.ts)
        found += det.observe(rec)
    if recs:
        found += det.advance(recs[-1].ts)
        found += det.advance(recs[-1].ts + tail)
    return found


def replay_core(recs: list, until: float, config: Any = None) -> Any:
    """Records through the pure core (`triage.engine.Core`) in event-time order, then event time moved on a
    second at a time to `until` (as the worker's silence timer moves it when nothing arrives), then the end of
    input. Returns the `Outputs`."""
    from gangwatch.schemas import Outputs
    from gangwatch.triage.core import Core

    core, out = Core(config), Outputs()
    for rec in sorted(recs, key=lambda r: r.ts):
        core.process(rec, out)
    now = max(r.ts for r in recs)
    while now < until:
        now = min(until, now + 1.0)
        core.advance(now, out)
    out.extend(core.finish())
    return out


def subparser(words: list[str]) -> Any:
    """The `argparse` parser of `gangwatch WORD WORD...` (e.g. ["slurm", "apply"]); fails when a word is no
    subcommand."""
    import argparse

    from gangwatch.cli import build_parser

    p = build_parser()
    for w in words:
        subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        assert subs and w in subs[0].choices, f"`{w}` is not a gangwatch command (in {p.prog})"
        p = subs[0].choices[w]
    return p
