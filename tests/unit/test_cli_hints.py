"""The hints the command line prints run as written: `./gw ...` from a checkout whose .venv is not on the PATH
(after `./gw demo`), `gangwatch ...` where it is (issue 24)."""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

import pytest

from gangwatch.cli import build_parser
from gangwatch.cli.options import command_name, resolve

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


# --- every option reads the variable its help names (issue 47) ---------------------------------------------------

NAMED = re.compile(r"\benv (GANGWATCH_\w+(?: or GANGWATCH_\w+)*)")
# values tried, in order, for an option without choices: the first its own converter (and the settings' checks)
# take, and that differs from its default, is given once as the flag and once as the variable
TRIED = ("7", "3", "0.25", "1", "0", "nc.", "h.example:9092", "http://h.example:8123/x", "xid79", "abc")


def _blank(p: argparse.ArgumentParser) -> argparse.Namespace:
    """What parsing a command line without any option gives (positionals at their defaults: `resolve` reads none)."""
    ns = argparse.Namespace(**{a.dest: a.default for a in p._actions if a.dest != argparse.SUPPRESS})
    for k, v in p._defaults.items():
        setattr(ns, k, v)
    return ns


def _given(p: argparse.ArgumentParser, a: argparse.Action, raw: str) -> argparse.Namespace:
    """The namespace of the command line with `a`'s flag given `raw`, resolved with an empty environment."""
    if isinstance(a, argparse.BooleanOptionalAction):
        value = {"1": True, "0": False}[raw]
    else:
        value = a.type(raw) if a.type else raw
        if a.choices is not None and value not in a.choices:
            raise ValueError(raw)
    ns = _blank(p)
    if a.dest == "config":  # the file itself is read by the settings: compare what it set
        value = raw
    setattr(ns, a.dest, value)
    resolve(ns, {})
    return ns


def _seen(ns: argparse.Namespace, a: argparse.Action):
    return ns.settings.get("worker.app_id") if a.dest == "config" else getattr(ns, a.dest)


def test_every_option_reads_the_variable_its_help_names(tmp_path, monkeypatch):
    """`(env GANGWATCH_X)` in an option's help (or `env A or B`: each) is a promise: the variable set, the option
    left out, gives what the flag given the same text gives. (`topics create --app-id` said it read
    GANGWATCH_APP_ID's worker setting's variable nowhere and read none.)"""
    config = tmp_path / "gw.toml"
    config.write_text('[worker]\napp_id = "from-the-file"\n')
    monkeypatch.setattr(os, "environ", dict(os.environ))  # Kafka settings from flags are exported into it
    checked, wrong = 0, []
    for words, p in _parsers(build_parser()):
        for a in p._actions:
            named = NAMED.search(" ".join(str(a.help or "").split()))
            if not named or not a.option_strings or a.dest == "debug":  # --debug: read by main, tested below
                continue
            ns = _blank(p)
            resolve(ns, {})
            default = _seen(ns, a)
            tried = [str(config)] if a.dest == "config" else [str(c) for c in a.choices] if a.choices else TRIED
            want = None
            for raw in tried:
                try:
                    got = _seen(_given(p, a, raw), a)
                except Exception:  # not a value this option takes
                    continue
                if got != default:
                    want = (raw, got)
                    break
            assert want is not None, f"{' '.join(words)} {a.option_strings[0]}: no value in {tried} it takes"
            for variable in named.group(1).split(" or "):
                ns = _blank(p)
                try:
                    resolve(ns, {variable: want[0]})
                    got = _seen(ns, a)
                except Exception as e:
                    got = f"{type(e).__name__}: {e}"
                checked += 1
                if got != want[1]:
                    wrong.append(f"gangwatch {' '.join(words)} {a.option_strings[0]}: {variable}={want[0]!r} gave "
                                 f"{got!r}, the flag {want[1]!r}")
    assert not wrong, "\n".join(wrong)
    assert checked >= 150  # every command's options were walked, not a few


def test_debug_reads_gangwatch_debug(monkeypatch):
    from gangwatch.cli import _debug

    assert "env GANGWATCH_DEBUG" in next(a.help for a in build_parser()._actions if "--debug" in a.option_strings)
    monkeypatch.setenv("GANGWATCH_DEBUG", "1")
    assert _debug(argparse.Namespace(debug=False))
    monkeypatch.setenv("GANGWATCH_DEBUG", "0")
    assert not _debug(argparse.Namespace(debug=False))
