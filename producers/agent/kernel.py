"""Following the kernel log live and turning its hardware events into `hw` records.

Three places a node's kernel log can be read from, each a *line source* with
one method, `read_lines()`, that returns the complete lines that arrived since
the last call and never blocks:

- `KmsgDevice`: `/dev/kmsg`, the kernel's own ring buffer. Each read returns one
  record, `prio,seq,usec,flags;message`, possibly followed by device metadata
  lines that start with a space (`␣SUBSYSTEM=pci`), which are dropped. Needs
  root or CAP_SYSLOG where `kernel.dmesg_restrict=1`.
- `Journal`: the output of `journalctl -k -f -o short-iso` (for hosts where
  /dev/kmsg is closed to the agent but the journal is not).
- `FollowFile`: a log file, followed like `tail -F`: it survives rotation (the
  path now names a new file: the rest of the old one is read, then the new one
  from its start) and truncation (read again from the start).

All start at the end (only new lines) unless told `from_start`.

`KmsgFolder` feeds the lines through the existing parser (`kmsg.parse_lines`)
incrementally: an event is reported as soon as its headline arrives, and the
lines of a report still open (the firmware dump after an Xid, the detail lines
of an AER report) are kept as context, so that when the rest of the dump
arrives in the next read it folds into the event instead of becoming events of
its own. After `quiet_s` without a line, the report is over and the context is
dropped. `KernelLog` is the collector: lines in, `hw` records out, each naming its GPU
when the event's PCI bus id is one NVML listed (`gpu_of`, from `nvml.gpu_indices`).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, Protocol

from gangwatch.producers.kmsg import KmsgEvent, parse_lines, strip_prefix, to_hw_record
from gangwatch.producers.nvml import bus_key

log = logging.getLogger("gangwatch.agent")
KMSG = "/dev/kmsg"


class LineSource(Protocol):
    what: str  # for the log: "/dev/kmsg", "journalctl -k", the file's path

    def read_lines(self) -> list[str]: ...

    def close(self) -> None: ...


class LineBuffer:
    """Bytes in, complete lines out; an unfinished last line waits for the rest."""

    def __init__(self) -> None:
        self._partial = b""

    def feed(self, data: bytes) -> list[str]:
        data = self._partial + data
        *lines, self._partial = data.split(b"\n")
        return [line.decode("utf-8", errors="replace") for line in lines]

    def rest(self) -> list[str]:
        """The unfinished line, as a line of its own (the file it came from ended)."""
        rest, self._partial = self._partial, b""
        return [rest.decode("utf-8", errors="replace")] if rest else []


class KmsgDevice:
    """`/dev/kmsg`, read without blocking. Opening it raises PermissionError where the agent may not read it."""

    def __init__(self, path: str = KMSG, from_start: bool = False) -> None:
        self.what = path
        self._fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        if not from_start:
            os.lseek(self._fd, 0, os.SEEK_END)  # on /dev/kmsg: skip to the next record the kernel writes
        self._overrun = False

    def read_lines(self) -> list[str]:
        lines: list[str] = []
        while True:
            try:
                data = os.read(self._fd, 1 << 16)  # one record per read on /dev/kmsg (its limit is 8 KiB)
            except BlockingIOError:  # nothing new
                break
            except BrokenPipeError:  # the kernel overwrote records before we read them; the next read goes on
                if not self._overrun:
                    log.warning("%s: the kernel ring buffer wrapped before the agent read it; some lines were lost",
                                self.what)
                    self._overrun = True
                continue
            if not data:
                break
            text = data.decode("utf-8", errors="replace")
            lines += [line for line in text.split("\n") if line and not line.startswith(" ")]
        return lines

    def close(self) -> None:
        os.close(self._fd)


class Journal:
    """`journalctl -k -f -o short-iso`: the kernel's lines as the journal keeps them."""

    def __init__(self, from_start: bool = False, command: str = "journalctl") -> None:
        self.what = "journalctl -k"
        args = [command, "-k", "-f", "-o", "short-iso", "--no-pager", "-n", "all" if from_start else "0"]
        self._proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        os.set_blocking(self._proc.stdout.fileno(), False)
        self._buffer = LineBuffer()
        self._ended = False

    def read_lines(self) -> list[str]:
        lines: list[str] = []
        while True:
            try:
                data = os.read(self._proc.stdout.fileno(), 1 << 16)
            except BlockingIOError:
                return lines
            if not data:
                break
            lines += self._buffer.feed(data)
        if not self._ended and self._proc.poll() is not None:
            self._ended = True
            why = self._proc.stderr.read().decode(errors="replace").strip()[:300]
            log.warning("journalctl exited (status %s) %s; no more kernel-log lines", self._proc.returncode, why)
        return lines + self._buffer.rest()

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            self._proc.wait(5)
        self._proc.stdout.close()
        self._proc.stderr.close()


