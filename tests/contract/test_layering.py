"""Import layering of the design, checked on the source (ast), not by importing it.

Data flows one way: producers -> schemas -> detectors -> triage -> sinks; a
package imports only from packages to its left (streams wires them all). The
pure core (schemas, detectors, triage) does no I/O and reads no clock:

- schemas imports no other gangwatch package;
- detectors: schemas, detectors, numpy, scikit-learn (scipy), the standard library;
- triage: schemas, detectors, fleet, triage, numpy, the standard library;
- fleet (what a fleet's history teaches): schemas, fleet, numpy, orjson, the standard library;
- none of the three imports a broker, store or network client (faust, kafka, aiokafka,
  clickhouse_driver, chdb, requests, socket, urllib, http, ...);
- detectors, triage and fleet call no clock (time.time, time.monotonic, datetime.now, ...), and no
  builtin open / print / input;
- producers import none of detectors, triage, streams, sinks, control; sinks import none of detectors, triage,
  streams, control (what they store or send is the contract: `schemas`, the output envelope included);
- control (the actuators: reference controller, fencing adapters) takes actions in the contract's terms and
  imports none of detectors, triage, sinks, streams (topic names are the contract's: `schemas.topics`);
  nothing but the command line imports control.

Every import counts: top-level or inside a function, under `if TYPE_CHECKING:` too, and
`importlib.import_module("x")` / `__import__("x")` with a literal name.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

pytestmark = pytest.mark.contract

REPO = Path(__file__).resolve().parents[2]
LAYERS = frozenset({"schemas", "producers", "detectors", "triage", "streams", "sinks", "control", "fleet"})
PROJECT = LAYERS | {"gangwatch"}
STDLIB = frozenset(sys.stdlib_module_names)
# brokers, stores and network clients; socket/urllib/http/ssl are stdlib but are I/O all the same
FORBIDDEN_IN_CORE = frozenset({
    "faust", "kafka", "aiokafka", "clickhouse_driver", "chdb", "requests", "httpx", "aiohttp", "pynvml",
    "socket", "ssl", "urllib", "http", "asyncio", "subprocess",
})
CLOCK_CALLS = frozenset({
    "time.time", "time.time_ns", "time.monotonic", "time.monotonic_ns", "time.perf_counter", "time.perf_counter_ns",
    "datetime.now", "datetime.utcnow", "datetime.today", "date.today",
    "datetime.datetime.now", "datetime.datetime.utcnow", "datetime.datetime.today", "datetime.date.today",
})
CLOCK_NAMES = {"time": frozenset({"time", "time_ns", "monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns"})}
IO_BUILTINS = frozenset({"open", "print", "input"})

# Known departures, (file, top-level module) -> why. Each is reported to the lead; delete the entry
# once the code is fixed.
KNOWN: dict[tuple[str, str], str] = {}  # (file, module) -> why an exception is tolerated for now


@dataclass(frozen=True)
class Import:
    file: str  # relative to the repository
    line: int
    module: str  # dotted, absolute

    @property
    def top(self) -> str:
        """The layer for project modules (`gangwatch.triage.triage` -> `triage`), else the top-level module."""
        parts = self.module.split(".")
        if parts[0] == "gangwatch" and len(parts) > 1 and parts[1] in LAYERS:
            return parts[1]
        return parts[0]


def package_files(package: str) -> list[Path]:
    files = sorted((REPO / package).rglob("*.py"))
    assert files, f"no Python files under {package}/"
    return files


@cache
def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _resolve_relative(path: Path, module: str | None, level: int) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[0] in LAYERS:  # the top-level folders install as gangwatch.<folder>
        parts.insert(0, "gangwatch")
    base = parts[:-level]  # a module's package is its directory; level 1 = that package
    return ".".join([*base, *([module] if module else [])])


def imports_of(path: Path) -> list[Import]:
    rel = path.relative_to(REPO).as_posix()
    out = []
    for node in ast.walk(parse(path)):
        if isinstance(node, ast.Import):
            out += [Import(rel, node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            name = node.module or ""
            if node.level:
                name = _resolve_relative(path, node.module, node.level)
            out.append(Import(rel, node.lineno, name))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str) and dotted(node.func) in ("importlib.import_module",
                                                                                  "import_module", "__import__"):
            out.append(Import(rel, node.lineno, node.args[0].value))
    return out


def package_imports(package: str) -> list[Import]:
    return [i for f in package_files(package) for i in imports_of(f)]


def dotted(node: ast.AST) -> str:
    """`a.b.c` for a Name/Attribute chain, '' otherwise."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


def violations(package: str, allowed: frozenset[str], *, stdlib: bool) -> list[str]:
    """Imports of `package` whose top-level module is neither in `allowed` nor (if `stdlib`) standard."""
    bad = []
    for imp in package_imports(package):
        top = imp.top
        if top in FORBIDDEN_IN_CORE:
            bad.append(f"{imp.file}:{imp.line}: imports {imp.module} (I/O in the pure core)")
        elif top in allowed or (stdlib and top in STDLIB and top not in PROJECT):
            continue
        elif (imp.file, top) in KNOWN:
            continue
        else:
            bad.append(f"{imp.file}:{imp.line}: imports {imp.module}")
    return bad


# --- the pure core ------------------------------------------------------------------------------


def test_schemas_import_no_other_project_package():
    bad = [f"{i.file}:{i.line}: imports {i.module}" for i in package_imports("schemas")
           if i.top in PROJECT - {"schemas"} or i.top in FORBIDDEN_IN_CORE]
    assert not bad, "\n".join(bad)


