"""Triage's collaborators reach it only through `triage.handle.TriageHandle`: every name they use of it is one the
handle declares, and `Triage` has every name the handle declares."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
from gangwatch.triage import diagnose, stragglers
from gangwatch.triage.budgets import TriageConfig
from gangwatch.triage.handle import TriageHandle
from gangwatch.triage.triage import Triage

pytestmark = pytest.mark.unit

DECLARED = {n for n in vars(TriageHandle) if not n.startswith("_")}


def used_of_triage(module) -> set[str]:
    """Names a module reads of its `self.triage` (directly, or through a local `tri = self.triage`)."""
    tree = ast.parse(Path(inspect.getfile(module)).read_text())
    used = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        v = node.value
        if isinstance(v, ast.Name) and v.id == "tri":
            used.add(node.attr)
        elif isinstance(v, ast.Attribute) and v.attr == "triage" and isinstance(v.value, ast.Name) \
                and v.value.id == "self":
            used.add(node.attr)
    return used


@pytest.mark.parametrize("module", [stragglers, diagnose], ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_a_collaborator_uses_only_what_the_handle_declares(module):
    used = used_of_triage(module)
    assert used, "the collaborator reaches triage somehow"
    assert used <= DECLARED, f"{module.__name__} uses {sorted(used - DECLARED)} beyond TriageHandle"


def test_triage_has_everything_the_handle_declares():
    tri = Triage("j", TriageConfig())
    assert {"act", "summarize", "job", "config"} <= DECLARED
    assert all(hasattr(tri, n) for n in DECLARED), sorted(n for n in DECLARED if not hasattr(tri, n))
    assert tri.stragglers.triage is tri and tri.diagnosis.triage is tri
