"""The house's shape, checked on the source: no import circles, and one meaning per module name.

- **No circles.** Over every module of the project (the eight layers and `gangwatch/`), every import counts
  (top-level, inside a function, under `if TYPE_CHECKING:`): the graph of modules has no cycle, so each
  module can be read after the ones it names, and none is half-initialised when another reaches it.
- **One name, one idea.** Two modules share a file name only where they are the same idea at two places: a
  command-line module and the package it drives (`cli/slurm.py` runs `control/slurm.py`), or the two ends
  of one mechanism (listed below with why). A new pair fails here: name the file after what it holds.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from tests.contract.test_layering import LAYERS, REPO, imports_of

pytestmark = pytest.mark.contract

# Same name, same idea, at two places of the data path (producer side, consumer side).
SAME_IDEA = {
    "stacks": "a node's stack dumps: taken by the agent (producers/agent), clustered by a detector",
    "flight": "NCCL flight-recorder dumps: read by a producer, compared by a detector",
    "metrics": "Prometheus self-metrics: of the producers and of the worker",
    "relay": "the node relay's two ends: the trainer's link (producers/trainer) and the agent's server",
}


def module_files() -> dict[str, Path]:
    """Dotted install name -> file, for every module of the project."""
    out = {}
    for top in (*sorted(LAYERS), "gangwatch"):
        for path in sorted((REPO / top).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[0] in LAYERS:
                parts.insert(0, "gangwatch")
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports (`from p import m` names the module m when m is one)."""
    mods = module_files()

    def owner(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        for imp in imports_of(path):
            target = owner(imp.module)
            if target and target != mod:
                graph[mod].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_no_import_circles():
    found = cycles(import_graph())
    assert not found, "modules that import each other (directly or around a circle):\n" + "\n".join(
        " <-> ".join(c) for c in found)


def test_the_cycle_finder_sees_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_one_name_one_idea():
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in module_files().values():
        if path.stem not in ("__init__", "__main__"):
            by_name[path.stem].append(path.relative_to(REPO).as_posix())
    bad = []
    for name, paths in sorted(by_name.items()):
        if len(paths) < 2 or name in SAME_IDEA:
            continue
        # a command-line module beside the one module it drives
        commands = [p for p in paths if p.startswith("gangwatch/cli/")]
        if len(commands) == 1 and len(paths) == 2:
            continue
        bad.append(f"{name}.py: {', '.join(paths)}")
    assert not bad, "one file name, several ideas (rename after what each holds):\n" + "\n".join(bad)


def test_same_idea_pairs_still_exist():
    """An entry of SAME_IDEA whose pair is gone is stale: delete it."""
    names = [p.stem for p in module_files().values()]
    stale = [n for n in SAME_IDEA if names.count(n) < 2]
    assert not stale, f"no longer two modules of these names, remove from SAME_IDEA: {stale}"
