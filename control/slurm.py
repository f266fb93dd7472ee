"""Slurm backend of the fencing adapter (`gangwatch slurm`): drain a faulty node, resume it after repair.

Everything goes through `scontrol`, so it works wherever `scontrol` works (it
reads the cluster from `SLURM_CONF` or /etc/slurm/slurm.conf and authenticates
through munge as the user running it; draining needs an operator or root):

- read:   `scontrol show node -o NODE` -> its `State=` flags and `Reason=`
- fence:  `scontrol update NodeName=NODE State=DRAIN Reason="gangwatch: <incident> <type>: <reason>"`
- resume: `scontrol update NodeName=NODE State=RESUME`
- count:  `scontrol show node -o` -> one line per node (the fleet breaker's watched nodes, unless
  `--fleet-nodes` says how many)

A dry run needs no Slurm: where `scontrol` is missing or fails, it says what a
real run would do (`fence.unread`).

DRAIN lets the job running there finish or be requeued by its controller, and
starts nothing new on the node; the reason names the incident, so `sinfo -R`
tells an operator why. A node already drained is left alone: by gangwatch (any
incident) it stays as it is, by someone else their reason is kept. Resume only
touches a node whose drain reason starts with `gangwatch:`.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gangwatch.control.fence import REASON_PREFIX, Outcome, drain_reason, unread
from gangwatch.schemas import Action

Run = Callable[..., subprocess.CompletedProcess]

# "Reason=some text [root@2026-11-30T15:49:24]": the text, without Slurm's who-and-when suffix
_REASON = re.compile(r"\bReason=(.*?)(?: \[[^\[\]@]*@[^\[\]]*\])?(?= \w+=|$)")
_STATE = re.compile(r"\bState=(\S+)")


@dataclass(frozen=True)
class NodeState:
    """A Slurm node as `scontrol show node` reports it: its state flags (`IDLE`, `DRAIN`, ...) and reason."""

    name: str
    flags: frozenset[str]
    reason: str

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.flags

    @property
    def ours(self) -> bool:
        return self.reason.startswith(REASON_PREFIX)


class SlurmError(Exception):
    """scontrol failed for a reason other than an unknown node."""


class SlurmBackend:
    """Drains and resumes Slurm nodes with `scontrol` (`scontrol` may be a path; `env` its environment).

    `run` replaces `subprocess.run` (tests count calls with it). `updates` counts the
    `scontrol update` calls made, i.e. the changes made to the cluster.
    """

    name = "slurm"

    def __init__(self, scontrol: str = "scontrol", *, env: Mapping[str, str] | None = None, timeout_s: float = 30.0,
                 run: Run = subprocess.run) -> None:
        self.scontrol = scontrol
        self.env = dict(env) if env is not None else None
        self.timeout_s = timeout_s
        self._run = run
        self.updates = 0

    def node(self, name: str) -> NodeState | None:
        """The node's state, or None when Slurm does not know it; raises `SlurmError` when scontrol fails."""
        out = self._scontrol("show", "node", "-o", name)
        if out.returncode != 0:
            text = (out.stderr or out.stdout or "").strip()
            if "not found" in text.lower():
                return None
            raise SlurmError(text or f"scontrol exited with {out.returncode}")
        line = out.stdout.strip().splitlines()[0] if out.stdout.strip() else ""
        state = _STATE.search(line)
        reason = _REASON.search(line)
        if state is None:
            raise SlurmError(f"no State= in scontrol's answer: {line[:200]!r}")
        return NodeState(name, frozenset(state.group(1).split("+")),
                         reason.group(1).strip() if reason and reason.group(1) != "(null)" else "")

    def node_count(self) -> int:
        """How many nodes Slurm knows (`scontrol show node -o`: a line each); raises `SlurmError` when it fails."""
        out = self._scontrol("show", "node", "-o")
        if out.returncode != 0:
            text = (out.stderr or out.stdout or "").strip()
            raise SlurmError(text or f"scontrol exited with {out.returncode}")
        return sum(1 for line in out.stdout.splitlines() if line.startswith("NodeName="))

    def fence(self, node: str, action: Action, *, cls: str, act: bool) -> Outcome:
        reason = drain_reason(action)
        drain = f"scontrol update NodeName={node} State=DRAIN Reason=\"{reason}\""
        try:
            st = self.node(node)
        except (SlurmError, OSError, subprocess.TimeoutExpired) as e:
            if not act:  # a dry run needs no Slurm
                return unread(node, f"drain it unless Slurm does not know it or it is drained already: {drain}",
                              str(e))
            return Outcome(node, "could not read the node", error=str(e))
        if st is None:
            return Outcome(node, "unknown to Slurm: skipped (map gangwatch's node ids with --node-map)")
        if st.drained:
            who = "gangwatch" if st.ours else "someone else"
            return Outcome(node, f"already drained by {who} ({st.reason}): left as it is")
        if not act:
            return Outcome(node, f"would drain (dry run): {drain}", would=True)
        return self._update(node, "DRAIN", f"drained: {reason}", f"Reason={reason}")

    def restore(self, node: str, note: str, *, act: bool) -> Outcome:
        try:
            st = self.node(node)
        except (SlurmError, OSError, subprocess.TimeoutExpired) as e:
            if not act:
                return unread(node, f"resume it if gangwatch drained it: scontrol update NodeName={node} "
                                    "State=RESUME", str(e), would=False)
            return Outcome(node, "could not read the node", error=str(e))
        if st is None:
            return Outcome(node, "unknown to Slurm: nothing to resume")
        if not st.drained:
            return Outcome(node, f"not drained ({'+'.join(sorted(st.flags))}): nothing to resume")
        if not st.ours:
            return Outcome(node, f"drained by someone else ({st.reason}): left alone")
        if not act:
            return Outcome(node, f"would resume (dry run): scontrol update NodeName={node} State=RESUME")
        return self._update(node, "RESUME", f"resumed after repair: {note}")

    def _update(self, node: str, state: str, what: str, *extra: str) -> Outcome:
        try:
            out = self._scontrol("update", f"NodeName={node}", f"State={state}", *extra)
        except (OSError, subprocess.TimeoutExpired) as e:
            return Outcome(node, f"scontrol update State={state} failed", error=str(e))
        self.updates += 1
        if out.returncode != 0:
            text = (out.stderr or out.stdout or "").strip()
            return Outcome(node, f"scontrol update State={state} failed", error=text or f"exit {out.returncode}")
        return Outcome(node, what, changed=True)

    def _scontrol(self, *args: str) -> subprocess.CompletedProcess:
        # argv, never a shell: the reason may hold any character
        return self._run([self.scontrol, *args], capture_output=True, text=True, timeout=self.timeout_s,
                         env=self.env, check=False)
