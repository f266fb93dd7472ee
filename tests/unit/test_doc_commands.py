"""Every `gangwatch ...` and `./gw ...` command README.md and docs/*.md show in a shell block parses as written.

The commands are extracted from the ```bash blocks (continuation lines joined, comments, redirections and
`&` cut, commands chained with `&&`, `;` or `|` split, leading `VAR=value` assignments dropped) and given to
gangwatch's own argument parser: an option renamed or removed, a choice that is not one, a sub-command that
does not exist fails here with the line it came from. `./gw up`, `./gw down` and `./gw test` are the wrapper's
own commands (they start and stop the shared services) and are not run. Lines of output shown inside a block
(`gangwatch worker: error: ...`) are not commands.

The cheap ones also run as written, in an empty folder (`sql --list`, `sql NAME --explain`, `--help` forms,
`config show`, `simulate` of a small job); those that need services (Kafka, ClickHouse), a cluster (Slurm,
Kubernetes), a GPU or an earlier command's output are parsed only.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from gangwatch.cli import build_parser

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
WRAPPER_ONLY = {"up", "down", "test"}  # ./gw's own commands: the services (needs them stopped or started: skipped)
BLOCK = re.compile(r"```(?:bash|sh|shell)\n(.*?)```", re.S)


def commands() -> list[tuple[str, list[str]]]:
    """(where, argv) of every gangwatch command in the docs' shell blocks."""
    out = []
    for doc in DOCS:
        for block in BLOCK.finditer(doc.read_text(encoding="utf-8")):
            for line in block[1].replace("\\\n", " ").splitlines():
                line = re.sub(r"\s#.*$", "", line).strip()
                for part in re.split(r"\s*(?:&&|\|\||;|\||&\s*$)\s*", line):
                    part = re.sub(r"\s[12]?>>?\s*\S+", "", part)
                    try:
                        words = shlex.split(part)
                    except ValueError:
                        continue
                    while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
                        words = words[1:]
                    if len(words) < 2 or words[0] not in ("gangwatch", "./gw") or words[1].endswith(":"):
                        continue
                    if words[0] == "./gw" and words[1] in WRAPPER_ONLY:
                        continue
                    out.append((f"{doc.name}: {part}", words[1:]))
    return out


def test_the_docs_show_commands():
    got = commands()
    assert len(got) >= 40 and {d.split(":")[0] for d, _ in got} >= {"README.md", "sql-analyst.md", "alert-consumer.md"}


@pytest.mark.parametrize(("where", "argv"), commands(), ids=lambda v: v if isinstance(v, str) else None)
def test_each_doc_command_parses_as_written(where, argv):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            build_parser().parse_args(argv)
    except SystemExit as e:
        assert not e.code, f"{where}\n  {err.getvalue().strip().splitlines()[-1:]}"


def _cheap(argv: list[str]) -> bool:
    """Commands that need no service, cluster, GPU or earlier output: help, settings, the shipped queries' texts."""
    if any(a in ("--help", "-h") for a in argv) or argv[:2] in (["config", "show"], ["sql", "--list"]):
        return not any(a.startswith("--config") for a in argv)
    if argv[0] == "simulate":  # a small job, written under gangwatch-out/
        return "--duration" in argv and float(argv[argv.index("--duration") + 1]) <= 200
    return argv[0] == "sql" and "--explain" in argv and len(argv) == 3


RUNNABLE = [(w, a) for w, a in commands() if a[0] != "up" and _cheap(a)]


@pytest.mark.parametrize(("where", "argv"), RUNNABLE, ids=lambda v: v if isinstance(v, str) else None)
def test_cheap_doc_commands_run_as_written(where, argv, tmp_path, monkeypatch):
    """Run in an empty folder: exit 0, something said, nothing written outside gangwatch-out/ (the rest need
    services, a cluster, a GPU or an earlier command's output, and are only parsed above)."""
    from gangwatch.cli import main

    monkeypatch.chdir(tmp_path)
    for var in [v for v in __import__("os").environ if v.startswith("GANGWATCH_")]:
        monkeypatch.delenv(var)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as e:  # --help exits 0
            rc = e.code or 0
    assert rc == 0, f"{where}\n  {err.getvalue().strip()[-400:]}"
    assert (out.getvalue() + err.getvalue()).strip(), where
    assert {p.name for p in tmp_path.iterdir()} <= {"gangwatch-out"}, where


def test_some_doc_commands_run():
    assert len(RUNNABLE) >= 3
