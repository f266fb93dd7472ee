"""The shell blocks of README.md and docs/*.md, as a reader would run them: extracted, marked, run in order.

A document's ```bash blocks are cut into commands (a line, with its `\\` continuations, a here-document's body
or a `for ... done` loop joined to it; lines that are only a comment, shown output, are dropped) and run in
order, in one bash process per document, in a copy of the checkout's tracked files: a later command sees what
an earlier one wrote or exported, as a reader's shell would.

A command that cannot run here is marked in the document, in an HTML comment right before its block (GitHub
does not show it), with the reason:

    <!-- doc-run: skip — needs a Slurm cluster -->                    every command of the block
    <!-- doc-run: skip "--act" "sinfo" — needs a Slurm cluster -->    the commands containing any of these texts

The reasons start from a small set (a cluster, a GPU, root, a process that runs until stopped, another service
or machine, the deployment's own files, ...): `MARK_REASONS` names them; a mark with another reason fails.
A block whose commands show an error is marked with the exit they show: `<!-- doc-run: exits 2 -->`.
In a ```console block the commands are the lines after the `$ ` prompt, and the lines after a command, up to the
next prompt, are the output it shows: the run compares them with what it printed (`shows`: each line as shown,
trailing spaces aside; a line `...` stands for any lines). Output the run cannot reproduce (it runs against its own
services and settings) is marked `<!-- doc-run: output varies — why -->`, and is then not compared.
The docs' example addresses stand for the services the test runs against (`ADDRESSES`).
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
BLOCK = re.compile(r"```(bash|sh|shell|console)\n(.*?)```", re.S)  # console: the `$ ` lines are the commands
MARK = re.compile(r"<!--\s*doc-run:\s*skip\s*((?:\"[^\"]+\"\s*)*)[—-]+\s*(.*?)\s*-->")
EXITS = re.compile(r"<!--\s*doc-run:\s*exits\s+(\d+)\s*-->")
VARIES = re.compile(r"<!--\s*doc-run:\s*output varies\s*[—-]+\s*(.+?)\s*-->")
MARK_REASONS = ("needs a Slurm cluster", "needs a Kubernetes cluster", "needs a GPU", "needs root",
                "runs until stopped", "needs another machine", "reads the deployment's own files",
                "needs another service", "installs packages", "runs the whole test suite",
                "starts or stops the services", "takes minutes")
# The docs' example addresses and what they stand for here (the services CI starts; the store is a database of
# this run's own, the topics carry this run's own prefix).
KAFKA_HOSTS = re.compile(r"\b(?:kafka1|127\.0\.0\.1):9092\b")
STORE_URLS = re.compile(r"clickhouse://(?:ch1|127\.0\.0\.1):9000/gangwatch\b")
NEEDS_SERVICES = re.compile(r"kafka1:|ch1:|127\.0\.0\.1:90(?:00|92)|\b(?:topics|publish|worker)\b|\./gw up")


@dataclass
class Command:
    doc: str
    line: int  # of the block's first line in the document
    text: str
    skip: str | None = None  # the reason, when marked
    exits: int = 0  # what the document shows it exit with
    shown: tuple[str, ...] | None = None  # the output the document shows after it (a console block), if compared

    def __str__(self) -> str:
        first = self.text.splitlines()[0]
        return f"{self.doc}:{self.line}: {first}"


@dataclass
class Result:
    command: Command
    rc: int | None  # None: never reached (an earlier command hung)
    output: str = ""
    errors: list[int] = field(default_factory=list)  # exit codes of commands that failed inside it (a loop's)

    @property
    def failed(self) -> bool:
        """Not the exit the document shows (0 unless it shows an error), or a command inside it failed."""
        return self.rc != self.command.exits or any(e != self.command.exits for e in self.errors)

    @property
    def differs(self) -> bool:
        """Its output is not the one the document shows (where it shows one to compare)."""
        return self.command.shown is not None and not shows(self.command.shown, self.output)


def shows(shown: tuple[str, ...], output: str) -> bool:
    """Whether `output` is what a document shows: line by line, trailing spaces and blank lines at either end
    aside; a shown line `...` stands for any lines (none too)."""
    got = [ln.rstrip() for ln in output.strip("\n").splitlines()]
    want = [ln.rstrip() for ln in shown]
    while want and not want[-1]:
        want.pop()

    def match(i: int, j: int) -> bool:
        if i == len(want):
            return j == len(got)
        if want[i] == "...":
            return any(match(i + 1, k) for k in range(j, len(got) + 1))
        return j < len(got) and got[j] == want[i] and match(i + 1, j + 1)

    return match(0, 0)


def _whole(text: str) -> bool:
    """Whether every quote opened in `text` is closed."""
    try:
        shlex.split(text, comments=True)
    except ValueError:
        return False
    return True


def _cut(block: str) -> list[str]:
    """The commands of one block: continuations, here-documents and loops joined; comment-only lines dropped."""
    lines = block.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        cmd = [line]
        while (cmd[-1].rstrip().endswith("\\") or not _whole("\n".join(cmd))) and i < len(lines):
            cmd.append(lines[i])  # a continuation, or a quoted text going on
            i += 1
        heredoc = re.search(r"<<-?\s*'?\"?(\w+)", " ".join(cmd))
        if heredoc:
            while i < len(lines):
                cmd.append(lines[i])
                i += 1
                if cmd[-1].strip() == heredoc[1]:
                    break
        depth = sum(len(re.findall(r"^\s*(?:for|while|until)\b", c)) for c in cmd)
        while depth and i < len(lines):
            cmd.append(lines[i])
            depth += len(re.findall(r"^\s*(?:for|while|until)\b", lines[i])) - len(re.findall(r"^\s*done\b", lines[i]))
            i += 1
        out.append("\n".join(cmd))
    return out


def commands(doc: Path) -> list[Command]:
    """Every command of a document's shell blocks, in order, with the reason where it is marked not to run."""
    text = doc.read_text(encoding="utf-8")
    out: list[Command] = []
    for block in BLOCK.finditer(text):
        line = text.count("\n", 0, block.start()) + 1
        before = text[:block.start()].rstrip().splitlines()
        marks: list[tuple[list[str], str]] = []
        exits, varies = 0, False
        while before and any(r.fullmatch(before[-1].strip()) for r in (MARK, EXITS, VARIES)):
            mark = before.pop().strip()
            if m := EXITS.fullmatch(mark):
                exits = int(m[1])
                continue
            if VARIES.fullmatch(mark):
                varies = True
                continue
            m = MARK.fullmatch(mark)
            if not m[2].startswith(MARK_REASONS):
                raise ValueError(f"{doc.name}:{line}: a doc-run mark's reason is none of {MARK_REASONS}: {m[2]!r}")
            marks.append((re.findall(r"\"([^\"]+)\"", m[1]), m[2]))
        body, outputs = block[2], []
        if block[1] == "console":  # the prompt's lines only; the rest is output, each command's its own
            for ln in body.splitlines():
                if ln.startswith("$ "):
                    outputs.append([])
                elif outputs:
                    outputs[-1].append(ln)
            body = "\n".join(ln[2:] for ln in body.splitlines() if ln.startswith("$ "))
        cut = _cut(body)
        if outputs and len(outputs) != len(cut):
            raise ValueError(f"{doc.name}:{line}: a console block's command goes on past its prompt's line")
        for k, cmd in enumerate(cut):
            skip = next((r for texts, r in marks if not texts or any(t in cmd for t in texts)), None)
            shown = tuple(outputs[k]) if outputs and not varies and any(ln.strip() for ln in outputs[k]) else None
            out.append(Command(doc.name, line, cmd, skip, exits, shown))
    return out


