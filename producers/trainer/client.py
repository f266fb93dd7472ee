"""`TrainerClient`: what a training process creates once and calls every step.

Two threads do the work besides training, so that no call on the training
thread waits for the network, the disk or the GPU:

- the *heartbeat* thread puts a `heartbeat` record in the control queue every
  `heartbeat_s` (the period also announced in the `job` record), whatever the
  training loop is doing, with the last finished step and, once anything was
  lost, `dropped`: the number of records lost so far;
- the *sending* thread wakes every `flush_s` (or at once for a heartbeat or an
  event), turns queued steps into `step` records (once their CUDA events have
  completed), and hands everything to `Delivery` (delivery.py): one `batch`
  message per topic, or the spool while the broker is away.

The node's relay: when a relay is named (`relay=` or `GANGWATCH_RELAY`: the
socket the node agent listens on, relay.py) and answers, the sending thread hands
its records to the relay instead, which packs the records of every rank of the
node into large envelopes. While connected, the sending thread also wakes for
every step and the heartbeats fall on multiples of `heartbeat_s` on the wall
clock, so the ranks' steps, and their heartbeats, reach the relay together and
share envelopes. What the relay does not take (absent, gone, full, no answer),
and everything while this client's own spool holds a backlog (so a rank's
records stay in order), goes to `Delivery` as above; the relay is tried again
every few seconds.

The training thread only appends to two in-memory queues. The step queue is
bounded (`queue_max`): when the sending thread cannot keep up, the *oldest*
step is dropped and counted. The control queue (heartbeats, framework events,
the job record) is never dropped; it grows by one record per heartbeat period
at most, and the sending thread empties it every flush.

Exit: `close()` (also registered with `atexit`) queues, unless a signal
stopped the rank (below), a `framework` record of type `exit` with `code` 0
(the rank finished: when every rank of a job sends one, the job ended and its
silence is no fault), stops the heartbeats and sends
what is left, waiting at most `timeout_s`; whatever cannot be sent by then
stays in the spool for the next process of this job and rank. An uncaught
exception instead queues a `framework` record of type `exception` with its
message (a `sys.excepthook` that then calls the previous hook), and no clean exit.

Signals: SIGTERM and SIGINT (a scheduler's preemption, a user's kill or Ctrl-C)
are a stop on purpose, not a crash. With `signal_hooks` (on with `exit_hooks`,
and only when the client is made on the main thread) each queues a `lifecycle`
record `stop` naming the signal, sends it waiting at most `signal_flush_s`
(2 s), then hands the signal on: to the previous handler when it was a Python
one (SIGINT's default raises KeyboardInterrupt, as before), else the default
action is restored and the signal raised again, so the process still dies by
it. A handler the process had ignored (SIG_IGN) stays ignored. A child forked
after the client (a DataLoader worker) inherits the hooks but says nothing: it
only passes the signal on.

A Python handler runs only once the main thread is back in the interpreter: a
rank blocked in a C call that retries on EINTR (a gloo or NCCL collective whose
peers are dying, as torchrun stops a job) would never get there before
torchrun's SIGKILL, and its `stop` would never go out. So the client also takes
the process's signal wakeup fd (`signal.set_wakeup_fd`), to which CPython's C
handler writes each signal the moment it arrives: a thread of the client's own
(`gangwatch-signals`) reads it and says the stop at once, and the handler, once
the main thread gets to it, only passes the signal on (exactly one `stop` goes
out, whichever sees the signal first). Where the program holds the wakeup fd
already (an asyncio loop on the main thread), it stays theirs and the stop waits
for the handler, as without it.

Known pauses: `with client.pause("checkpoint"):` around a synchronous save (or
an evaluation pass) sends `lifecycle` `pause` before and `resume` after, so a
rank that stops stepping for a while on purpose is not taken for hung; the
heartbeats go on meanwhile.

Metrics: with `GANGWATCH_METRICS_PORT` set (or `metrics_port=`), the process serves
Prometheus metrics on that port plus `LOCAL_RANK` (so the ranks of one node do not
collide): queues, losses, the last step, records by kind and the delivery's counts
(producers/metrics.py). Off by default; prometheus-client is imported only then,
and without it the client logs one line and trains on.

Spool: what cannot be sent while the broker is away waits on local disk in
`spool_dir`, default `<temp dir>/gangwatch-spool/<job>/rank<rank>`
(`default_spool_dir`; `/tmp/...` unless `TMPDIR` names another temp dir), at
most `spool_bytes` (64 MiB) per rank. Pass `spool_dir=` to put it elsewhere (one
folder per rank); there is no variable of the client's own for it
(`GANGWATCH_SPOOL_DIR` is the node agent's `--spool-dir`). docs/training-loop-author.md says the same.

For tests: `send=` replaces Kafka, `clock=` (event time) and `timer=`
(durations) replace real time, and `background=False` starts no thread:
`flush()` and `heartbeat()` then run on the caller's thread.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import signal
import socket
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from gangwatch.producers import metrics
from gangwatch.producers.trainer.delivery import Delivery, KafkaSend, Send
from gangwatch.producers.trainer.jobrecord import job_record
from gangwatch.producers.trainer.launch import Launch
from gangwatch.producers.trainer.loop import StepContext
from gangwatch.producers.trainer.optimizer import watch_optimizer
from gangwatch.producers.trainer.relay import RELAY_ENV, RelayLink, relay_path
from gangwatch.producers.trainer.sections import CpuSection, CudaPair, CudaSection, EventPool, resolve
from gangwatch.producers.trainer.spool import Spool
from gangwatch.schemas import Framework, Heartbeat, Lifecycle, Record, Step

log = logging.getLogger("gangwatch.trainer")
STEP_SECTIONS = ("compute", "comm_wait", "data_wait")  # sections with a field of their own in `step` records
STOP_SIGNALS = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "SIGINT"}  # what a stop on purpose arrives as


class TrainerClient:
    """Steps, heartbeats and events of one rank, sent to Kafka without ever holding up training.

    Topology (rank 0 announces it in a `job` record): `tp`, `pp` and `order` place
    each rank in its parallel groups (topology.py); `nodes` names the nodes when
    torch.distributed is not initialised yet; `gpus=False` for a job without GPUs.
    Identity: `job`, `rank`, `world_size`, `local_rank`, `local_world_size` and
    `node` override what the launcher's environment says (launch.py).
    Delivery: `bootstrap` (default `GANGWATCH_BOOTSTRAP`) or a `send` function;
    `spool_dir` (default `<tmp>/gangwatch-spool/<job>/rank<rank>`) and its bound
    `spool_bytes`; `relay`: the node relay's socket, or "off" (default `GANGWATCH_RELAY`; unset: no relay,
    records go to Kafka directly; with `send=` given, no relay unless `relay` names one). `cuda=True` times
    sections with CUDA events. `metrics_port` (default `GANGWATCH_METRICS_PORT`, 0 = off) serves
    Prometheus metrics on that port + local rank.
    Hooks: `exit_hooks` (atexit, sys.excepthook) and `signal_hooks` (SIGTERM, SIGINT; default: as
    `exit_hooks`), which send a `stop` within `signal_flush_s` and then pass the signal on; the `stop` goes out
    from the `gangwatch-signals` thread (the signal wakeup fd) even while the main thread is blocked in C.
    """

    def __init__(self, *, tp: int = 1, pp: int = 1, order: str = "tp-dp-pp", nodes: Sequence[str] | None = None,
                 gpus: bool = True, job: str | None = None, rank: int | None = None, world_size: int | None = None,
                 local_rank: int | None = None, local_world_size: int | None = None, node: str | None = None,
                 bootstrap: str | None = None, send: Send | None = None, relay: str | Path | None = None,
                 topic_prefix: str | None = None,
                 heartbeat_s: float = 5.0, flush_s: float = 1.0, queue_max: int = 10_000, batch_max: int = 1000,
                 spool_dir: str | Path | None = None, spool_bytes: int = 64 << 20, cuda: bool = False,
                 announce: bool = True, background: bool = True, exit_hooks: bool = True,
                 signal_hooks: bool | None = None, signal_flush_s: float = 2.0,
                 metrics_port: int | None = None, clock: Callable[[], float] = time.time,
                 timer: Callable[[], float] = time.perf_counter) -> None:
        self.launch = Launch.from_env(job=job, rank=rank, world_size=world_size, local_rank=local_rank,
                                      local_world_size=local_world_size, node=node, bootstrap=bootstrap,
                                      topic_prefix=topic_prefix)
        if relay is None and send is not None:
            relay = "off"  # the caller's `send` (a test's) is where records go
        if send is None:
            if not self.launch.bootstrap:
                raise ValueError("no Kafka address: set GANGWATCH_BOOTSTRAP or pass bootstrap= (or send=)")
            send = KafkaSend(self.launch.bootstrap)
        named = os.environ.get(RELAY_ENV, "").strip() if relay is None else relay
        path = relay_path(named, self.launch.node) if named else None  # a relay only where one is named
        self.relay = RelayLink(path, timer=timer) if path is not None else None
        if self.relay is not None:
            self.relay.connect()  # now, so the heartbeats align from the first (`_until_heartbeat`)
        self._clock, self._timer = clock, timer
        self.heartbeat_s, self._flush_s, self._queue_max = heartbeat_s, flush_s, queue_max
        spool = Spool(Path(spool_dir) if spool_dir else default_spool_dir(self.launch), spool_bytes)
        self.delivery = Delivery(send, self.launch.job, spool, batch_max=batch_max, clock=timer)

        # training thread -> sending thread
        self._lock = threading.Lock()
        self._steps: deque[tuple] = deque()  # finished steps, bounded by queue_max (oldest dropped)
        self._control: deque[Record] = deque()  # heartbeats, events, the job record: never dropped
        self._dropped = 0  # steps dropped from the full queue
        self._waiting: deque[tuple] = deque()  # sending thread only: steps whose CUDA events are pending

        # the step being timed (training thread only)
        self._totals: dict[str, float] = {}  # wall-clock seconds per section name
        self._pairs: list[CudaPair] = []  # CUDA event pairs per section
        self._events = EventPool() if cuda else None
        self._sections: dict[str, CpuSection | CudaSection] = {}
        self._created = timer()
        self._last_end: float | None = None  # when the previous step ended (timer)
        self.last_step: int | None = None

        # records that must exist before the first step: the topology (rank 0) and "I am alive"
        if announce:  # every rank builds it (placing the ranks may be a collective); rank 0 sends it
            job_rec = job_record(self.launch, clock(), heartbeat_s, tp=tp, pp=pp, order=order, nodes=nodes,
                                 gpus=gpus)
            if self.launch.rank == 0:
                self._control.append(job_rec)

        # the threads, and how they are told to flush or stop
        self._background = background
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._flushed = threading.Condition()
        self._flush_asked = self._flush_done = 0
        self._close_deadline: float | None = None
        self._closed = False
        self._threads: list[threading.Thread] = []
        self.heartbeat()
        if background:
            for target, name in ((self._send_loop, "gangwatch-send"), (self._heartbeat_loop, "gangwatch-heartbeat")):
                t = threading.Thread(target=target, name=name, daemon=True)
                t.start()
                self._threads.append(t)
        self._hook = None
        self._crashed = False  # an uncaught exception was reported: no clean `exit` at close
        if exit_hooks:
            self._install_exit_hooks()
        self._signal_flush_s = signal_flush_s
        self._previous_signals: dict[int, Any] = {}  # signal -> the handler ours replaced
        self.stopped_by: str | None = None  # the signal that stopped this rank, once one did
        self._stop_claim = threading.Lock()  # taken once and never let go, by whoever says the stop (`_claim_stop`)
        self._stop_said = threading.Event()  # the stop went out, or saying it gave up
        self._signal_watch: _SignalWatch | None = None  # the wakeup fd's thread, while this client holds it
        if exit_hooks if signal_hooks is None else signal_hooks:
            self._install_signal_hooks()
        port = metrics.port_from_env() if metrics_port is None else metrics_port
        if port:
            metrics.COLLECTOR.watch(self, metric_samples)
            metrics.start(port + self.launch.local_rank, f"trainer client of rank {self.launch.rank}")

    # --- what the training loop calls ------------------------------------------------------------

    def section(self, name: str) -> CpuSection | CudaSection:
        """A context manager timing part of the current step: `compute`, `comm_wait`, `data_wait`, or any name.

        Other names travel in the step record's extra fields as `<name>_s`.
        """
        timer = self._sections.get(name)
        if timer is None:
            if self._events is None or name == "data_wait":
                timer = CpuSection(name, self._totals, self._timer)
            else:
                timer = CudaSection(name, self._pairs, self._events)
            self._sections[name] = timer
        return timer

    def begin_step(self) -> None:
        """The step's work starts now: the time since the previous step ended counts as `data_wait`."""
        now = self._timer()
        if self._last_end is None:
            self._last_end = now  # the first step is timed from here
        else:
            self._totals["data_wait"] = self._totals.get("data_wait", 0.0) + now - self._last_end

    def step_context(self, step: int) -> StepContext:
        """`with client.step_context(step) as s: ...` = begin_step(), the body, then step(); see loop.py."""
        return StepContext(self, step)

    def step(self, step: int, *, loss: Any = None, grad_norm: Any = None, replica_digest: str | None = None,
             **extra: Any) -> None:
        """Step `step` is finished: queue its record (step_s = time since the previous step ended).

        `loss` and `grad_norm` may be tensors: they are read on the sending thread, so
        passing a CUDA tensor costs no synchronization here. `extra`: plain JSON values.
        """
        now = self._timer()
        start = self._created if self._last_end is None else self._last_end
        self._last_end = now
        self.last_step = step = int(step)
        totals = self._totals.copy()
        self._totals.clear()
        pairs = None
        if self._pairs:
            pairs = self._pairs.copy()
            self._pairs.clear()
        item = (self._clock(), step, now - start, totals, pairs, _detached(loss), _detached(grad_norm),
                replica_digest, extra, _mono(now))
        with self._lock:
            if len(self._steps) >= self._queue_max:
                self._steps.popleft()
                self._dropped += 1
            self._steps.append(item)
        if self.relay is not None and self.relay.connected:
            self._wake.set()  # the ranks' steps reach the relay together

    def event(self, type: str, message: str | None = None, **fields: Any) -> None:
        """A `framework` record (nccl_timeout, exception, oom, ...; `op`, `seq`, `pg`, `peer`), sent at once.

        Fields the record does not declare (e.g. `code=1`) travel in its `extra`: a typo never raises here.
        """
        extra = dict(fields.pop("extra", None) or {})
        extra.update({k: fields.pop(k) for k in [k for k in fields if k not in _FRAMEWORK_FIELDS]})
        self._control.append(Framework(ts=self._clock(), job=self.launch.job, rank=self.launch.rank, type=type,
                                       message=message, extra=extra, **fields))
        self._wake.set()

    def pause(self, reason: str = "checkpoint") -> Pause:
        """`with client.pause("checkpoint"): save(...)`: a known pause of this rank (a synchronous checkpoint
        save, an evaluation pass), sent as `lifecycle` `pause` on entering and `resume` on leaving (also when
        the body raises). Only as a context manager: calling it alone sends nothing. Heartbeats go on."""
        return Pause(self, reason)

    def lifecycle(self, event: str, reason: str | None = None) -> None:
        """A `lifecycle` record of this rank (`pause`, `resume`, `stop`, ...; source `trainer`), sent at once."""
        self._control.append(Lifecycle(ts=self._clock(), job=self.launch.job, event=event, rank=self.launch.rank,
                                       reason=reason, source="trainer"))
        self._wake.set()

    def heartbeat(self) -> None:
        """Queue a heartbeat now (the heartbeat thread calls this every `heartbeat_s`)."""
        dropped = self.dropped
        self._control.append(Heartbeat(ts=self._clock(), job=self.launch.job, rank=self.launch.rank,
                                       step=self.last_step, mono=_mono(self._timer()),
                                       extra={"dropped": dropped} if dropped else {}))
        self._wake.set()

    def watch_optimizer(self, optimizer: Any, **options: Any) -> Any:
        """Report a step after every `optimizer.step()`; see optimizer.py for `options`."""
        return watch_optimizer(self, optimizer, **options)

    @property
    def dropped(self) -> int:
        """Records lost so far: steps dropped from the full queue, and records the spool had to give up."""
        return self._dropped + self.delivery.dropped

    def queue_depths(self) -> dict[str, int]:
        """Records waiting for the sending thread: `steps` (finished, or waiting for their CUDA events) and
        `control` (heartbeats, events, the job record). Safe from any thread."""
        return {"steps": len(self._steps) + len(self._waiting), "control": len(self._control)}

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Send (or spool) everything queued; False if the sending thread did not finish within `timeout_s`."""
        if self._closed:
            return False
        if not self._background:
            self._cycle()
            return True
        with self._flushed:
            self._flush_asked += 1
            ticket = self._flush_asked
        self._wake.set()
        with self._flushed:
            return self._flushed.wait_for(lambda: self._flush_done >= ticket, timeout_s)

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the heartbeats and send what is left (waiting at most `timeout_s`); safe to call twice."""
        if self._closed:
            return
        if not self._crashed and self.stopped_by is None:  # a rank stopped by a signal said `stop` instead
            self.event("exit", "closed", extra={"code": 0})
        self._closed = True
        self._remove_exit_hooks()
        metrics.COLLECTOR.unwatch(self)
        self._close_deadline = self._timer() + 0.8 * timeout_s  # sending stops here; the rest stays spooled
        self._stop.set()
        self._wake.set()
        if self._background:
            for t in self._threads:
                t.join(timeout_s)
        else:
            self._final_cycle()

    # --- the sending thread ----------------------------------------------------------------------

    def _send_loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self._flush_s)
            self._wake.clear()
            with self._flushed:
                ticket = self._flush_asked
            self._cycle()
            with self._flushed:
                self._flush_done = ticket
                self._flushed.notify_all()
        self._final_cycle()

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(self._until_heartbeat()):
            self.heartbeat()

    def _until_heartbeat(self) -> float:
        """Seconds to the next heartbeat: a period; while the node's relay is in use, to the next multiple of the
        period on the wall clock instead (never more than a period), so the ranks of the node beat together and
        the relay packs their heartbeats into one envelope instead of one each."""
        if self.relay is not None and self.relay.connected:
            return self.heartbeat_s - self._clock() % self.heartbeat_s
        return self.heartbeat_s

    def _cycle(self, final: bool = False) -> None:
        """Collect what the training thread queued and deliver it; never raises."""
        try:
            recs = self._collect(wait_gpu=final)
            jobs = [r for r in recs if r.kind == "job"]
            telemetry = sorted((r for r in recs if r.kind != "job"), key=lambda r: r.ts)
            by_topic = [(self.launch.topics.jobs, jobs), (self.launch.topics.telemetry, telemetry)]
            ts, deadline = self._clock(), self._close_deadline if final else None
            if (self.relay is None or self.delivery.spool  # an own backlog first: the rank's records in order
                    or not self.relay.hand_over([(t, r) for t, r in by_topic if r], ts, deadline)):
                self.delivery.deliver(by_topic, ts=ts, deadline=deadline)
        except Exception:
            log.exception("gangwatch: a flush failed; training goes on")

    def _final_cycle(self) -> None:
        self._cycle(final=True)
        try:
            if self.relay is not None:
                self.relay.close()
            send_close = getattr(self.delivery.send, "close", None)
            if send_close is not None:
                send_close()
            self.delivery.spool.close()
        except Exception:
            log.exception("gangwatch: closing failed")

    def _collect(self, wait_gpu: bool) -> list[Record]:
        recs: list[Record] = []  # steps first: on a tie in time the step came before the heartbeat naming it
        with self._lock:
            self._waiting.extend(self._steps)
            self._steps.clear()
        lost = 0
        while self._waiting:
            try:
                rec = self._step_record(self._waiting[0], wait_gpu)
            except Exception as e:  # e.g. a loss that is not one number
                log.warning("gangwatch: step record dropped: %s: %s", type(e).__name__, e)
                self._waiting.popleft()
                lost += 1
                continue
            if rec is None:  # the GPU has not got there yet; later steps wait behind it
                break
            self._waiting.popleft()
            recs.append(rec)
        while len(self._waiting) > self._queue_max:
            self._waiting.popleft()
            lost += 1
        if lost:
            with self._lock:
                self._dropped += lost
        while self._control:  # popleft is atomic: appends from other threads are never lost
            recs.append(self._control.popleft())
        return recs

    def _step_record(self, item: tuple, wait_gpu: bool) -> Step | None:
        ts, step, step_s, totals, pairs, loss, grad_norm, digest, extra, mono = item
        if pairs:
            gpu = resolve(pairs, wait=wait_gpu)
            if gpu is None:
                return None
            self._events.give_back(pairs)
            for name, secs in gpu.items():
                totals[name] = totals.get(name, 0.0) + secs
        fields: dict[str, float] = {}
        extra = dict(extra)
        for name, secs in totals.items():
            (fields if name in STEP_SECTIONS else extra)[f"{name}_s"] = secs
        return Step(ts=ts, job=self.launch.job, rank=self.launch.rank, step=step, step_s=step_s,
                    loss=_number(loss), grad_norm=_number(grad_norm), replica_digest=digest, mono=mono, extra=extra,
                    **fields)

    # --- process exit ------------------------------------------------------------------------------

    def _install_exit_hooks(self) -> None:
        previous = sys.excepthook

        def hook(etype: type[BaseException], value: BaseException, tb: Any) -> None:
            if not (self.stopped_by and issubclass(etype, KeyboardInterrupt)):  # Ctrl-C's own exception: no crash
                self._crashed = True
                self.event("exception", f"{etype.__name__}: {value}"[:65_536])
            previous(etype, value, tb)

        self._hook, self._previous_hook = hook, previous
        sys.excepthook = hook
        atexit.register(self.close)

    def _remove_exit_hooks(self) -> None:
        self._remove_signal_hooks()
        if self._hook is None:
            return
        if sys.excepthook is self._hook:
            sys.excepthook = self._previous_hook
        atexit.unregister(self.close)
        self._hook = None

    def _install_signal_hooks(self) -> None:
        """SIGTERM and SIGINT: say `stop`, then pass the signal on (signal handlers can only be set from the
        main thread: a client made elsewhere installs none). With them, the signal wakeup fd and its thread
        (`_SignalWatch`), so the stop is said even while the main thread is blocked in C."""
        if threading.current_thread() is not threading.main_thread():
            log.info("gangwatch: client made off the main thread: no SIGTERM/SIGINT hooks")
            return
        self._pid = os.getpid()  # a forked child (a DataLoader worker) inherits the hooks, not the client's threads
        for sig in STOP_SIGNALS:
            try:
                previous = signal.getsignal(sig)
                signal.signal(sig, self._on_signal)
            except (ValueError, OSError, RuntimeError) as e:  # not the main interpreter, an embedded Python, ...
                log.info("gangwatch: no hook for %s: %s", STOP_SIGNALS[sig], e)
                continue
            self._previous_signals[sig] = previous
        if self._previous_signals:
            self._signal_watch = _SignalWatch.start(self._on_wakeup)

    def _remove_signal_hooks(self) -> None:
        if self._signal_watch is not None and self._signal_watch.stop():
            self._signal_watch = None
        for sig, previous in list(self._previous_signals.items()):
            try:
                if signal.getsignal(sig) == self._on_signal:
                    signal.signal(sig, previous)
                    del self._previous_signals[sig]
            except (ValueError, OSError, RuntimeError):
                pass  # not on the main thread: ours stays, and only passes signals on from now

    def _claim_stop(self, signum: int) -> bool:
        """Whether the caller is the one to say this rank's stop for `signum` (and `stopped_by` is now set): each
        signal reaches both `_on_signal` (main thread) and `_on_wakeup` (the `gangwatch-signals` thread), and
        exactly one `stop` goes out. Not in a forked child, nor once closed. The claim is a lock taken once and
        never let go: a non-blocking acquire is atomic and never waits, so a handler that runs on a thread in the
        middle of a claim cannot hang it."""
        if self._closed or os.getpid() != self._pid or not self._stop_claim.acquire(blocking=False):
            return False
        self.stopped_by = STOP_SIGNALS.get(signum, f"signal {signum}")
        return True

    def _say_stop(self) -> None:
        try:
            self.lifecycle("stop", self.stopped_by)
            self.flush(self._signal_flush_s)
        except Exception:
            log.exception("gangwatch: the stop record could not be sent")
        finally:
            self._stop_said.set()

    def _on_wakeup(self, signum: int) -> None:
        """A signal, on the `gangwatch-signals` thread the moment it arrived: a stop is said from here (waiting
        at most `signal_flush_s`), whatever the main thread is doing; `_on_signal` passes the signal on once the
        main thread gets to it. Only for a signal whose handler is still ours: a handler set after the client's,
        not chaining to it, decides alone what the signal means, as it does without this thread."""
        if signum in STOP_SIGNALS and signal.getsignal(signum) == self._on_signal and self._claim_stop(signum):
            self._say_stop()

    def _on_signal(self, signum: int, frame: Any) -> None:
        """A stop on purpose: the `stop` record goes out (waiting at most `signal_flush_s`), then the signal is
        handed on as if this hook were not there; it is never swallowed. It is handed on also when another
        signal's handler raises meanwhile (torchrun's SIGTERM reaches a rank's DataLoader workers too, and
        PyTorch's SIGCHLD handler raises "worker killed" in the rank): the rank dies of the stop, not of that."""
        previous = self._previous_signals.get(signum, signal.SIG_DFL)
        try:
            if not self._closed and os.getpid() == self._pid:
                if self._claim_stop(signum):  # else the `gangwatch-signals` thread says it (or said it already)
                    # said from a thread of its own: this one may have been interrupted inside the client, holding
                    # a lock that is not reentrant (the `_wake` event's, in a step's `set()`), and taking it again
                    # here would hang it for good; at worst the stop is queued and goes out once the interrupted
                    # code lets go
                    threading.Thread(target=self._say_stop, name="gangwatch-stop", daemon=True).start()
                self._stop_said.wait(self._signal_flush_s)  # whoever says it: out before the signal goes on
        finally:
            if callable(previous):
                previous(signum, frame)  # an exception it raises (KeyboardInterrupt) replaces one raised meanwhile
            elif previous != signal.SIG_IGN:  # SIG_DFL (or a handler Python did not install: None): the default
                try:  # action, e.g. die by SIGTERM
                    signal.signal(signum, signal.SIG_DFL)
                except (ValueError, OSError, RuntimeError):
                    pass
                os.kill(os.getpid(), signum)


