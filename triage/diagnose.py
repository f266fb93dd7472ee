"""Active diagnosis: what triage asks the controller to run when passive evidence is not enough.

Three answers come back as `recovery` records of the action that asked:

- **Dual run** (SDC): after `rollback` + `isolate`, the `dual_run` action asks the controller to run the same
  step (same weights, same input) on each suspect and on a reference machine and report each one's digest
  (`dual_run_result`, `digests`, `reference`). Equal digests clear a suspect (it is readmitted and the incident
  closes as `not_confirmed`); a different one confirms the SDC (the node stays out and the incident keeps the
  digests as its proof). A missing digest, or no answer within `dual_run_timeout_s`, goes to a human.
- **Replay** (a fault nobody can be blamed for): `triage.replayplan` plans which machine groups replay the job's
  step, phase by phase; each `replay_result` says which groups failed, and the failing groups intersect into the
  culprit.
- **The escalation ladder**, when localization fails: evict the smallest group holding every suspect (when the
  blast-radius guard allows), else restart the job and watch for the fault to come back, else replay, else a
  human. Each rung tried is recorded on the incident with when it was tried, against the localize budget.
  A `stall` (every rank waited alike past its budget, nobody named) skips the restart: whatever the whole job
  waits on (a filesystem, a long save) a restart would not cure, and it would lose the work since the last save.

Pure: the records in, verdicts and decisions out; `triage.job` keeps the state.
"""

from __future__ import annotations

from dataclasses import dataclass

from gangwatch.schemas import Recovery

RUNGS = ("group", "restart", "replay", "human")


@dataclass(frozen=True)
class DualRunVerdict:
    """What a dual run's digests say of each suspect."""

    cleared: tuple[str, ...]  # digest equal to the reference's
    confirmed: tuple[str, ...]  # digest different from the reference's
    missing: tuple[str, ...]  # no digest came back (or no reference): nothing can be said
    reference: str | None
    proof: dict[str, str]  # node -> digest, the reference's included

    @property
    def conclusive(self) -> bool:
        return not self.missing


def judge_dual_run(suspects: tuple[str, ...] | list[str], rec: Recovery) -> DualRunVerdict:
    """Compare each suspect's digest with the reference machine's (`rec.reference`, else the one machine in
    `rec.digests` that is no suspect)."""
    digests = {str(k): str(v) for k, v in (rec.digests or {}).items() if v not in (None, "")}
    ref = rec.reference
    if ref is None:
        others = sorted(set(digests) - set(suspects))
        ref = others[0] if len(others) == 1 else None
    want = digests.get(ref) if ref is not None else None
    cleared, confirmed, missing = [], [], []
    for n in suspects:
        got = digests.get(n)
        if got is None or want is None:
            missing.append(n)
        elif got == want:
            cleared.append(n)
        else:
            confirmed.append(n)
    return DualRunVerdict(tuple(cleared), tuple(confirmed), tuple(missing), ref, digests)


def describe_dual_run(v: DualRunVerdict) -> str:
    """One line for a reason: what the digests showed."""
    ref = f"reference {v.reference} {v.proof.get(v.reference, '?')[:12]}" if v.reference else "no reference digest"
    parts = [f"{n} {v.proof[n][:12]} {'==' if n in v.cleared else '!='}" for n in (*v.cleared, *v.confirmed)]
    parts += [f"{n} no digest" for n in v.missing]
    return f"dual run: {'; '.join(parts)} {ref}"


def rungs_said(rungs: list[dict]) -> str:
    """The rungs tried so far, for a human's page: `group refused (blast radius) at +12 s; restart at +15 s`."""
    return "; ".join(f"{r['rung']} {r.get('outcome', 'tried')} at +{r['after_s']:.0f} s" for r in rungs) or "none"