def needs_services(cmds: list[Command]) -> bool:
    return any(NEEDS_SERVICES.search(c.text) for c in cmds if not c.skip)


def bare_clone(dest: Path) -> Path:
    """The checkout's files (tracked or not yet, as they are in the working tree; not the ignored ones) in `dest`, as a
    clone would have them, with a `.venv` that is the checkout's own (its directories linked, so nothing is
    installed): `./gw` finds gangwatch installed and `gangwatch` on the PATH is `.venv/bin/gangwatch`. A git
    index of those files tells what a run wrote (`written`)."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, check=True).stdout  # and files about to be committed
    for rel in files.decode().split("\0"):
        if rel and (REPO / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, dest / rel)
    venv = dest / ".venv"
    venv.mkdir()
    for entry in (REPO / ".venv").iterdir():
        if not entry.name.startswith("."):
            (venv / entry.name).symlink_to(entry)
    # ./gw's "installed" stamps, for this pyproject.toml: it installs nothing (a `pip install -e` from here would
    # point the checkout's environment at this copy)
    version = hashlib.sha1((dest / "pyproject.toml").read_bytes()).hexdigest()[:12]
    for extras in ("all", "dev"):
        (venv / f".gangwatch-installed-{version}-{extras}").touch()
    git = ["git", "-c", "core.autocrlf=false"]
    subprocess.run([*git, "init", "-q"], cwd=dest, check=True)
    subprocess.run([*git, "add", "-A"], cwd=dest, check=True)
    return dest


def environment_state() -> dict[str, float]:
    """The checkout's installed packages (names and times): a doc command must not install into it."""
    return {str(p): p.stat().st_mtime for p in (REPO / ".venv" / "lib").glob("python*/site-packages/*")}