class _SignalWatch:
    """This process's signal wakeup fd (`signal.set_wakeup_fd`) and the thread that reads it, `gangwatch-signals`.

    CPython's C signal handler writes each signal's number, one byte, to the wakeup fd the moment the signal
    arrives, on whatever thread, while the Python handler waits for the main thread to come back to the
    interpreter (which a rank blocked in a collective that retries on EINTR never does before torchrun's
    SIGKILL). The thread calls `on_signal(signum)` for every byte: every signal that has a Python handler, not
    only the stops. The write end is non-blocking, as `set_wakeup_fd` requires: the C handler never waits.

    A process has one wakeup fd: where it is taken already (an asyncio loop on the main thread) no watch is made
    and theirs stays. A forked child (a DataLoader worker) inherits the setting but not the thread, and its signals
    would land in this process's socket: the child gives the wakeup fd up as the fork returns (`_forget_in_child`).
    """

    current: _SignalWatch | None = None  # the watch holding this process's wakeup fd, if any

    def __init__(self, on_signal: Callable[[int], None]) -> None:
        self._on_signal = on_signal
        self._reader, self._writer = socket.socketpair()
        self._writer.setblocking(False)
        self._fd = self._writer.fileno()
        self._pid = os.getpid()
        self.thread = threading.Thread(target=self._read, name="gangwatch-signals", daemon=True)

    @classmethod
    def start(cls, on_signal: Callable[[int], None]) -> _SignalWatch | None:
        """A watch holding the wakeup fd, its thread started (main thread only); None where the fd is someone
        else's already or cannot be set: the signal handlers alone say the stop then."""
        watch = cls(on_signal)
        try:
            old = signal.set_wakeup_fd(watch._fd, warn_on_full_buffer=False)
        except (ValueError, OSError, RuntimeError) as e:
            watch._close()
            log.info("gangwatch: no signal wakeup fd (%s): a stop is said once the main thread handles it", e)
            return None
        if old != -1:
            signal.set_wakeup_fd(old)  # theirs again (with the default warn_on_full_buffer, asyncio's own)
            watch._close()
            log.info("gangwatch: the signal wakeup fd is taken (fd %d, an asyncio loop?): a stop is said once the "
                     "main thread handles it", old)
            return None
        cls.current = watch
        watch.thread.start()
        return watch

    def stop(self) -> bool:
        """Give the wakeup fd back (-1) and end the thread, which closes the sockets; False off the main thread
        (only it may set the wakeup fd): the watch goes on, and its closed client says nothing. Where the fd is
        someone else's by now, theirs stays and ours stays open and read (they may put it back), as a closed
        client's."""
        if os.getpid() != self._pid:  # a forked child's copy: `_forget_in_child` did it
            return True
        try:
            old = signal.set_wakeup_fd(-1)
        except (ValueError, OSError, RuntimeError):
            return False
        if old != self._fd:
            signal.set_wakeup_fd(old)
            return True
        _SignalWatch.current = None
        try:
            self._reader.shutdown(socket.SHUT_RDWR)  # the thread's recv returns b""
        except OSError:
            pass
        if threading.current_thread() is not self.thread:
            self.thread.join(1.0)
        return True

    def _read(self) -> None:
        """The thread: each byte is a signal, until `stop` shuts the socket down. It must outlive anything
        `on_signal` raises: the C handler writes to this fd until the wakeup fd is given back."""
        try:
            while data := self._reader.recv(64):
                for signum in data:
                    try:
                        self._on_signal(signum)
                    except Exception:
                        log.exception("gangwatch: handling signal %d on the signal thread failed", signum)
        except OSError:
            pass
        finally:
            self._close()

    def _close(self) -> None:
        self._reader.close()
        self._writer.close()

    @classmethod
    def _forget_in_child(cls) -> None:
        """In a forked child, as the fork returns: the wakeup fd is the parent's socket, read by the parent's
        thread, which would take the child's SIGTERM for the rank's own and say a stop the rank never got. The
        child gives it up (its signals reach its Python handlers, which only pass them on in a child) and closes
        its copies of the sockets; the parent's are untouched."""
        watch, cls.current = cls.current, None
        if watch is None:
            return
        try:
            old = signal.set_wakeup_fd(-1)
            if old != watch._fd:  # someone else's: theirs stays
                signal.set_wakeup_fd(old)
                return
            watch._close()
        except (ValueError, OSError, RuntimeError):
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_SignalWatch._forget_in_child)


