"""JSONL outputs of a replay: findings, actions, incidents and rejected lines."""

from __future__ import annotations

from pathlib import Path
from typing import Any, BinaryIO

import orjson

from schemas import DecodeError, Record, encode


class JsonlSink:
    """Appends contract records (or plain dicts) to one JSONL file, one per line."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fh: BinaryIO = open(path, "wb")
        self.count = 0

    def write(self, rec: Record) -> None:
        self._fh.write(encode(rec) + b"\n")
        self.count += 1

    def write_obj(self, obj: dict[str, Any]) -> None:
        self._fh.write(orjson.dumps(obj) + b"\n")
        self.count += 1

    def close(self) -> None:
        self._fh.close()


def rejected_obj(err: DecodeError, source: str, line: int | None) -> dict[str, Any]:
    """The dead-letter form of a rejected message: where it came from, why, and its text."""
    return {"source": source, "line": line, **err.to_dict()}
