"""The analysts' SQL, shipped as files: `gangwatch/report/sql/NAME.sql`, one documented, parameterised query each.

A file starts with comment lines: what the query answers and what each row is, then one line per parameter,

    -- param NAME TYPE DEFAULT: what it means

TYPE is `String`, `Float64` or `Int64`; DEFAULT is a literal of it (`''`, `0`, `20`). The query names a
parameter as `{NAME}`; `render` puts in the given value (or the default) as a SQL literal: a string quoted and
escaped, a number checked to be one. ClickHouse 18.16 has no server-side query parameters, so this is the one
way values reach the text, and no value can change the query's shape. The same text runs on the ClickHouse
server and on chDB (the embedded store); `gangwatch sql` runs them.

A query may also name `{data_end}`: the data's last event time (the latest `ts` of any finding, action, incident,
job move or node profile in the store), what a window without an `until` ends at, so that a replayed or
historical store is measured to its own end and never to the wall clock (`BUILTINS`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

FOLDER = Path(__file__).with_name("sql")
TYPES = ("String", "Float64", "Int64")
# Placeholders every query may use besides its parameters: name -> the SQL put in (a scalar subquery).
BUILTINS = {
    # (a scalar subquery is Nullable on newer servers: ifNull keeps the type what the queries compute with)
    "data_end": "ifNull((SELECT max(t) FROM (" + " UNION ALL ".join(
        f"SELECT max(ts) AS t FROM {table}"
        for table in ("gw_findings", "gw_actions", "gw_incidents", "gw_jobs", "gw_node_profiles")) + ")), 0.)",
}
_PARAM = re.compile(r"--\s*param\s+(?P<name>[a-z_][a-z0-9_]*)\s+(?P<type>\w+)\s+(?P<default>'[^']*'|-?[0-9.]+)"
                    r"\s*:\s*(?P<doc>.*)")


@dataclass(frozen=True)
class Param:
    name: str
    type: str
    default: str  # as written in the file
    doc: str


@dataclass(frozen=True)
class Query:
    name: str
    doc: str  # the comment lines before the parameters
    params: dict[str, Param]
    text: str  # the SQL, with {name} placeholders

    @property
    def summary(self) -> str:
        """The first sentence of the doc."""
        return self.doc.split(". ")[0].split(": ")[0].rstrip(".")


def parse(name: str, source: str) -> Query:
    """A query from its file's text; ValueError naming the file's mistake (a bad parameter line, a placeholder
    with no parameter, a parameter no placeholder uses)."""
    doc: list[str] = []
    params: dict[str, Param] = {}
    lines = source.splitlines()
    body_from = len(lines)
    for i, line in enumerate(lines):
        if not line.startswith("--"):
            body_from = i
            break
        if re.match(r"--\s*param\b", line):
            m = _PARAM.fullmatch(line.strip())
            if m is None or m["type"] not in TYPES:
                raise ValueError(f"{name}.sql line {i + 1}: want '-- param NAME {'|'.join(TYPES)} DEFAULT: what'")
            params[m["name"]] = Param(m["name"], m["type"], m["default"], m["doc"].strip())
        elif not params:
            doc.append(line[2:].strip())
    text = "\n".join(lines[body_from:]).strip()
    used = set(re.findall(r"\{([a-z_][a-z0-9_]*)\}", text))
    if used - set(params) - set(BUILTINS):
        undeclared = ", ".join(sorted(used - set(params) - set(BUILTINS)))
        raise ValueError(f"{name}.sql uses {{{undeclared}}} but declares no such param")
    if set(params) & set(BUILTINS):
        raise ValueError(f"{name}.sql declares param {', '.join(sorted(set(params) & set(BUILTINS)))}, "
                         "a name every query has (queries.BUILTINS)")
    if set(params) - used:
        raise ValueError(f"{name}.sql declares param {', '.join(sorted(set(params) - used))} but never uses it")
    for p in params.values():
        literal(p, p.default.strip("'") if p.type == "String" else p.default)  # the default is a value of its type
    return Query(name, " ".join(doc), params, text)


@cache
def catalog() -> dict[str, Query]:
    """Every shipped query by name, sorted."""
    return {p.stem: parse(p.stem, p.read_text(encoding="utf-8")) for p in sorted(FOLDER.glob("*.sql"))}


def literal(p: Param, value: str) -> str:
    """`value` as a SQL literal of `p`'s type; ValueError saying what the parameter wants."""
    if p.type == "String":
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    try:
        number = int(value) if p.type == "Int64" else float(value)
    except ValueError:
        want = "an integer" if p.type == "Int64" else "a number"
        raise ValueError(f"--param {p.name}={value!r}: want {want}") from None
    if isinstance(number, float) and not math.isfinite(number):
        raise ValueError(f"--param {p.name}={value!r}: want a finite number")
    return repr(number)


def render(q: Query, given: dict[str, str]) -> str:
    """The query's text with every parameter put in (the given value, else its default); ValueError for a
    parameter the query does not take or a value not of its type."""
    unknown = set(given) - set(q.params)
    if unknown:
        takes = ", ".join(q.params) or "none"
        raise ValueError(f"{q.name} takes no --param {', '.join(sorted(unknown))} (it takes: {takes})")
    values = dict(BUILTINS)
    for name, p in q.params.items():
        raw = given[name] if name in given else (p.default.strip("'") if p.type == "String" else p.default)
        values[name] = literal(p, raw)
    return re.sub(r"\{([a-z_][a-z0-9_]*)\}", lambda m: values[m[1]], q.text)
