"""Active diagnosis on the job's machines: a `replay` phase's groups and a `dual_run`'s runs, each a small gang.

    trial = Trial.replay(spec, action, resume_from=latest(spec.ckpt_dir), steps=1, timeout_s=300.0)
    while not trial.poll(time.monotonic()):   # one look: which runs exited, which ran past the deadline
        time.sleep(0.5)
    trial.results()                            # {group id: "pass" | "fail"}

A run is the job itself, launched by the launcher (control/launcher.py) on a
few of its nodes with two more variables of its protocol: the ranks run
`GANGWATCH_REPLAY_STEPS` steps from the checkpoint in `GANGWATCH_RESUME_FROM`
and exit 0, writing no checkpoint and sending no telemetry; with
`GANGWATCH_DIGEST_OUT` rank 0 then writes there the sha256 (hex) of every
rank's parameters (examples/tiny_job/train.py follows both). Each run is a job
of its own to everything outside it (`<job>-<kind>-<key>`: its rendezvous, the
node agents, a trainer's spool), keeps its files under
`<run dir>/<kind>-<action id>/<key>/` (logs, progress, a scratch checkpoint
directory: nothing of the job's own is touched) and is never restarted.

| kind       | runs                                                   | outcome of a run                      |
|------------|--------------------------------------------------------|---------------------------------------|
| `replay`   | one per group of the action's `extra.groups`, on the   | `pass`: every torchrun exited 0;      |
|            | group's nodes (the ranks they ran, as a smaller job:   | `fail`: one exited otherwise (the     |
|            | same TP and PP, DP the group's `dp`), all at once      | rest is stopped), or the run was      |
|            | (a phase's groups share no node)                       | still going at the deadline (killed)  |
| `dual_run` | one per suspect and one on the reference machine, each | its digest, when it passed and wrote  |
|            | node alone, all at once                                | one                                   |

Every run of a trial shares one deadline, `timeout_s` after the trial starts.
A run that cannot even start (torchrun exits before its rendezvous listens)
fails at once.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from gangwatch.control.launcher import Gang, JobSpec
from gangwatch.schemas import Action

log = logging.getLogger("gangwatch.controller")

PASS, FAIL = "pass", "fail"
REPLAY_STEPS_ENV = "GANGWATCH_REPLAY_STEPS"
DIGEST_ENV = "GANGWATCH_DIGEST_OUT"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_DIGEST_MAX = 256  # characters: an ID of the contract

MakeGang = Callable[..., Gang]  # Gang(spec, nodes, resume_from, attempt), or a stand-in


@dataclass(frozen=True)
class ReplayGroup:
    """One group of a replay phase: `nodes` run one pipeline of the job (its data-parallel size, `dp` in the
    action, follows from how many ranks they run: the launcher starts each node's ranks as in the job)."""

    id: str
    nodes: tuple[str, ...]


def replay_groups(a: Action) -> list[ReplayGroup]:
    """The groups of a `replay` action (`extra.groups`, as triage/rerun_plan.py's `Phase.to_json` writes them); a
    ValueError saying what is wrong when there are none, or one has no id or no node, or two share an id."""
    raw = a.extra.get("groups")
    if not isinstance(raw, list) or not raw:
        raise ValueError(f"replay {a.id} names no groups (extra.groups); nothing to run")
    groups = []
    for g in raw:
        nodes = g.get("nodes") if isinstance(g, dict) else None
        if not isinstance(nodes, list) or not nodes or not str(g.get("id") or ""):
            raise ValueError(f"replay {a.id}: group {g!r} needs an id and a list of nodes")
        groups.append(ReplayGroup(str(g["id"]), tuple(map(str, nodes))))
    if len({g.id for g in groups}) != len(groups):
        raise ValueError(f"replay {a.id}: two groups share an id; each group's result is reported by its id")
    return groups


@dataclass
class Run:
    """One small launch of the job: `key` (a replay group's id, or a dual run's node) on `nodes`."""

    key: str
    nodes: tuple[str, ...]
    gang: Gang
    digest_file: Path | None  # where rank 0 writes the digest (dual runs)
    outcome: str | None = None  # PASS or FAIL once over
    digest: str | None = None  # what it wrote, when it passed

    def poll(self, now: float, deadline: float) -> None:
        """Settle the outcome once every torchrun exited 0, one exited otherwise, or `now` passed `deadline`."""
        if self.outcome is not None:
            return
        codes = self.gang.returncodes()
        if any(c not in (None, 0) for c in codes.values()):
            log.warning("%s on %s failed: exit codes %s", self.key, ", ".join(self.nodes), codes)
            self.end(FAIL)
        elif all(c == 0 for c in codes.values()):
            self.digest = self._read_digest()
            self.end(PASS)
        elif now >= deadline:
            log.warning("%s on %s still running at its deadline: killed, failed", self.key, ", ".join(self.nodes))
            self.end(FAIL)

    def end(self, outcome: str) -> None:
        """Settle the outcome and kill what is left of the run."""
        self.outcome = outcome
        self.gang.stop(0.0)  # what is left of it (a hung rank, its peers, their loader workers) is killed now

    def _read_digest(self) -> str | None:
        if self.digest_file is None:
            return None
        try:
            text = self.digest_file.read_text().strip()
        except OSError:
            log.warning("%s exited 0 without writing its digest to %s", self.key, self.digest_file)
            return None
        return text if 0 < len(text) <= _DIGEST_MAX else None


class Trial:
    """The runs one action asked for, started together; over when each run has an outcome."""

    def __init__(self, action: Action, kind: str, runs: list[Run], deadline: float,
                 reference: str | None = None) -> None:
        self.action, self.kind, self.runs, self.deadline, self.reference = action, kind, runs, deadline, reference

    @classmethod
    def replay(cls, spec: JobSpec, action: Action, resume_from: Path | None, steps: int, timeout_s: float,
               now: float, gang: MakeGang = Gang) -> Trial:
        """Every group of the replay `action` (`replay_groups`) started at once, `steps` steps from `resume_from`."""
        runs = [_start(spec, "replay", action, g.id, g.nodes, resume_from, steps, gang, digest=False)
                for g in replay_groups(action)]
        return cls(action, "replay", runs, now + timeout_s)

    @classmethod
    def dual_run(cls, spec: JobSpec, action: Action, suspects: Sequence[str], reference: str,
                 resume_from: Path | None, timeout_s: float, now: float, gang: MakeGang = Gang) -> Trial:
        """One step from `resume_from` on each suspect and on `reference`, each node alone, all at once."""
        nodes = [*dict.fromkeys(n for n in suspects if n != reference), reference]
        runs = [_start(spec, "dual_run", action, n, (n,), resume_from, 1, gang, digest=True) for n in nodes]
        return cls(action, "dual_run", runs, now + timeout_s, reference)

    def poll(self, now: float) -> bool:
        """Look at every run once (`now`: the clock the deadline is on); True once every run is over."""
        for run in self.runs:
            run.poll(now, self.deadline)
        return all(run.outcome is not None for run in self.runs)

    def results(self) -> dict[str, str]:
        """Each replay group's id -> PASS or FAIL (once `poll` said the trial is over)."""
        return {run.key: run.outcome or FAIL for run in self.runs}

    def digests(self) -> dict[str, str]:
        """Each node that gave a digest -> its digest (a run that failed gives none)."""
        return {run.key: run.digest for run in self.runs if run.digest is not None}

    def stop(self) -> None:
        """Kill every run still going (the controller is closing)."""
        for run in self.runs:
            if run.outcome is None:
                run.end(FAIL)


def _start(spec: JobSpec, kind: str, action: Action, key: str, nodes: Sequence[str], resume_from: Path | None,
           steps: int, make: MakeGang, *, digest: bool) -> Run:
    """Launch one run of the job (see the module's docstring for where it keeps its files)."""
    safe = _UNSAFE.sub("_", key)
    base = spec.run_dir / f"{kind}-{_UNSAFE.sub('_', action.id)}" / safe
    base.mkdir(parents=True, exist_ok=True)
    digest_file = base / "digest" if digest else None
    env = {**spec.env, REPLAY_STEPS_ENV: str(steps), **({DIGEST_ENV: str(digest_file)} if digest_file else {})}
    sub = replace(spec, job=f"{spec.job}-{kind}-{safe}", run_dir=base, ckpt_dir=base / "ckpt", env=env)
    gang = make(sub, list(nodes), resume_from, 0)
    run = Run(key, tuple(nodes), gang, digest_file)
    try:
        gang.start()
    except (OSError, RuntimeError) as e:  # TimeoutError is an OSError
        log.error("%s %s on %s could not start: %s: %s", kind, key, ", ".join(nodes), type(e).__name__, e)
        run.end(FAIL)
        return run
    log.info("%s %s started on %s from %s; logs in %s", kind, key, ", ".join(nodes), resume_from or "scratch",
             gang.dir)
    return run