class FollowFile:
    """A log file followed like `tail -F`: new lines as they are appended, across rotation and truncation.

    A file that does not exist yet is waited for; once it appears it is read from
    its start (everything in it is new). Rotation is noticed by the path naming
    another file (inode) than the one open; truncation by the file being shorter
    than what was read.
    """

    def __init__(self, path: str | os.PathLike[str], from_start: bool = False) -> None:
        self.path = Path(path)
        self.what = str(path)
        self._buffer = LineBuffer()
        self._file = None
        self._open(at_end=not from_start)
        if self._file is None:
            log.info("kernel log %s does not exist yet; reading it once it appears", self.path)

    def _open(self, at_end: bool) -> None:
        try:
            self._file = open(self.path, "rb")
        except FileNotFoundError:
            self._file = None
            return
        if at_end:
            self._file.seek(0, os.SEEK_END)

    def read_lines(self) -> list[str]:
        if self._file is None:
            self._open(at_end=False)
            if self._file is None:
                return []
        lines = self._buffer.feed(self._file.read())
        try:
            now = self.path.stat()
        except FileNotFoundError:  # renamed away and not recreated yet: keep the old file open
            return lines
        mine = os.fstat(self._file.fileno())
        if (now.st_dev, now.st_ino) != (mine.st_dev, mine.st_ino):  # rotated: finish the old file, start the new
            lines += self._buffer.feed(self._file.read()) + self._buffer.rest()
            self._file.close()
            self._open(at_end=False)
            if self._file is not None:
                lines += self._buffer.feed(self._file.read())
        elif now.st_size < self._file.tell():  # truncated in place (copytruncate)
            self._file.seek(0)
            self._buffer = LineBuffer()
            lines += self._buffer.feed(self._file.read())
        return lines

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def open_source(spec: str, from_start: bool = False) -> LineSource | None:
    """The kernel log `spec` names: `auto`, `off`, `/dev/kmsg`, `journal`, or a file path.

    `auto` takes /dev/kmsg when the agent may read it, else journalctl when it is
    installed, else nothing (None, with a line in the log saying why).
    """
    if spec == "off":
        return None
    if spec == "journal":
        return Journal(from_start)
    if spec == KMSG:
        return KmsgDevice(KMSG, from_start)
    if spec != "auto":
        return FollowFile(spec, from_start)
    try:
        return KmsgDevice(KMSG, from_start)
    except OSError as e:
        why = f"{KMSG}: {e.strerror or e}"
    if shutil.which("journalctl"):
        log.info("%s; reading the kernel log through journalctl -k instead", why)
        return Journal(from_start)
    log.warning("no kernel log: %s and journalctl is not installed (run as root or with CAP_SYSLOG, or pass "
                "--kmsg FILE); the other collectors run", why)
    return None


class KmsgFolder:
    """Kernel-log lines in, hardware events out, as the lines arrive.

    `kmsg.parse_lines` folds a multi-line report into its first line, but only
    within one call. To fold across reads, the folder keeps the lines of the
    report still open (`_context`: its headline and what followed it) and parses
    them again in front of the new lines; the headline's event, already
    reported, is skipped. A report is closed after `quiet_s` without a new line,
    or after `max_context` lines (a report that long is not one).
    """

    def __init__(self, quiet_s: float = 2.0, max_context: int = 2000) -> None:
        self.quiet_s, self.max_context = quiet_s, max_context
        self._context: list[str] = []
        self._last_line_at = float("-inf")

    def feed(self, lines: list[str], now: float) -> list[KmsgEvent]:
        """Events whose headline is among `lines` (`now`: a monotonic time, to tell a quiet log)."""
        if now - self._last_line_at >= self.quiet_s or len(self._context) > self.max_context:
            self._context = []
        if not lines:
            return []
        self._last_line_at = now
        window = self._context + lines
        events = parse_lines(window)
        if self._context:
            events = events[1:]  # the open report's headline: reported when it arrived
        self._context = self._open_report(window, events)
        return events

    def _open_report(self, window: list[str], new: list[KmsgEvent]) -> list[str]:
        """The lines of `window` from the headline of its last report that may still go on."""
        if not new:  # nothing started: the report in context (if any) goes on, now with these lines
            return window if self._context else []
        last = new[-1]
        if last.source not in ("xid", "pcie"):  # only an Xid or an AER report has lines that follow it
            return []
        # its headline is the last line whose message is the event's (no line folded into it can repeat it)
        start = next(i for i in range(len(window) - 1, -1, -1) if strip_prefix(window[i]) == last.message)
        return window[start:]


class KernelLog:
    """The kernel-log collector: every `every_s`, new lines become `hw` records of `node`, stamped when read."""

    name = "kernel log"

    def __init__(self, source: LineSource, node: str, *, every_s: float = 0.5, quiet_s: float = 2.0,
                 gpu_of: dict[str, int] | None = None, timer: Any = time.monotonic) -> None:
        self.source, self.node, self.every_s = source, node, every_s
        self.gpu_of = gpu_of or {}  # PCI bus id (nvml.bus_key) -> GPU index
        self._folder = KmsgFolder(quiet_s)
        self._timer = timer

    def poll(self, now: float) -> list[dict[str, Any]]:
        events = self._folder.feed(self.source.read_lines(), self._timer())
        return [to_hw_record(ev, node=self.node, ts=now, gpu=self.gpu_of.get(bus_key(ev.pci)) if ev.pci else None)
                for ev in events]

    def close(self) -> None:
        self.source.close()
