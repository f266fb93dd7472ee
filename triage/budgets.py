"""Settings of triage (stage budgets, decision costs, safety limits: seconds unless named) and of the core.

Plain dataclasses that import nothing heavy: `gangwatch config show` and `--help` read them without the core."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any


@dataclass(frozen=True)
class Budgets:
    """Stage budgets of an interruption (domain.md)."""

    detect: float = 60.0
    localize: float = 300.0
    replace: float = 120.0
    rollback: float = 120.0
    comm_rebuild: float = 60.0
    total: float = 600.0


@dataclass(frozen=True)
class Safety:
    """Guards that keep a detector bug from draining a cluster."""

    max_evict_nodes: int = 16  # per job per window, at most ...
    max_evict_frac: float = 0.25  # ... and at most this share of the job's nodes (at least one node)
    window_s: float = 3600.0
    failslow_hold_s: float = 60.0  # a straggler must stay suspect this long before it is evicted ...
    failslow_corroborated_hold_s: float = 10.0  # ... or this long when its node's hardware explains it
    failslow_cooldown_s: float = 3600.0  # a node degraded for fail-slow is not re-decided before this ...
    failslow_regrow: float = 2.0  # ... unless its straggler now costs this many times as much


@dataclass(frozen=True)
class TriageConfig:
    budgets: Budgets = field(default_factory=Budgets)
    safety: Safety = field(default_factory=Safety)
    settle_s: float = 5.0  # wait this long after detection for the rest of a fail-stop to show
    # a job silent as a whole (its monitoring path, or a start that never came) waits this long before a human is
    # told: records held up within the lateness bound (a spool flushed late, a broker blip) withdraw it meanwhile
    late_s: float = 60.0
    hang_collect_s: float = 90.0  # after a hang, wait at most this long for stacks / flight dumps
    stall_budget_s: float = 300.0  # a job-wide stall with no culprit pages only if it lasts this long from its onset
    crash_loop_restarts: int = 2  # the same software failure after this many restarts with no progress: escalate
    confidence: float = 0.5  # a node is a culprit from this fused confidence on
    spares: int | None = None  # hot spares per job (None: unlimited)
    replace_cost_s: float = 120.0  # job time lost to a hot replacement
    failslow_horizon_s: float = 1800.0  # how long a straggler would keep slowing the job if kept
    straggler_page_frac: float = 0.10  # a straggler costing this share of each step that is not replaced: a human
    corroborate_window_s: float = 300.0  # hardware evidence this long before a straggler's onset still explains it
    planned_window_s: float = 1800.0  # an `ops` planned record covers stops this long after it
    risk_half_life_s: float = 86400.0
    dual_run_timeout_s: float = 900.0  # a dual run not answered within this goes to a human
    replay_timeout_s: float = 1800.0  # ... and a replay phase not answered within this
    # the escalation ladder when localization fails, in order (triage/diagnose.py); a human comes after it
    ladder: tuple[str, ...] = ("group", "restart", "replay")
    ladder_watch_s: float = 3600.0  # after a restart, the same fault back within this goes to the next rung
    shadow: bool = False  # record every action it would take, send none, and score them (triage/shadow.py)
    shadow_window_s: float = 600.0  # how long after a would-be action its verdict is waited for

    def __post_init__(self) -> None:
        unknown = [r for r in self.ladder if r not in ("group", "restart", "replay")]
        if unknown:
            raise ValueError(f"triage.ladder: no rung named {', '.join(unknown)} (rungs: group, restart, replay)")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TriageConfig:
        plain = {f.name: d[f.name] for f in fields(cls) if f.name in d and f.name not in ("budgets", "safety")}
        if "ladder" in plain:
            plain["ladder"] = tuple(plain["ladder"])
        return cls(budgets=Budgets(**d.get("budgets", {})), safety=Safety(**d.get("safety", {})), **plain)


@dataclass(frozen=True)
class CoreConfig:
    lateness_s: float = 1.0  # how far behind the newest event time timeouts are evaluated
    tick_s: float = 0.5  # records advance event time in steps of at least this (timeouts carry their own ts)
    triage: TriageConfig = field(default_factory=TriageConfig)
    # detector name -> its config dataclass (detectors.monitor.config_type); a detector left out runs on defaults
    detectors: Mapping[str, Any] = field(default_factory=dict)