class Pause:
    """`with client.pause(reason):`: `pause` on entering, `resume` on leaving (see TrainerClient.pause)."""

    def __init__(self, client: TrainerClient, reason: str) -> None:
        self.client, self.reason = client, reason

    def __enter__(self) -> Pause:
        self.client.lifecycle("pause", self.reason)
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.lifecycle("resume", self.reason)


_FRAMEWORK_FIELDS = frozenset({"op", "seq", "pg", "peer"})  # what `event` passes as Framework's own fields


def default_spool_dir(launch: Launch) -> Path:
    """`<tmp>/gangwatch-spool/<job>/rank<rank>` (the job id made safe as a directory name)."""
    job = re.sub(r"[^A-Za-z0-9._-]", "_", launch.job)
    return Path(tempfile.gettempdir()) / "gangwatch-spool" / job / f"rank{launch.rank}"


def _detached(v: Any) -> Any:
    """A tensor without its autograd graph (holding the graph would keep the step's activations alive)."""
    return v.detach() if hasattr(v, "detach") else v


def _mono(t: float) -> float | None:
    """The monotonic clock's reading as a record's `mono` (None where a test's timer runs below zero)."""
    return round(t, 6) if t >= 0 else None


def _number(v: Any) -> float | None:
    """A Python float from a float, a numpy scalar or a one-element tensor (read here, on the sending thread)."""
    return None if v is None else float(v)


def metric_samples(client: TrainerClient) -> Iterator[metrics.Sample]:
    """What a `TrainerClient` reports: its identity, last step, queues, losses and its delivery's counts."""
    launch = client.launch
    yield metrics.TRAINER_INFO, (launch.job, str(launch.rank), str(launch.local_rank), launch.node), 1
    if client.last_step is not None:
        yield metrics.LAST_STEP, (), client.last_step
    for queue, n in client.queue_depths().items():
        yield metrics.QUEUE_DEPTH, (queue,), n
    yield metrics.DROPPED, (), client.dropped
    yield from metrics.delivery_samples([client.delivery])
    link = client.relay
    if link is not None:
        for outcome, n in (("accepted", link.accepted), ("refused", link.refused), ("failed", link.failed)):
            yield metrics.TRAINER_RELAY_RECORDS, (outcome,), n
        yield metrics.TRAINER_RELAY_CONNECTED, (), int(link.connected)
