"""What the terminal shows a person: the replay summary, actions and incidents, and a progress line.

Times are ISO 8601 UTC (the files keep epoch seconds); reasons are shown whole,
wrapped to the terminal's width, never cut.
"""

from __future__ import annotations

import shutil
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import orjson

from gangwatch.cli.options import iso


def counted(n: int, noun: str, plural: str = "") -> str:
    """`n` and its noun, singular for one: "1 record", "3 records", "0 records" (as `gangwatch.report.text`'s)."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def _width() -> int:
    return max(60, min(shutil.get_terminal_size((100, 24)).columns, 140))


def wrapped(text: str, indent: int) -> str:
    pad = " " * indent
    return textwrap.fill(text, width=_width(), initial_indent=pad, subsequent_indent=pad)


def _said(head: str, text: str) -> str:
    """`head` then `text`, whole, wrapped to the terminal under its own start (a meaning is never cut)."""
    pad = " " * len(head)
    return textwrap.fill(text, width=_width(), initial_indent=pad, subsequent_indent=pad).replace(pad, head, 1) \
        if text else head.rstrip()


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def meaning(finding_type: str, width: int = 80) -> str:
    """What a finding of this type says, in the words of its evidence's docstring (its first sentence), cut to
    `width`; "" for a type no detector of the catalog declares."""
    from gangwatch.detectors.catalog import REGISTRY

    fts = REGISTRY.types.get(finding_type)
    doc = (fts[0].shapes[0].__doc__ or "") if fts else ""
    text = " ".join(doc.split()).replace("`", "")
    text = text.split(". ")[0].rstrip(".")
    return text if len(text) <= width else text[:width - 3].rstrip() + "..."


def summary(s: Any) -> str:
    """The replay summary (a `streams.replay.Summary`); each finding type's count with what such a finding says."""
    span = (s.last_ts - s.first_ts) if s.first_ts is not None and s.last_ts is not None else 0.0
    rate = s.records / s.wall_s if s.wall_s > 0 else 0.0
    lines = [
        f"replayed  {counted(s.records, 'record')} in {s.wall_s:.2f} s ({rate:,.0f} records/s)",
        f"event time {iso(s.first_ts)} .. {iso(s.last_ts)} ({span:,.0f} s)",
        f"rejected  {s.rejected:,}" + ("  (reasons in rejected.jsonl)" if s.rejected else ""),
        f"findings  {s.findings:,}" + "".join("\n" + _said(f"  {k:<16} {v:>5,}  ", meaning(k, width=1000))
                                              for k, v in sorted(s.by_type.items())),
        f"actions   {s.actions:,}",
        f"incidents {counted(s.incidents, 'record')} (one each time an incident moved)",
        f"outputs   {s.out_dir}",
    ]
    return "\n".join(lines)


def outcome(out_dir: Path) -> str:
    """The actions (with full reasons) and the latest state of every incident, from a replay's outputs."""
    lines = []
    actions = _jsonl(out_dir / "actions.jsonl")
    if actions:
        lines.append("actions:")
        for a in actions:
            nodes = ",".join(a.get("nodes") or []) or "-"
            path = f" path {a['path']}" if a.get("path") else ""
            lines.append(f"  {iso(a['ts'])}  {a['type']} {nodes}{path}")
            lines.append(wrapped(a.get("reason") or "", 6))
    latest: dict[str, dict] = {}
    for inc in _jsonl(out_dir / "incidents.jsonl"):
        latest[inc["id"]] = inc
    if latest:
        lines.append("incidents:")
        for inc in latest.values():
            culprits = ",".join(inc.get("culprit_nodes") or []) or "-"
            stages = ", ".join(f"{k} {v:.0f} s" for k, v in (inc.get("stage_s") or {}).items()) or "-"
            over = f"; over budget: {', '.join(inc['over_budget'])}" if inc.get("over_budget") else ""
            lines.append(f"  {inc['class']:<10} culprit {culprits:<10} path {inc.get('path') or '-':<9} "
                         f"onset {iso(inc.get('onset_ts'))}")
            lines.append(wrapped(f"stages: {stages}{over}", 6))
    return "\n".join(lines)


def one_line(obj: dict[str, Any]) -> str:
    """A record from a topic as one readable line: time, kind, job and what matters for that kind."""
    kind = obj.get("kind", "?")
    head = f"{iso(obj['ts']) if isinstance(obj.get('ts'), (int, float)) else '-'}  {kind:<9} {obj.get('job', '-')}"
    if kind == "action":
        return f"{head}  {obj.get('type')} {','.join(obj.get('nodes') or []) or '-'}: {obj.get('reason', '')}"
    if kind == "finding":
        where = obj.get("node") or (f"rank {obj['rank']}" if obj.get("rank") is not None else "-")
        return f"{head}  {obj.get('type')} {where} (score {obj.get('score')})"
    if kind == "incident":
        return f"{head}  {obj.get('class')} culprit {','.join(obj.get('culprit_nodes') or []) or '-'} " \
               f"path {obj.get('path') or '-'}"
    if "reason" in obj:  # a dead letter
        return f"{head}  rejected: {obj['reason']}"
    return f"{head}  {orjson.dumps(obj)[:160].decode()}"


class ProgressLine:
    """`replaying: 42% 1,234,567 records (210,000/s), ETA 0:07, 3 findings, 1 action` on stderr."""

    def __init__(self, verb: str = "replaying") -> None:
        self.verb = verb
        self.started = time.monotonic()

    def __call__(self, s: Any, fraction: float) -> None:
        elapsed = time.monotonic() - self.started
        rate = s.records / elapsed if elapsed > 0 else 0.0
        eta = "?"
        if 0 < fraction < 1 and elapsed > 0.5:
            left = int(elapsed * (1 - fraction) / fraction)
            eta = f"{left // 60}:{left % 60:02d}"
        sys.stderr.write(f"\r\x1b[2K{self.verb}: {fraction:4.0%} {counted(s.records, 'record')} ({rate:,.0f}/s), "
                         f"ETA {eta}, {counted(s.findings, 'finding')}, {counted(s.actions, 'action')}, "
                         f"{s.rejected:,} rejected")
        sys.stderr.flush()

    def done(self) -> None:
        sys.stderr.write("\r\x1b[2K")
        sys.stderr.flush()
