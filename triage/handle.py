"""What `Triage`'s collaborators (`triage.stragglers.Stragglers`, `triage.diagnose.ActiveDiagnosis`) may do to and
read of the job's triage: the whole contract between them, typed.

They decide; `Triage` holds the job's state and carries decisions out. A collaborator has the guards review its
decisions, acts only through `act` (which records the action on its incident, sends or shadows it, and keeps the
job's books: spares used, nodes evicted, kept running or being replaced), reads the few things listed here, and
hands an incident back through `await_controller`, `done_asking` and `let_go`. `Triage` implements it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from typing import Protocol

from gangwatch.detectors.registry import Typed
from gangwatch.detectors.topology import Topology
from gangwatch.schemas import Outputs
from gangwatch.triage.budgets import TriageConfig
from gangwatch.triage.decide import Decision
from gangwatch.triage.incident import Timeline
from gangwatch.triage.profile import NodeProfile
from gangwatch.triage.safety import Guards


class TriageHandle(Protocol):
    """The job's triage as its collaborators see it."""

    @property
    def job(self) -> str: ...

    @property
    def config(self) -> TriageConfig: ...

    @property
    def topo(self) -> Topology | None: ...

    @property
    def guards(self) -> Guards: ...  # `review` decisions before acting; `give_back` evictions shown wrong

    @property
    def max_step(self) -> int: ...  # the newest step seen: a decision's `stall_step`

    @property
    def gathered(self) -> Sequence[Typed]: ...  # the open incident's findings

    @property
    def profiles(self) -> Mapping[str, NodeProfile]: ...

    @property
    def replacing(self) -> Set[str]: ...  # nodes evicted since the job (re)started

    def act(self, d: Decision, now: float, evidence: list[str], out: Outputs, inc: Timeline | None = None,
            results: dict[str, str] | None = None) -> None:
        """Carry out `d` for `inc` (the open incident when None): its action, sent or shadowed."""

    def summarize(self, of: Sequence[Typed] | None = None) -> str:
        """One line of what the findings (the open incident's when None) say, for a reason."""

    def spares_left(self) -> int | None:
        """Warm spares left for hot replacements (None: unlimited)."""

    def pool(self) -> str:
        """The spare pool's state in words, for a reason ("" when there is nothing to say)."""

    def await_controller(self, inc: Timeline) -> None:
        """`inc` is decided and its job trains on: it waits for the controller's word (the newest few are kept)."""

    def done_asking(self, inc: Timeline) -> None:
        """`inc` got its answer (or gave up on it): once its job has recovered it waits no more."""

    def let_go(self) -> None:
        """The open incident is decided and handed on: no incident is open, no evidence gathered."""
