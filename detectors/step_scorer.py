"""`StepScorer`: the base of the detectors that score closed steps (fail-slow, slowdown, SDC).

Records go into its `StepBuffer` (`buf`); each step the buffer closes goes to the detector's `_score`, by the
record path (`observe`), a batch (`observe_many`) or a run (`observe_run`), with the same findings either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from gangwatch.detectors.base import DetectorBase, SavedJob
from gangwatch.detectors.runs import RecordRun, StepColumns
from gangwatch.detectors.step_buffer import Closed, StepBuffer
from gangwatch.schemas import Finding, Record


class StepScorer(DetectorBase):
    """Base of the detectors that score whole steps: records go into `buf`, closed steps to `_score`."""

    kinds: ClassVar[frozenset[str]] = frozenset({"step"})
    buf: StepBuffer

    def observe(self, rec: Record) -> list[Finding]:
        if rec.kind != "step":
            return []
        return self._score(self.buf.add_record(rec))

    def observe_many(self, recs: Sequence[Record] | StepColumns) -> list[Finding]:
        """Batch path: the same findings as `observe` on each record in turn."""
        cols = recs if isinstance(recs, StepColumns) else StepColumns(recs)
        return self._score(self.buf.add_columns(cols))

    def observe_run(self, run: RecordRun) -> list[tuple[int, list[Finding]]]:
        """Run path: (position in the run, findings) of what `observe` on each record in turn gives."""
        pos = run.by_kind.get("step")
        if not pos:
            return []
        at: list[int] = []
        closed = self.buf.add_columns(run.steps(), at)
        out = []
        for c, i in zip(closed, at, strict=True):
            found = self._score([c])
            if found:
                out.append((pos[i], found))
        return out

    def advance(self, now: float) -> list[Finding]:
        return self._score(self.buf.expire(now))

    def _score(self, closed: list[Closed]) -> list[Finding]:
        raise NotImplementedError

    @classmethod
    def upgrade_state(cls, state: dict[str, Any] | None, version: int, job: SavedJob) -> dict[str, Any] | None:
        """Its step buffer's saved state brought up to date; a subclass adds its own part."""
        if state is not None:
            StepBuffer.upgrade_state(state["buffer"], version)
        return state
