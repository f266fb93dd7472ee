"""Helpers shared by the test tiers: where the real material lives, driving a detector, plain-JSON checks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"


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