def test_detectors_import_only_schemas_numpy_sklearn_and_stdlib():
    bad = violations("detectors", frozenset({"schemas", "detectors", "numpy", "sklearn", "scipy"}), stdlib=True)
    assert not bad, "\n".join(bad)


def test_triage_imports_only_schemas_detectors_fleet_numpy_and_stdlib():
    bad = violations("triage", frozenset({"schemas", "detectors", "fleet", "triage", "numpy"}), stdlib=True)
    assert not bad, "\n".join(bad)


def test_fleet_imports_only_schemas_numpy_orjson_and_stdlib():
    bad = violations("fleet", frozenset({"schemas", "fleet", "numpy", "orjson"}), stdlib=True)
    assert not bad, "\n".join(bad)


def test_known_departures_still_exist():
    """An entry of KNOWN that no longer matches anything is stale: delete it, so it cannot hide a new one."""
    seen = {(i.file, i.top) for p in ("schemas", "detectors", "triage") for i in package_imports(p)}
    stale = [k for k in KNOWN if k not in seen]
    assert not stale, f"fixed, remove from KNOWN: {stale}"


@pytest.mark.parametrize("package", ["detectors", "triage", "fleet"])
def test_no_clock_and_no_io_calls(package):
    bad = []
    for path in package_files(package):
        rel = path.relative_to(REPO).as_posix()
        tree = parse(path)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module in CLOCK_NAMES:
                names = {a.name for a in node.names} & CLOCK_NAMES[node.module]
                if names:
                    bad.append(f"{rel}:{node.lineno}: from {node.module} import {', '.join(sorted(names))}")
            if not isinstance(node, ast.Call):
                continue
            name = dotted(node.func)
            if name in CLOCK_CALLS or any(name.endswith("." + c) for c in CLOCK_CALLS):
                bad.append(f"{rel}:{node.lineno}: calls {name}() (a wall clock; use event time)")
            elif name in IO_BUILTINS:
                bad.append(f"{rel}:{node.lineno}: calls {name}() (I/O in the pure core)")
    assert not bad, "\n".join(bad)


def test_project_imports_use_the_namespace():
    """`from schemas import X` would pick up a training repository's own `schemas/`: always `gangwatch.schemas`."""
    files = [f for p in [*LAYERS, "gangwatch", "tests", "bench"] for f in sorted((REPO / p).rglob("*.py"))]
    bad = [f"{i.file}:{i.line}: imports {i.module}" for f in files for i in imports_of(f)
           if i.module.split(".")[0] in LAYERS]
    assert not bad, "\n".join(bad)


# --- one-way data flow at the edges -------------------------------------------------------------


def test_producers_do_not_import_downstream():
    bad = [f"{i.file}:{i.line}: imports {i.module}" for i in package_imports("producers")
           if i.top in {"detectors", "triage", "streams", "sinks", "control"}]
    assert not bad, "\n".join(bad)


def test_the_actuators_take_the_contract_and_nobody_but_the_command_line_imports_them():
    bad = [f"{i.file}:{i.line}: imports {i.module}" for i in package_imports("control")
           if i.top in {"detectors", "triage", "sinks", "streams"}]
    bad += [f"{i.file}:{i.line}: imports {i.module}" for p in LAYERS - {"control"} for i in package_imports(p)
            if i.top == "control"]
    assert not bad, "\n".join(bad)


def test_sinks_do_not_import_streams():
    bad = [f"{i.file}:{i.line}: imports {i.module}" for i in package_imports("sinks") if i.top == "streams"]
    assert not bad, "\n".join(bad)


def test_sinks_import_only_the_contract():
    """Sinks store and send what the core produced; they take it in the contract's terms (`schemas`, `Outputs`
    included), never from the code that produced it."""
    bad = [f"{i.file}:{i.line}: imports {i.module}" for i in package_imports("sinks")
           if i.top in {"detectors", "triage", "producers"}]
    assert not bad, "\n".join(bad)


# --- the checker itself -------------------------------------------------------------------------


def test_checker_sees_imports_and_clock_calls(tmp_path, monkeypatch):
    src = (
        "import numpy as np\nfrom . import base\nfrom ..schemas import Step\nfrom time import monotonic\n"
        "import importlib\n\ndef f():\n    import socket\n    importlib.import_module('kafka')\n"
        "    return datetime.datetime.now(), time.time(), open('x')\n"
    )
    pkg = tmp_path / "detectors"
    pkg.mkdir()
    (pkg / "probe.py").write_text(src)
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    assert [i.module for i in imports_of(pkg / "probe.py")] == [
        "numpy", "gangwatch.detectors", "gangwatch.schemas", "time", "importlib", "socket", "kafka"]
    bad = violations("detectors", frozenset({"schemas", "detectors", "numpy"}), stdlib=True)
    assert len(bad) == 2 and "socket" in bad[0] + bad[1] and "kafka" in bad[0] + bad[1]
    with pytest.raises(AssertionError) as e:
        test_no_clock_and_no_io_calls("detectors")
    for what in ("import monotonic", "datetime.datetime.now()", "time.time()", "open()"):
        assert what in str(e.value)


def test_checker_reads_every_core_file():
    for package, expected in (("schemas", "orjson"), ("detectors", "numpy"), ("triage", "detectors")):
        assert expected in {i.top for i in package_imports(package)}