def written(clone: Path) -> list[str]:
    """What a run wrote into the clone outside the folders git ignores: new files and changed tracked ones."""
    git = ["git", "-c", "core.autocrlf=false"]
    new = subprocess.run([*git, "ls-files", "--others", "--exclude-standard"], cwd=clone, capture_output=True,
                         text=True, check=True).stdout.split()
    changed = subprocess.run([*git, "diff", "--name-only"], cwd=clone, capture_output=True, text=True,
                             check=True).stdout.split()
    return new + changed


def _address(text: str, kafka: str, store: str) -> str:
    return STORE_URLS.sub(store, KAFKA_HOSTS.sub(kafka, text))


def run(cmds: list[Command], clone: Path, env: dict[str, str], kafka: str, store: str,
        timeout: float) -> list[Result]:
    """Run the commands not marked, in order, in one bash process in `clone`; each one's exit status and output.
    Background jobs a document leaves running (`worker ... &`) are ended with the process group."""
    script = ["trap 'printf \"\\n@@doc-run-err %d\\n\" $?' ERR"]
    for i, cmd in enumerate(cmds):
        if cmd.skip:
            continue
        script += [f"printf '\\n@@doc-run-start {i}\\n'", _address(cmd.text, kafka, store),
                   f"printf '\\n@@doc-run-end {i} %d\\n' $?"]
    path = clone.parent / f"doc-run-{cmds[0].doc}.sh"
    path.write_text("\n".join(script) + "\n", encoding="utf-8")
    proc = subprocess.Popen(["bash", str(path)], cwd=clone, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, _ = proc.communicate()
    finally:
        try:
            os.killpg(proc.pid, 15)  # what the document left in the background
        except ProcessLookupError:
            pass
    results: dict[int, Result] = {}
    current: Result | None = None
    for line in out.splitlines():
        m = re.fullmatch(r"@@doc-run-(start|end|err) (\d+)(?: (\d+))?", line)
        if not m:
            if current is not None:
                current.output += line + "\n"
            continue
        if m[1] == "start":
            current = results[int(m[2])] = Result(cmds[int(m[2])], None)
        elif m[1] == "err" and current is not None:
            current.errors.append(int(m[2]))
        elif m[1] == "end" and current is not None:
            current.rc, current = int(m[3]), None
    return [results.get(i, Result(c, None)) for i, c in enumerate(cmds) if not c.skip]
