"""Benchmark: what the trainer client adds to a training step on CPU, side by side with a bare loop.

Each variant runs the same loop in one process, empty body first (nothing to
hide the cost behind), then a tiny torch model (forward, backward, SGD):

- `bare`: the loop alone;
- `step()`: `client.step(k, loss=...)` at the end of every iteration;
- `context + 2 sections`: `with client.step_context(k):` around
  `with client.section("compute")` and `with client.section("comm_wait")`, the
  full plain-loop instrumentation;
- `context + 1 section` (torch): the same around the model's forward and backward;
- `optimizer hook` (torch): `client.watch_optimizer(opt)`, which also computes
  the gradient norm (a torch op per step).

Figures per variant, in microseconds per step. With the client's threads
running as in training: the loop's own time, the time including the sending
thread (the loop, then `flush()` until every record was built, encoded in a
batch message and handed to `send`, here a function that keeps nothing: no
Kafka), and what that adds over the bare loop. Then the same work split
without threads (`background=False`, so no thread contends for the GIL or a
core): the cost on the training thread, and the sending work per step, which
the threaded client does on another thread. The goal is < 20 us added per
step. Nothing is asserted; compare within one run (on a loaded machine the
threaded figures swing most).

Then a broker that never answers (every send blocks until the run is over; the
tests assert only that steps and close return while it does,
tests/unit/test_trainer_client.py): each `client.step()`'s time on the training
thread (median, p99, worst, in microseconds) and how long `close(timeout_s=0.5)` took.

    python3 bench/bench_trainer.py [--steps 100000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable

from gangwatch.producers.trainer import TrainerClient


def client(spool: str, steps: int, background: bool) -> TrainerClient:
    return TrainerClient(job="bench", rank=0, world_size=1, send=lambda topic, key, value: None, spool_dir=spool,
                         exit_hooks=False, flush_s=0.1, queue_max=steps, background=background)  # holds the whole run


def timed(loop: Callable[[int], None], steps: int, c: TrainerClient | None) -> tuple[float, float]:
    """(us per step on the loop, us per step including the sending thread's flush) of one run."""
    t0 = time.perf_counter()
    loop(steps)
    t1 = time.perf_counter()
    if c is not None:
        c.flush(timeout_s=60)
    t2 = time.perf_counter()
    return (t1 - t0) / steps * 1e6, (t2 - t0) / steps * 1e6


def empty_loops(c: TrainerClient) -> dict[str, Callable[[int], None]]:
    def bare(n: int) -> None:
        for _ in range(n):
            pass

    def step_only(n: int) -> None:
        for k in range(n):
            c.step(k, loss=1.0)

    def sections(n: int) -> None:
        compute, comm = c.section("compute"), c.section("comm_wait")
        for k in range(n):
            with c.step_context(k) as s:
                with compute:
                    pass
                with comm:
                    pass
                s.loss = 1.0

    return {"bare": bare, "step()": step_only, "context + 2 sections": sections}


def torch_loops(c: TrainerClient) -> dict[str, Callable[[int], None]]:
    import torch

    torch.set_num_threads(1)  # a tiny model gains nothing from threads, and they make the figures noisy
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 16)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(8, 16)

    def train(n: int) -> None:
        for _ in range(n):
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()

    def train_sections(n: int) -> None:
        compute = c.section("compute")
        for k in range(n):
            with c.step_context(k) as s:
                with compute:
                    loss = model(x).square().mean()
                    loss.backward()
                opt.step()
                opt.zero_grad()
                s.loss = loss

    def train_hook(n: int) -> None:
        handle = c.watch_optimizer(opt)
        try:
            train(n)
        finally:
            handle.remove()

    return {"bare": train, "context + 1 section": train_sections, "optimizer hook": train_hook}


