"""The backlog of messages that could not be sent yet: bounded, in order, on local disk.

When the broker is away the sending thread appends each message to the spool
instead; when it is back, the spool is sent first, oldest message first, and
only then new messages, so the broker receives everything in the order it was
produced. The spool survives the process: a restarted rank of the same job
finds its predecessor's backlog in the same directory and sends it first.

Layout: a directory of segment files `000000000001.spool`, `...2.spool`, oldest
first, one message per line: `<topic> <records> <JSON value>\\n` (a compact JSON
value has no raw newline). A segment is deleted once every line of it was
sent. When the files together exceed `max_bytes`, the oldest segment is
deleted unsent and its records counted as dropped: a long outage loses the
oldest telemetry, never the newest.

One thread uses a spool (the client's sending thread); it is not thread-safe.
Delivery is at least once: a message whose send failed after the broker had
stored it is sent again, and so is the sent part of the oldest segment when a
process dies without `close()` (which cuts that part off).
"""

from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import BinaryIO

Message = tuple[str, int, bytes]  # (topic, records in it, value)
_PATTERN = "[0-9]" * 12 + ".spool"  # segment files: a 12-digit sequence number


class Spool:
    """Messages waiting for the broker, oldest first, in files under `directory`."""

    def __init__(self, directory: Path, max_bytes: int = 64 << 20) -> None:
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self._segment_bytes = max(4096, max_bytes // 8)
        # oldest first; a predecessor's leftovers come before anything this process writes
        self._segments: deque[Path] = deque(sorted(self.directory.glob(_PATTERN)))
        self._sizes = {p: p.stat().st_size for p in self._segments}
        self._next = int(self._segments[-1].stem) + 1 if self._segments else 1
        self._tail: BinaryIO | None = None  # the segment being written (the newest), open for append
        self._ready: deque[tuple[Message, int]] = deque()  # parsed lines of the head segment, with their size
        self._read_pos = 0  # bytes of the head segment already sent or parsed into `_ready`

    def __bool__(self) -> bool:
        return bool(self._segments)

    @property
    def bytes(self) -> int:
        return sum(self._sizes.values())

    # --- writing -----------------------------------------------------------------------------------

    def append(self, msg: Message) -> int:
        """Add a message at the end; returns how many records older segments lost to make room."""
        topic, count, value = msg
        line = b"%s %d %s\n" % (topic.encode(), count, value)
        if self._tail is None or self._sizes[self._segments[-1]] >= self._segment_bytes:
            self._open_segment()
        self._tail.write(line)
        self._tail.flush()
        self._sizes[self._segments[-1]] += len(line)
        dropped = 0
        while self.bytes > self.max_bytes and len(self._segments) > 1:
            dropped += self._drop_head()
        return dropped

    def _open_segment(self) -> None:
        if self._tail is not None:
            self._tail.close()
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"{self._next:012d}.spool"
        self._next += 1
        self._tail = open(path, "ab")  # stays open while it is the newest segment
        self._segments.append(path)
        self._sizes[path] = 0

    def _drop_head(self) -> int:
        """Delete the oldest segment unsent; the number of records it still held."""
        lost = sum(msg[1] for msg, _ in self._parse_head()[0])
        self._remove_head()
        return lost

    # --- reading -----------------------------------------------------------------------------------

    def peek(self) -> Message | None:
        """The oldest message not yet sent (None when the spool is empty)."""
        while self._segments:
            if self._fill():
                return self._ready[0][0]
            self._remove_head()  # fully sent (or only a torn last line left by a crash)
        return None

    def pop(self) -> None:
        """The message `peek` returned was sent: forget it."""
        _, size = self._ready.popleft()
        self._read_pos += size
        if not self._ready and self._read_pos >= self._sizes[self._segments[0]]:
            self._remove_head()

    def _fill(self) -> bool:
        """Parse the unread lines of the head segment into `_ready`; False when it has none."""
        if not self._ready:
            ready, skipped = self._parse_head()
            self._ready.extend(ready)
            self._read_pos += skipped
        return bool(self._ready)

    def _parse_head(self) -> tuple[list[tuple[Message, int]], int]:
        """The complete lines of the head segment after `_read_pos`, each with its size in bytes, and the
        bytes of damaged lines (left by a crash mid-write) before the first good one."""
        try:
            with open(self._segments[0], "rb") as f:
                f.seek(self._read_pos)
                data = f.read()
        except FileNotFoundError:  # removed behind our back (a temp-dir cleaner): nothing left to send
            return [], 0
        lines: list[tuple[Message, int]] = []
        skipped = pos = 0
        while (end := data.find(b"\n", pos)) >= 0:
            size = end + 1 - pos
            try:
                topic, count, value = data[pos:end].split(b" ", 2)
                lines.append(((topic.decode(), int(count), value), size))
            except ValueError:  # damaged: consumed with the line before it, or skipped
                if lines:
                    lines[-1] = (lines[-1][0], lines[-1][1] + size)
                else:
                    skipped += size
            pos = end + 1
        return lines, skipped

    def _remove_head(self) -> None:
        head = self._segments.popleft()
        if not self._segments and self._tail is not None:  # the head was also the segment being written
            self._tail.close()
            self._tail = None
        head.unlink(missing_ok=True)
        del self._sizes[head]
        self._ready.clear()
        self._read_pos = 0

    def close(self) -> None:
        """Close the files; a half-sent oldest segment is cut to its unsent part, for the next process."""
        if self._tail is not None:
            self._tail.close()
            self._tail = None
        if self._segments and self._read_pos:
            head = self._segments[0]
            rest = head.read_bytes()[self._read_pos:]
            cut = head.with_suffix(".cut")
            cut.write_bytes(rest)
            cut.replace(head)
            self._sizes[head], self._read_pos = len(rest), 0
            self._ready.clear()
