"""Incidents as Prometheus Alertmanager alerts, pushed to its v2 API (`POST /api/v2/alerts`).

    sink = AlertmanagerSink("http://alertmanager:9093", report_url="https://grafana/d/gw?var-incident={incident}")

One alert per culprit node of each incident (an incident not yet localized is
one alert without a `node` label), so operators can silence, inhibit and route
per node while a route with `group_by: [job]` still makes one notification per
job. Labels (the alert's identity in Alertmanager):

| label | value |
|---|---|
| `alertname` | `GangwatchIncident` |
| `job` | the training job's id |
| `incident` | the incident id (two incidents of one job stay two alerts) |
| `class` | `fail_stop`, `hang`, `sdc`, `fail_slow`, `unknown` or `planned` |
| `severity` | the class's (`schemas/classes.py`): critical pages, warning does not, info is a record |
| `node` | one culprit node (absent until the incident is localized) |
| `gpu` | that node's GPU indices named by the incident's findings, comma-separated (absent when none) |

Annotations: `summary` (one line), `reason` (the reasons of the incident's
actions, newest last), `evidence` (the findings behind it, one short line
each), `stages` (stage durations, and which ran over budget) and `report` (the
`report_url` template filled with `{incident}` and `{job}`, also sent as the
alert's `generatorURL`; without a template, the `gangwatch report --incident ... --store ...` that
shows the incident).

Alertmanager's contract, and how it is kept:

- **Firing alerts must be re-sent.** An alert carries `endsAt`; when it passes
  without a re-send, Alertmanager resolves the alert by itself. A firing alert
  is sent with `endsAt = now + ttl_s` and re-sent every `resend_s` while its
  incident is open (the same convention as Prometheus). If this process stops,
  its open alerts resolve after at most `ttl_s`; the incident itself stays in
  `gw_incidents` and on `gw.incidents`.
- **Resolving is an `endsAt` in the past.** When an incident closes (its
  `recovered_ts` is set: the controller reported `resumed`, or steps went on
  past the stall, or the decision was to keep running), its alerts are sent once
  more with `endsAt` = the recovery time (never later than now).
- **Labels are identity.** When an incident's labels change (its class was
  raised, a culprit was found, a GPU was named), the alerts with the old labels
  are resolved and new ones fire, so nothing is left firing under a stale name.

Sending happens on a background thread, so neither the replay loop nor the
worker's event loop waits on HTTP (it is an `AsyncSink`: the worker does not
wrap it in a queue): `write` only updates what should be firing, `flush` wakes
the thread, `close` sends what is pending within `close_timeout_s`, stops it
and returns how many updates were left. A failed POST (connection error,
timeout, 5xx, 408, 429) is transient: the thread waits `backoff_s`, doubling up
to `max_backoff_s` (flushes meanwhile do not hurry it), then sends again. Any
other 4xx is permanent: logged with Alertmanager's reason, and each alert of
the batch becomes a dead letter (`take_dead()`, source `sink:alertmanager`)
instead of being sent again (which cannot help). The outbox holds one update
per label set; `pressure()` is True while it is over `high_water` (until it is
at `low_water`). Delivery is best effort: alerts are notifications, the record
of an incident is the store and the topics.
"""

from __future__ import annotations

import base64
import datetime as dt
import http.client
import json
import logging
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gangwatch.schemas import Action, DeadLetter, Finding, Incident, Outputs, Record
from gangwatch.schemas.classes import CLASSES
from gangwatch.sinks.webhook import retryable

log = logging.getLogger(__name__)

API_PATH = "/api/v2/alerts"
ALERTNAME = "GangwatchIncident"
REPORT_URL_ENV = "GANGWATCH_ALERTMANAGER_REPORT_URL"


_KEEP_FINDINGS = 20_000  # recent findings remembered to describe incidents (GPU labels, evidence annotation)
_TEXT_MAX = 1_000  # characters per annotation
_EVIDENCE_LINES = 8

