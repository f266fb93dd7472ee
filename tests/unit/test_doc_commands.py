"""Every `gangwatch ...` and `./gw ...` command README.md and docs/*.md show in a shell block parses as written.

The commands are the ones tests/docrun.py cuts from the shell blocks (the real check,
tests/integration/test_doc_run.py, runs them); here each is split further (comments, redirections and `&` cut,
commands chained with `&&`, `;` or `|` split, leading `VAR=value` assignments dropped) and given to gangwatch's
own argument parser, marked ones too: an option renamed or removed, a choice that is not one, a sub-command that
does not exist fails here, in a second, with the line it came from. `./gw up`, `./gw down` and `./gw test` are
the wrapper's own commands. Also: how the blocks are cut, and that every mark says why with a known reason.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex

import pytest

from gangwatch.cli import build_parser
from tests import docrun

pytestmark = pytest.mark.unit

WRAPPER_ONLY = {"up", "down", "test"}  # ./gw's own commands: the services and the test suite


def commands() -> list[tuple[str, list[str]]]:
    """(where, argv) of every gangwatch command in the docs' shell blocks."""
    out = []
    for doc in docrun.DOCS:
        for cmd in docrun.commands(doc):
            for line in cmd.text.replace("\\\n", " ").splitlines():
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
                    out.append((f"{doc.name}:{cmd.line}: {part}", words[1:]))
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


def test_a_block_is_cut_into_the_commands_a_shell_runs(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("""text
<!-- doc-run: skip "--act" — needs a Slurm cluster -->
```bash
mkdir -p out   # where it goes
#   shown output, not a command
gangwatch slurm apply --from a.jsonl \\
    --act
python -c "
print('it is one command')"
cat > out/x.jsonl <<'EOF'
{"a": "it's in the file"}
EOF
for s in a b; do
  echo $s
done
```
<!-- doc-run: exits 2 -->
```console
$ gangwatch worker --bad
gangwatch worker: error: ...
```
""", encoding="utf-8")
    cmds = docrun.commands(doc)
    assert [c.text.splitlines()[0] for c in cmds] == [
        "mkdir -p out   # where it goes", "gangwatch slurm apply --from a.jsonl \\", 'python -c "',
        "cat > out/x.jsonl <<'EOF'", "for s in a b; do", "gangwatch worker --bad"]
    assert [c.text.count("\n") for c in cmds] == [0, 1, 1, 2, 2, 0]
    assert [c.skip for c in cmds] == [None, "needs a Slurm cluster", None, None, None, None]
    assert [c.exits for c in cmds] == [0, 0, 0, 0, 0, 2]
    assert [c.shown for c in cmds] == [None] * 5 + [("gangwatch worker: error: ...",)]


def test_the_output_a_console_block_shows_is_compared_line_by_line_with_any_lines_for_dots(tmp_path):
    """Issue 47: the doc run checked exit codes only; a document's shown output (an incident id it says is
    reproducible) went stale unseen."""
    doc = tmp_path / "doc.md"
    doc.write_text("""```console
$ gangwatch kb search --out o
onset  incident
t1     i-1
(1 row)
$ gangwatch config show
a  1
...
z  9
```
<!-- doc-run: output varies — its own services -->
```console
$ gangwatch topics list
gw.telemetry  8
```
""", encoding="utf-8")
    search, show, topics = docrun.commands(doc)
    assert search.shown == ("onset  incident", "t1     i-1", "(1 row)") and topics.shown is None
    assert docrun.shows(search.shown, "\nonset  incident   \nt1     i-1\n(1 row)\n\n")  # trailing spaces, blank ends
    assert not docrun.shows(search.shown, "onset  incident\nt1     i-2\n(1 row)\n")  # another id
    assert not docrun.shows(search.shown, "onset  incident\nt1     i-1\n")  # a line missing
    assert docrun.shows(show.shown, "a  1\nz  9\n") and docrun.shows(show.shown, "a  1\nb  2\nc  3\nz  9\n")
    assert not docrun.shows(show.shown, "a  1\nb  2\n")
    result = docrun.Result(search, 0, "onset  incident\nt1     i-2\n(1 row)\n")
    assert result.differs and not result.failed  # it ran well; what it printed is not what the document shows


def test_a_mark_without_a_known_reason_is_refused(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("<!-- doc-run: skip — slow -->\n```bash\ngangwatch demo\n```\n", encoding="utf-8")
    with pytest.raises(ValueError, match="reason"):
        docrun.commands(doc)


def test_the_docs_marks_say_why_and_most_commands_run():
    cmds = [c for doc in docrun.DOCS for c in docrun.commands(doc)]  # an unknown reason raises here
    marked = [c for c in cmds if c.skip]
    assert marked and all(c.skip.startswith(docrun.MARK_REASONS) for c in marked)
    assert len(cmds) - len(marked) > len(marked)
