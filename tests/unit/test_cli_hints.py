"""The hints the command line prints run as written: `./gw ...` from a checkout whose .venv is not on the PATH
(after `./gw demo`), `gangwatch ...` where it is (issue 24)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gangwatch.cli.options import command_name

pytestmark = pytest.mark.unit


def checkout(tmp_path: Path) -> Path:
    root = tmp_path / "checkout"
    (root / ".venv" / "bin").mkdir(parents=True)
    (root / "gw").write_text("#!/usr/bin/env bash\n")
    exe = root / ".venv" / "bin" / "gangwatch"
    exe.write_text("")
    exe.chmod(0o755)
    return root


def test_from_the_checkout_without_gangwatch_on_the_path_a_hint_says_gw(tmp_path, monkeypatch):
    root = checkout(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(root / ".venv" / "bin" / "gangwatch"), "demo"])
    monkeypatch.setattr(sys, "prefix", str(root / ".venv"))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.chdir(root)
    assert command_name() == "./gw"
    monkeypatch.chdir(tmp_path)  # elsewhere: the checkout's gw by its path
    assert command_name() == str((root / "gw").resolve())


def test_with_the_venv_activated_a_hint_says_gangwatch(tmp_path, monkeypatch):
    root = checkout(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(root / ".venv" / "bin" / "gangwatch"), "demo"])
    monkeypatch.setattr(sys, "prefix", str(root / ".venv"))
    monkeypatch.setenv("PATH", f"{root / '.venv' / 'bin'}:/usr/bin:/bin")  # source .venv/bin/activate
    monkeypatch.chdir(root)
    assert command_name() == "gangwatch"


def test_the_demos_sql_hint_uses_that_name():
    from gangwatch.cli import simulate

    source = Path(simulate.__file__).read_text()
    assert "SQL over the store: {command_name()} store query" in source and "gangwatch store query" not in source