Sender = Callable[[bytes], tuple[int | None, str]]  # POST body -> (HTTP status or None, error text)


def _iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _clip(text: str, limit: int = _TEXT_MAX) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass
class _Open:
    """What the sink knows of one open incident: its latest record and the alerts it has firing."""

    incident: Incident
    reasons: list[str] = field(default_factory=list)
    alerts: dict[frozenset[tuple[str, str]], dict[str, Any]] = field(default_factory=dict)  # labels -> alert


class AlertmanagerSink:
    """Pushes incidents to an Alertmanager as alerts: firing while open, resolved when closed.

    `url` is the Alertmanager's base URL (`http://host:9093`, a path prefix is kept;
    user:password in it becomes Basic auth). `resend_s` is how often open alerts are
    re-sent, `ttl_s` how far ahead their `endsAt` lies (default 4 x `resend_s`, so
    three missed re-sends in a row still do not resolve them). `labels` are added to
    every alert (e.g. `{"cluster": "eu1"}`); `report_url` is a template with
    `{incident}` and `{job}` (default: the environment variable
    `GANGWATCH_ALERTMANAGER_REPORT_URL`, else none). `send` replaces the HTTP POST and `clock` the wall clock
    (both for tests); `background=False` sends inline from `flush` instead of a thread.
    """

    def __init__(self, url: str, *, resend_s: float = 60.0, ttl_s: float | None = None,
                 labels: Mapping[str, str] | None = None, report_url: str | None = None, timeout_s: float = 5.0,
                 close_timeout_s: float = 10.0, background: bool = True, send: Sender | None = None,
                 clock: Callable[[], float] = time.time, backoff_s: float = 0.5, max_backoff_s: float = 30.0,
                 high_water: int = 10_000, low_water: int = 5_000,
                 sleep: Callable[[float], None] | None = None) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"Alertmanager URL must be http(s)://HOST[:PORT][/prefix], got {url!r}")
        if resend_s <= 0:
            raise ValueError(f"resend_s must be > 0, got {resend_s}")
        self.ttl_s = 4 * resend_s if ttl_s is None else ttl_s
        if self.ttl_s <= resend_s:
            raise ValueError(f"ttl_s ({self.ttl_s:g}) must exceed resend_s ({resend_s:g}), or alerts flap")
        path = parts.path.rstrip("/")
        if not path.endswith(API_PATH):
            path += API_PATH
        netloc = parts.netloc.rpartition("@")[2]
        self.url = urllib.parse.urlunsplit((parts.scheme, netloc, path, "", ""))
        self._auth = ""
        if parts.username is not None:
            user = urllib.parse.unquote(parts.username)
            password = urllib.parse.unquote(parts.password or "")
            self._auth = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
        self.resend_s = resend_s
        self.timeout_s = timeout_s
        self.close_timeout_s = close_timeout_s
        self.extra_labels = dict(labels or {})
        self.report_url = os.environ.get(REPORT_URL_ENV, "") if report_url is None else report_url
        self._send = send or self._post
        self._clock = clock
        self._lock = threading.Lock()
        self._findings: OrderedDict[str, Finding] = OrderedDict()
        self._reasons: dict[str, list[str]] = {}  # incident id -> action reasons seen before its record
        self._open: dict[str, _Open] = {}
        self._outbox: dict[frozenset[tuple[str, str]], dict[str, Any]] = {}  # labels -> latest alert to send
        self._last_resend = clock()
        self.posts = 0  # POSTs that Alertmanager accepted
        self.failures = 0  # POSTs that failed
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.high_water, self.low_water = high_water, min(low_water, high_water - 1)
        self._pressed = False
        self._dead: list[DeadLetter] = []
        self.retries = 0  # transient failures waited out before sending again
        self.name = "alertmanager"
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._backoff_wait = sleep or self._stop.wait  # the wait after a failure; close() cuts it short
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(target=self._loop, name="gangwatch-alertmanager", daemon=True)
            self._thread.start()

    def __repr__(self) -> str:
        return f"AlertmanagerSink(url={self.url!r}, open={len(self._open)}, posts={self.posts})"

    # --- the Sink protocol ----------------------------------------------------------

    def write(self, out: Outputs) -> None:
        """Take findings (to describe incidents), action reasons and incident updates; sending waits for `flush`."""
        if not (out.incidents or out.actions or out.findings):
            return
        with self._lock:
            for f in out.findings:
                self._findings[f.id] = f
                if len(self._findings) > _KEEP_FINDINGS:
                    self._findings.popitem(last=False)
            for a in out.actions:
                self._on_action(a)
            for inc in out.incidents:
                self._on_incident(inc)

    def reject(self, dead: DeadLetter) -> None:
        pass

    def observe(self, rec: Record) -> None:
        pass

    def flush(self) -> None:
        """Send what changed: wake the sending thread (or send now, without one). Never blocks on HTTP
        with a thread."""
        if self._thread is None:
            self._send_pending()
        else:
            self._wake.set()

    def close(self, timeout_s: float | None = None) -> int:
        """Send what is still pending (within `close_timeout_s`) and stop; return the updates left unsent.
        Open alerts are not resolved: the incidents are still open; they expire after `ttl_s` unless
        another process re-sends them."""
        timeout_s = self.close_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        if self._thread is not None:
            self._stop.set()
            self._wake.set()
            self._thread.join(timeout_s)
            self._thread = None
        while self.pending() and time.monotonic() < deadline:
            if self._send_pending():
                break
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
        left = self.pending()
        if left:
            log.warning("alertmanager %s: %d alert update(s) not delivered at close", self.url, left)
        return left

    def pending(self) -> int:
        """Alert updates waiting to be sent."""
        with self._lock:
            return len(self._outbox)

    def pressure(self) -> bool:
        """True from when the outbox reaches `high_water` updates until it is down to `low_water`."""
        depth = self.pending()
        if depth >= self.high_water:
            self._pressed = True
        elif depth <= self.low_water:
            self._pressed = False
        return self._pressed

    def take_dead(self) -> list[DeadLetter]:
        """The dead letters of alerts Alertmanager refused (4xx) since the last call."""
        with self._lock:
            out, self._dead = self._dead, []
        return out

    def drain(self, timeout_s: float) -> int:
        """Wake the sender and wait (at most `timeout_s`) until nothing is pending; return what is left."""
        deadline = time.monotonic() + timeout_s
        if self._thread is None:
            self._send_pending()
            return self.pending()
        while self.pending() and time.monotonic() < deadline:
            self._wake.set()
            self._stop.wait(0.01)
        return self.pending()

    def firing(self) -> list[dict[str, Any]]:
        """The alerts currently kept firing (for inspection)."""
        with self._lock:
            return [a for o in self._open.values() for a in o.alerts.values()]

    # --- from outputs to alerts -----------------------------------------------------------

    def _on_action(self, a: Action) -> None:
        if not a.reason:
            return
        text = f"{a.type}{' ' + ','.join(a.nodes) if a.nodes else ''}: {a.reason}"
        o = self._open.get(a.incident)
        if o is None and a.incident not in self._reasons and len(self._reasons) >= _KEEP_FINDINGS:
            del self._reasons[next(iter(self._reasons))]  # an incident whose record never came: forget it
        reasons = o.reasons if o is not None else self._reasons.setdefault(a.incident, [])
        if text not in reasons:
            reasons.append(text)
            del reasons[:-8]  # the newest few are enough for a notification

    def _on_incident(self, inc: Incident) -> None:
        if inc.extra.get("shadow"):
            return  # shadow mode: nobody is paged for what was only recorded
        now = self._clock()
        o = self._open.get(inc.id)
        if o is None:
            o = _Open(inc, reasons=self._reasons.pop(inc.id, []))
        o.incident = inc
        closed = inc.recovered_ts is not None
        new = {} if closed else {labels: self._alert(o, labels, now) for labels in self._label_sets(inc)}
        # resolve what is firing under labels that no longer apply (or all of it, when the incident closed)
        for labels, old in o.alerts.items():
            if labels not in new:
                end = min(inc.recovered_ts, now) if closed else now
                self._outbox[labels] = {**old, "endsAt": _iso(max(end, self._starts(inc, now)))}
        if closed:
            if not o.alerts:  # closed before any alert was sent: say so once, resolved, for the record
                end = min(inc.recovered_ts, now)
                for labels in self._label_sets(inc):
                    alert = self._alert(o, labels, now)
                    self._outbox[labels] = {**alert, "endsAt": _iso(max(end, self._starts(inc, now)))}
            self._open.pop(inc.id, None)
            return
        o.alerts = new
        self._open[inc.id] = o
        self._outbox.update(new)

    def _label_sets(self, inc: Incident) -> list[frozenset[tuple[str, str]]]:
        base = {**self.extra_labels, "alertname": ALERTNAME, "job": inc.job, "incident": inc.id, "class": inc.cls,
                "severity": CLASSES[inc.cls].severity}
        if not inc.culprit_nodes:
            return [frozenset(base.items())]
        gpus = self._gpus(inc)
        out = []
        for node in inc.culprit_nodes:
            labels = {**base, "node": node}
            if gpus.get(node):
                labels["gpu"] = ",".join(str(g) for g in sorted(gpus[node]))
            out.append(frozenset(labels.items()))
        return out

    def _incident_findings(self, inc: Incident) -> list[Finding]:
        # once per id: delivery is at least once, so a re-published finding can be listed twice
        ids = dict.fromkeys(i for i in inc.extra.get("findings") or [] if isinstance(i, str))
        return [self._findings[i] for i in ids if i in self._findings]

    def _gpus(self, inc: Incident) -> dict[str, set[int]]:
        gpus: dict[str, set[int]] = {}
        for f in self._incident_findings(inc):
            if f.node is not None and f.gpu is not None:
                gpus.setdefault(f.node, set()).add(f.gpu)
        return gpus

    @staticmethod
    def _starts(inc: Incident, now: float) -> float:
        return min(inc.onset_ts or inc.detected_ts or inc.ts, now)

    def _alert(self, o: _Open, labels: frozenset[tuple[str, str]], now: float) -> dict[str, Any]:
        inc = o.incident
        lab = dict(labels)
        where = f" on {lab['node']}" + (f" GPU {lab['gpu']}" if "gpu" in lab else "") if "node" in lab else ""
        stages = ", ".join(f"{k} {v:g} s" for k, v in inc.stage_s.items())
        if inc.over_budget:
            stages += f"; over budget: {', '.join(inc.over_budget)}"
        annotations = {
            "summary": _clip(f"{inc.cls} in job {inc.job}{where}" + (f", path {inc.path}" if inc.path else "")),
            "reason": _clip("\n".join(o.reasons) or "deciding: gangwatch is still gathering evidence"),
            "evidence": _clip("\n".join(_describe(f) for f in self._incident_findings(inc)[:_EVIDENCE_LINES])
                              or ", ".join(inc.extra.get("findings") or []) or "-"),
            "stages": _clip(stages or "-"),
            "report": self._report(inc),
        }
        alert: dict[str, Any] = {"labels": lab, "annotations": annotations,
                                 "startsAt": _iso(self._starts(inc, now)), "endsAt": _iso(now + self.ttl_s)}
        if self.report_url:
            alert["generatorURL"] = annotations["report"]
        return alert

    def _report(self, inc: Incident) -> str:
        if self.report_url:
            q = urllib.parse.quote
            return self.report_url.format(incident=q(inc.id, safe=""), job=q(inc.job, safe=""))
        store = os.environ.get("GANGWATCH_STORE") or os.environ.get("GANGWATCH_SINKS__STORE") or "STORE"
        return f"gangwatch report --incident {inc.id} --store {store} --html {inc.id}.html"

    # --- sending ------------------------------------------------------------------------------

    def _loop(self) -> None:
        failures = 0
        while not self._stop.is_set():
            due = self._last_resend + self.resend_s - self._clock()
            self._wake.wait(timeout=max(0.05, min(due, self.resend_s)))
            self._wake.clear()
            if self._stop.is_set():
                return
            if self._send_pending() or not self.pending():
                failures = 0
                continue
            failures += 1  # transient: wait before the next try, whatever flushes come meanwhile
            self.retries += 1
            self._backoff_wait(min(self.max_backoff_s, self.backoff_s * 2 ** (failures - 1)))

    def _send_pending(self) -> bool:
        """One POST of every pending update (and, when due, a re-send of every firing alert); True on success."""
        now = self._clock()
        with self._lock:
            if now - self._last_resend >= self.resend_s:
                self._last_resend = now
                for o in self._open.values():
                    for labels, alert in o.alerts.items():
                        alert["endsAt"] = _iso(now + self.ttl_s)
                        self._outbox.setdefault(labels, alert)
            if not self._outbox:
                return True
            batch = dict(self._outbox)
            body = json.dumps(list(batch.values())).encode()
        status, error = self._send(body)
        if status is not None and 200 <= status < 300:
            with self._lock:
                for labels, alert in batch.items():
                    if self._outbox.get(labels) is alert:
                        del self._outbox[labels]
            self.posts += 1
            return True
        self.failures += 1
        if not retryable(status):
            log.error("alertmanager %s refused %d alert(s): %s; not sent again (dead letters)", self.url,
                      len(batch), error)
            with self._lock:
                for labels, alert in batch.items():
                    if self._outbox.get(labels) is alert:
                        del self._outbox[labels]
                    self._dead.append(DeadLetter(
                        reason=f"not delivered to the alertmanager sink: permanent: {error}",
                        source="sink:alertmanager", kind="alert", raw=json.dumps(alert)[:4096], ts=now))
                del self._dead[:-10_000]
            return False
        log.warning("alertmanager %s: sending %d alert(s) failed (%s); retried at the next flush or resend",
                    self.url, len(batch), error)
        return False

    def _post(self, body: bytes) -> tuple[int | None, str]:
        headers = {"Content-Type": "application/json"}
        if self._auth:
            headers["Authorization"] = self._auth
        req = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                resp.read()
                return resp.status, ""
        except urllib.error.HTTPError as e:
            try:
                text = e.read(300).decode("utf-8", "replace").strip()
            except (OSError, http.client.HTTPException):
                text = ""
            finally:
                e.close()
            return e.code, f"HTTP {e.code}" + (f": {text}" if text else "")
        except urllib.error.URLError as e:
            return None, f"connection error: {e.reason}"
        except (OSError, http.client.HTTPException) as e:
            return None, f"connection error: {type(e).__name__}: {e}"


def _describe(f: Finding) -> str:
    """One short line for a finding: `hw_fault n003 GPU 1 rank 25: ROBUST_CHANNEL_... (Xid 79, fatal)`."""
    where = " ".join(x for x in (f.node or "", f"GPU {f.gpu}" if f.gpu is not None else "",
                                 f"rank {f.rank}" if f.rank is not None else "") if x)
    ev = f.evidence
    what = ev.get("name") or ev.get("cause") or ev.get("reason") or f.detector
    notes = [f"Xid {ev['code']}" if ev.get("source") == "xid" and ev.get("code") is not None else "",
             str(ev.get("severity") or "")]
    notes_text = ", ".join(n for n in notes if n)
    return f"{f.type}{' ' + where if where else ''}: {what}" + (f" ({notes_text})" if notes_text else "")
