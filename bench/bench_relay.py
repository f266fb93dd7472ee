"""Benchmark: records per envelope reaching the broker, each rank sending directly vs through the node's relay.

One node's ranks (8, then 64) run in this process as threads, each with its own
trainer client, stepping together (a barrier per step, as a collective makes
them) at 1 step per second in scaled time: `--scale 5` runs 5 steps a real
second, with the clients' flush period, heartbeat period and the relay's linger
shortened as much, so the packing is what it would be at 1 step/s. Both
variants count what reaches a counting `send` in place of Kafka:

- `direct`: every client sends its own batch messages (its 1 s flush);
- `relay`: the clients hand their records to the agent's relay (producers/agent/relay.py,
  a real Unix socket), which packs them into envelopes for its outbox (linger 0.25 s scaled,
  up to 512 records); whatever a client sends itself is counted too.

Figures per variant, over the run until the clients close (their `exit`s at the
end are left out): telemetry messages and records, records per message,
messages per simulated second, and the records the clients of the relay variant
sent (or spooled) themselves instead. Nothing is asserted. On a small machine the
64-rank runs are GIL-bound (about 260 threads): a frame late past the scaled
linger makes an envelope of its own, so those figures are a floor.

`--outage S`: the broker is away for S simulated seconds from a third of the run
on: every send waits 5 s (kafka-python's metadata wait, not scaled) and then
fails; the figures are taken once every spool was sent after it. The relay should
take every record meanwhile (nothing sent directly):

    python3 bench/bench_relay.py [--ranks 8,64] [--seconds 30] [--scale 5] [--outage 0]
    python3 bench/bench_relay.py --ranks 8 --seconds 150 --outage 60
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/ sits beside the packages

from gangwatch.producers.agent.outbox import Outbox  # noqa: E402
from gangwatch.producers.agent.relay import Relay  # noqa: E402
from gangwatch.producers.trainer import TrainerClient  # noqa: E402
from gangwatch.schemas import decode  # noqa: E402

TELEMETRY = "gw.telemetry"


class Counting:
    """A `send` that counts telemetry messages and the records in them; between `away` (monotonic times) it
    waits `HOLD_S` and fails, as kafka-python does while the broker is away."""

    HOLD_S = 5.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.messages = self.records = 0
        self.away = (0.0, 0.0)

    def __call__(self, topic: str, key: bytes, value: bytes) -> None:
        if self.away[0] <= time.monotonic() < self.away[1]:
            time.sleep(self.HOLD_S)
            raise TimeoutError("KafkaTimeoutError: Failed to update metadata after 5.0 secs")
        if topic == TELEMETRY:
            n = len(decode(value))
            with self._lock:
                self.messages += 1
                self.records += n

    def snapshot(self) -> tuple[int, int]:
        with self._lock:
            return self.messages, self.records


def run(ranks: int, relayed: bool, seconds: float, scale: float, outage: float = 0.0) -> dict:
    """One variant: `ranks` clients stepping at 1 simulated step/s for `seconds` simulated seconds, the broker
    away for `outage` of them."""
    counting = Counting()
    with tempfile.TemporaryDirectory(prefix="gw-relay-") as tmp:
        relay = box = None
        if relayed:
            box = Outbox(counting, Path(tmp) / "agent-spool")
            box.start()
            relay = Relay(Path(tmp) / "r.sock", box, linger_s=0.25 / scale)
            relay.start()
        clients = [TrainerClient(job="bench", rank=r, world_size=ranks, local_rank=r, node="n1", send=counting,
                                 relay=relay.path if relay else "off", heartbeat_s=5.0 / scale, flush_s=1.0 / scale,
                                 spool_dir=Path(tmp) / f"rank{r}", exit_hooks=False, announce=False)
                   for r in range(ranks)]
        period, steps = 1.0 / scale, int(seconds)
        collective = threading.Barrier(ranks)
        start = time.monotonic() + 0.5  # every client has connected by then
        if outage:
            counting.away = (start + seconds / 3 / scale, start + (seconds / 3 + outage) / scale)

        def train(c: TrainerClient) -> None:
            for k in range(steps):
                collective.wait()
                time.sleep(max(0.0, start + k * period - time.monotonic()))
                c.step(k)

        threads = [threading.Thread(target=train, args=(c,)) for c in clients]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        time.sleep(2 * period)  # the last step's records reach the send
        backlog = (lambda: bool(box and box.backlog) or any(c.delivery.spool for c in clients))
        deadline = time.monotonic() + 60.0
        while backlog() and time.monotonic() < deadline:  # after an outage: every spool is sent
            time.sleep(period)
        messages, records = counting.snapshot()
        elapsed = time.monotonic() - start
        closers = [threading.Thread(target=c.close, args=(5.0,)) for c in clients]
        for t in closers:
            t.start()
        for t in closers:
            t.join()
        if relay is not None:
            relay.close()
            box.close()
    return {"ranks": ranks, "variant": "relay" if relayed else "direct", "messages": messages, "records": records,
            "per_message": records / max(1, messages), "msgs_per_s": messages / (elapsed * scale),
            "fallback": sum(sum(c.delivery.kinds.values()) for c in clients) if relayed else 0}


def render(rows: list[dict]) -> str:
    out = [f"{'ranks':>5}  {'variant':<7} {'messages':>8} {'records':>8} {'records/msg':>11} {'msgs/s':>8} "
           f"{'sent directly':>13}"]
    for r in rows:
        out.append(f"{r['ranks']:>5}  {r['variant']:<7} {r['messages']:>8} {r['records']:>8} "
                   f"{r['per_message']:>11.1f} {r['msgs_per_s']:>8.2f} {r['fallback']:>13}")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="8,64", help="ranks of the node, comma-separated")
    ap.add_argument("--seconds", type=float, default=30.0, help="simulated seconds (= steps) per variant")
    ap.add_argument("--scale", type=float, default=5.0, help="simulated seconds per real second")
    ap.add_argument("--outage", type=float, default=0.0, help="simulated seconds the broker is away")
    args = ap.parse_args()
    rows = []
    for ranks in (int(n) for n in args.ranks.split(",")):
        for relayed in (False, True):
            rows.append(run(ranks, relayed, args.seconds, args.scale, args.outage))
            print(render(rows[-1:]).splitlines()[-1], flush=True)
    away = f", the broker away for {args.outage:g} s of them" if args.outage else ""
    print(f"\n{args.seconds:.0f} simulated s at 1 step/s{away}, time scaled x{args.scale:g}; msgs/s per simulated "
          "second")
    print(render(rows))


if __name__ == "__main__":
    main()
