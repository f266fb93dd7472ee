"""What the trainer client's unit tests share: a fake clock, a recording `send`, and the `fake` fixture (import
`fake_clients` to have it) that makes clients without threads, Kafka or real time."""

from __future__ import annotations

import pytest
from gangwatch.producers.trainer import TrainerClient
from gangwatch.schemas import DecodeError, Step, decode

T0 = 1_700_000_000.0


class FakeTime:
    """`clock` (event time) and `timer` (durations) that move only with `advance`."""

    def __init__(self) -> None:
        self.t = 0.0

    def advance(self, s: float) -> None:
        self.t += s

    def clock(self) -> float:
        return T0 + self.t

    def timer(self) -> float:
        return self.t


class Recorder:
    """A `send` that keeps every message; `fail` makes it raise like an unreachable broker."""

    def __init__(self) -> None:
        self.msgs: list[tuple[str, bytes, bytes]] = []
        self.fail = False
        self.calls = 0

    def __call__(self, topic: str, key: bytes, value: bytes) -> None:
        self.calls += 1
        if self.fail:
            raise ConnectionError("broker unreachable")
        self.msgs.append((topic, key, value))

    def records(self, topic: str | None = None) -> list:
        out = [r for t, _, v in self.msgs if topic in (None, t) for r in decode(v)]
        assert not [r for r in out if isinstance(r, DecodeError)]
        return out

    def steps(self) -> list[Step]:
        return [r for r in self.records() if r.kind == "step"]


@pytest.fixture(name="fake")
def fake_clients(tmp_path):
    """A factory of clients with a recorder, fake time and a spool under tmp_path."""
    made = []

    def make(**kw):
        kw.setdefault("job", "j1")
        kw.setdefault("rank", 0)
        kw.setdefault("world_size", 1)
        ft, send = FakeTime(), kw.pop("send", None) or Recorder()
        client = TrainerClient(send=send, clock=ft.clock, timer=ft.timer, background=False, exit_hooks=False,
                               spool_dir=kw.pop("spool_dir", tmp_path / "spool"), **kw)
        made.append(client)
        return client, send, ft

    yield make
    for c in made:
        c.close()
