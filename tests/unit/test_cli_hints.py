"""The hints the command line prints run as written: `./gw ...` from a checkout whose .venv is not on the PATH
(after `./gw demo`), `gangwatch ...` where it is (issue 24)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

from gangwatch.cli import build_parser
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


# --- one option, one meaning (issue 47) --------------------------------------------------------------------------

# Options that mean the same in every command that takes them: each reads the same variable there. (`topics create
# --app-id` read none while `worker --app-id` read GANGWATCH_APP_ID: the topics it made were another app's.)
SHARED = ("--app-id", "--prefix", "--store", "--bootstrap", "--partitions", "--replication", "--connect-timeout")
# where one of them means something else, and why
OWN_MEANING = {
    ("drill", "--prefix"): "the drill's own topics, made for it and deleted afterwards",
    ("rules suggest", "--store"): "read only without --history: the command reads GANGWATCH_STORE itself then",
}


def _parsers(p: argparse.ArgumentParser, words: tuple[str, ...] = ()):
    yield words, p
    for a in p._actions:  # argparse has no public list of a parser's subcommands
        if isinstance(a, argparse._SubParsersAction):
            for name, sp in a.choices.items():
                yield from _parsers(sp, (*words, name))


def test_an_option_that_means_one_thing_reads_one_variable_in_every_command():
    reads: dict[str, dict[str, str]] = {flag: {} for flag in SHARED}
    for words, p in _parsers(build_parser()):
        specs = {s.flag: s.env for s in p.get_default("_env_options") or ()}
        for a in p._actions:
            for flag in set(a.option_strings) & set(SHARED):
                if (" ".join(words), flag) not in OWN_MEANING:
                    reads[flag][" ".join(words)] = specs.get(flag, "")
    assert all(len(by) >= 2 for by in reads.values()), reads  # each is shared, or it needs no test here
    for flag, by in reads.items():
        assert len(set(by.values())) == 1 and "" not in by.values(), f"{flag} reads different variables: {by}"
