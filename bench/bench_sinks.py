"""Benchmark: the worker's batch latency with a slow job controller, sinks inline (before) vs queued (after).

The worker's batch path without Kafka: `JobRunner.on_batch` over the messages of
`--jobs` synchronous jobs (each loses a node mid-run and gets a `replace`
action), `--batch` messages per batch, then the sinks exactly as
`streams.workerio.WorkerIO.publish` feeds them (reject, write, flush). The one sink
is the signed webhook; its receiver (a local http.server) sleeps `--sleep` s
(default 5) before answering each POST.

- inline: `WebhookSink(url)` called from the batch (the worker before sinks/queued.py);
- queued: `queued(WebhookSink(url, single_attempt=True))` (the worker now).

Both run inside an asyncio loop like the Faust agent, next to a timer task
every 0.1 s standing in for the silence timer and the consumer's heartbeats:
its worst lateness is how long the event loop was frozen. Reported side by
side: batch latency (median, p99, worst), total time through the input, the
timer's worst lateness, and for the queued run how long after the last batch
the controller had every action. Nothing is asserted.

    PYTHONPATH=. python bench/bench_sinks.py [--jobs 3] [--sleep 5] [--batch 20]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/ sits beside the packages

from gangwatch.schemas.topics import TopicSettings  # noqa: E402
from gangwatch.sinks.queued import queued  # noqa: E402
from gangwatch.sinks.webhook import WebhookSink  # noqa: E402
from gangwatch.streams.runner import JobRunner, Msg  # noqa: E402

from tests.integration.kafkakit import messages, scenario  # noqa: E402

SECRET = "bench-secret"


class SlowController:
    """A job controller that takes `sleep_s` to answer each POST (200)."""

    def __init__(self, sleep_s: float) -> None:
        self.posts = 0
        self.done = threading.Event()
        self.expect = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                time.sleep(sleep_s)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()
                outer.posts += 1
                if outer.posts >= outer.expect:
                    outer.done.set()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/actions"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def batches(jobs: int, size: int) -> tuple[list[list[Msg]], TopicSettings]:
    t = TopicSettings()
    recs = [r for j in range(jobs) for r in scenario(job=f"j{j}", xid_node=None)]
    recs.sort(key=lambda r: r.ts)
    msgs = [Msg(topic, 0, i, key, value) for i, (topic, key, value) in enumerate(messages(recs, t))]
    return [msgs[i:i + size] for i in range(0, len(msgs), size)], t


async def run(mode: str, jobs: int, size: int, sleep_s: float) -> dict[str, Any]:
    parts, t = batches(jobs, size)
    controller = SlowController(sleep_s)
    sink: Any = (WebhookSink(controller.url, SECRET) if mode == "inline"
                 else queued(WebhookSink(controller.url, SECRET, single_attempt=True)))
    runner = JobRunner(t)
    latency: list[float] = []
    late = [0.0]
    stop = asyncio.Event()

    async def timer() -> None:  # the silence timer and the heartbeats share this loop
        every = 0.1
        due = time.perf_counter() + every
        while not stop.is_set():
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            now = time.perf_counter()
            late[0] = max(late[0], now - due)
            due = now + every

    tick = asyncio.create_task(timer())
    actions = 0
    start = time.perf_counter()
    for msgs in parts:
        t0 = time.perf_counter()
        res = runner.on_batch(msgs)
        for dead in res.rejects:
            sink.reject(dead)
        sink.write(res.outputs)
        sink.flush()
        latency.append(time.perf_counter() - t0)
        actions += len(res.outputs.actions)
        await asyncio.sleep(0)  # the agent's next `take()`
    through = time.perf_counter() - start
    controller.expect = actions
    t_end = time.perf_counter()
    delivered = await asyncio.to_thread(controller.done.wait, actions * sleep_s + 30) if actions else True
    after = time.perf_counter() - t_end
    stop.set()
    await tick
    if mode == "queued":
        sink.close()
    controller.close()
    latency.sort()
    return {"mode": mode, "batches": len(latency), "actions": actions, "posts": controller.posts,
            "p50_ms": statistics.median(latency) * 1e3, "p99_ms": latency[int(0.99 * (len(latency) - 1))] * 1e3,
            "max_ms": latency[-1] * 1e3, "through_s": through, "frozen_s": late[0],
            "delivered_after_s": after if delivered else float("nan")}


def render(rows: list[dict[str, Any]]) -> str:
    head = (f"{'sinks':<8} {'batches':>7} {'actions':>7} {'batch p50':>10} {'p99':>10} {'worst':>10} "
            f"{'input done':>10} {'loop frozen':>11} {'all POSTed':>10}")
    lines = [head]
    for r in rows:
        lines.append(f"{r['mode']:<8} {r['batches']:>7} {r['actions']:>7} {r['p50_ms']:>8.2f}ms {r['p99_ms']:>8.2f}ms "
                     f"{r['max_ms']:>8.0f}ms {r['through_s']:>9.2f}s {r['frozen_s']:>10.2f}s "
                     f"{r['delivered_after_s']:>+9.2f}s")
    a, b = rows
    lines.append(f"inline / queued: worst batch {a['max_ms'] / max(b['max_ms'], 1e-9):,.0f}x, "
                 f"input {a['through_s'] / max(b['through_s'], 1e-9):,.1f}x, "
                 f"loop frozen {a['frozen_s'] / max(b['frozen_s'], 1e-9):,.0f}x "
                 f"('all POSTed': after the last batch, until the controller had every action)")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=3, help="jobs (one replace action each)")
    ap.add_argument("--sleep", type=float, default=5.0, help="seconds the controller takes per POST")
    ap.add_argument("--batch", type=int, default=20, help="messages per worker batch")
    args = ap.parse_args()
    rows = [asyncio.run(run(mode, args.jobs, args.batch, args.sleep)) for mode in ("inline", "queued")]
    print(f"== worker batch path, webhook controller answering in {args.sleep:g} s per POST", flush=True)
    print(render(rows), flush=True)


if __name__ == "__main__":
    main()