def measure(steps: int = 100_000, repeat: int = 5) -> dict:
    """`rows`: per loop and variant, us per step (the best of `repeat` rounds; each round runs every variant
    once, so load changes hit all of them); `dropped`: records lost (0 unless the machine could not keep up)."""
    rows = []
    with tempfile.TemporaryDirectory() as spool:
        threaded, inline = client(f"{spool}/t", steps, True), client(f"{spool}/i", steps, False)
        groups = [("empty", empty_loops, steps)]
        try:
            import torch  # noqa: F401

            groups.append(("tiny torch model", torch_loops, max(1, steps // 20)))
        except ImportError:
            pass
        for loop, make, n in groups:
            runs = {c: make(c) for c in (threaded, inline)}
            best = {(c, name): (float("inf"), float("inf")) for c in runs for name in runs[c]}
            for _ in range(repeat):
                for name in runs[threaded]:
                    for c, variants in runs.items():
                        best[c, name] = min(best[c, name], timed(variants[name], n, None if name == "bare" else c))
            bare, bare_inline = best[threaded, "bare"][1], best[inline, "bare"][0]
            for name in runs[threaded]:
                (loop_us, all_us), (inline_loop, inline_all) = best[threaded, name], best[inline, name]
                rows.append({"loop": loop, "variant": name, "steps": n, "loop_us": loop_us, "all_us": all_us,
                             "added_us": all_us - bare, "thread_us": inline_loop - bare_inline,
                             "send_us": inline_all - inline_loop})
        dropped = threaded.dropped + inline.dropped
        threaded.close()
        inline.close()
    return {"rows": rows, "dropped": dropped}


def stuck_broker(steps: int = 20_000) -> dict:
    """A client whose every send blocks until the end: the step's time on the training thread, and close's."""
    import statistics
    import threading

    release = threading.Event()

    def stuck(topic: str, key: bytes, value: bytes) -> None:
        release.wait(60)  # then "sent", quietly: the run is over

    with tempfile.TemporaryDirectory() as spool:
        c = TrainerClient(job="bench", rank=0, world_size=1, send=stuck, spool_dir=spool, exit_hooks=False,
                          flush_s=0.01)
        took = []
        for k in range(steps):
            t0 = time.perf_counter()
            c.step(k, loss=1.0)
            took.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        c.close(timeout_s=0.5)
        closing = time.perf_counter() - t0
        release.set()
    took.sort()
    return {"steps": steps, "median_us": statistics.median(took) * 1e6, "p99_us": took[int(0.99 * (steps - 1))] * 1e6,
            "worst_us": took[-1] * 1e6, "close_s": closing}


def render_stuck(r: dict) -> str:
    return (f"a broker that never answers, {r['steps']:,} steps: step() {r['median_us']:.1f} us median, "
            f"{r['p99_us']:.1f} us p99, {r['worst_us']:.0f} us worst; close(timeout_s=0.5) took {r['close_s']:.2f} s")


def render(result: dict) -> str:
    lines = [f"{'':<46} | {'with the client threads':^35} | {'without threads':^26}",
             f"{'loop':<17} {'variant':<20} {'steps':>7} | {'us/step loop':>12} {'all':>10} {'added':>10} | "
             f"{'training th.':>12} {'sending':>13}"]
    for r in result["rows"]:
        lines.append(f"{r['loop']:<17} {r['variant']:<20} {r['steps']:>7,} | {r['loop_us']:>12.2f} "
                     f"{r['all_us']:>10.2f} {r['added_us']:>10.2f} | {r['thread_us']:>12.2f} {r['send_us']:>13.2f}")
    lines.append(f"(records dropped: {result['dropped']}; goal: < 20 us added per step)")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100_000, help="iterations of the empty loop (torch: 1/20 of it)")
    ap.add_argument("--repeat", type=int, default=5, help="rounds of every variant; the best counts")
    args = ap.parse_args()
    print(render(measure(args.steps, args.repeat)))
    print(render_stuck(stuck_broker(max(1, args.steps // 5))))


if __name__ == "__main__":
    main()
