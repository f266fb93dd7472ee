"""A tiny data-parallel training job on CPU, watched by gangwatch: what the reference controller drives in tests.

    torchrun --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:29400 \
        examples/tiny_job/train.py --steps 1000

Every rank trains the same small MLP on its own synthetic batches (gloo on CPU)
and averages gradients with one `all_reduce` after `backward()`: what DDP does,
written out, so that the time spent computing and the time spent waiting for
the other ranks can be timed apart (DDP overlaps them inside `backward()`).
Each step also sleeps `--device-time` seconds inside `compute`, standing in for
the accelerator's kernels: the job keeps a steady step rhythm on a busy 2-core
machine without burning the cores the monitoring stack needs.

What gangwatch needs from a training loop is the few lines marked `# gangwatch`:
a `TrainerClient` after `init_process_group`, a `step_context` per step with
`compute` and `comm_wait` sections, the loss, the gradient norm and, every few
steps, a `replica_digest` of the parameters for the silent-data-corruption vote.

Checkpoints and restarts follow the launcher's protocol (control/launcher.py):
rank 0 writes `step-NNNNNNNN.pt` to `GANGWATCH_CKPT_DIR` every `--ckpt-every`
steps (written to a temporary name, then renamed: a crash never leaves half a
checkpoint), inside `client.pause("checkpoint")`: a synchronous save is a known
pause, not a hang (`# gangwatch`); every rank resumes from `GANGWATCH_RESUME_FROM` when it is set;
rank 0 appends one JSON line per milestone (`ckpt_loaded`, `comm_ready`, then
`step` for the first step done) to `GANGWATCH_PROGRESS`, which is how the
controller learns, with real timestamps, how far a restart has come.

Replays (the controller's active diagnosis, control/trials.py): with
`GANGWATCH_REPLAY_STEPS` (or `--replay-steps`) set to N, the ranks run N steps
from `GANGWATCH_RESUME_FROM` and exit 0: no checkpoint written, no telemetry
sent (the replay is no run of the job). With `GANGWATCH_DIGEST_OUT` (or
`--one-step-digest OUT`) it is one step (unless N says more), on one thread,
after which rank 0 writes to OUT the sha256 (hex) of every rank's parameters,
in rank order: the batches are a pure function of (rank, step), so the same
checkpoint run on two healthy machines of the same rank count gives the same
digest, bit for bit.

Faults, injected for tests through the environment on the process whose node
(`GANGWATCH_NODE`) and local rank match `FAULT_NODE` (a name, or several
separated by commas) / `FAULT_LOCAL_RANK` (0), from step `FAULT_STEP` on. A
fault belongs to the node: once the controller has replaced the node, the job
runs clean. Two kinds are not the node's: a code bug (`raise`) follows the
rank, whatever node it runs on (the process whose global `RANK` is
`FAULT_RANK`), in every attempt; a pause (`pause`, `pause_announced`) is the
whole job's: every rank takes it. In a replay the node is tested after it
broke: its fault is there from the first step replayed, except the one-off
`sdc`, which does not recur; a job's pause is no machine's and is not replayed.

| `FAULT`           | what happens                                                                 |
|-------------------|------------------------------------------------------------------------------|
| `hang`            | the rank's DataLoader worker blocks forever producing that step's batch      |
| `slow`            | the rank's compute takes `FAULT_SLOW` (1.3) times as long: it sleeps the difference |
| `kill`            | the rank sends itself SIGKILL at the start of that step                      |
| `sdc`             | one weight of the rank's replica is changed after that step's update (silently) |
| `sdc_load`        | the same after every step's update from then on: a machine that corrupts under load |
| `hang_comm`       | the rank's gradient `all_reduce` never completes while its peers wait in the same |
|                   | one: every rank shows the same stack (it runs in a group with one peer that never |
|                   | joins it; every rank takes part in making that group at start-up, and a rank  |
|                   | alone has no peer to wait for, so it does nothing there)                      |
| `exit0`           | the rank calls `sys.exit(0)` at the start of that step: a clean exit, alone  |
| `raise`           | rank `FAULT_RANK` raises the same RuntimeError at that step, in every attempt |
| `pause`           | every rank sleeps `FAULT_PAUSE_S` (45) s before step `FAULT_STEP`, unannounced |
| `pause_announced` | the same inside `client.pause("checkpoint")`: a loop that says its pauses    |

Besides it, and in the first attempt only, `FAULT_LATE_NODE` names a node whose
local rank 0 starts up late on a loaded host: its telemetry is held back
`FAULT_LATE_S` (12) s after its first message (stamped on time, delivered
late: the `send=` of its client waits) and it joins the first collective only
after that, so the job's first step waits for it.

`FAULT_CLOCK_NODE` names a node whose clock is off by `FAULT_CLOCK_S` (30) s
(its NTP daemon died): every rank there stamps its records with that clock.
With `FAULT_CLOCK_AFTER_S` the clock is right until that many seconds after
the rank starts, then steps (an NTP step): its monotonic clock does not.
The training itself is untouched.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
from gangwatch.producers.trainer import TrainerClient, replica_digest
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

FEATURES = 32


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=0, help="stop after this step (0: run until stopped)")
    p.add_argument("--batch", type=int, default=16, help="samples per rank per step")
    p.add_argument("--hidden", type=int, default=64, help="width of the MLP")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--device-time", type=float, default=0.1, help="seconds per step standing in for the GPU")
    p.add_argument("--ckpt-every", type=int, default=10, help="steps between checkpoints")
    p.add_argument("--keep", type=int, default=100, help="checkpoints kept (the oldest are deleted)")
    p.add_argument("--digest-every", type=int, default=5, help="steps between replica digests")
    p.add_argument("--heartbeat", type=float, default=2.0, help="gangwatch heartbeat period, seconds")
    p.add_argument("--replay-steps", type=int, default=int(os.environ.get("GANGWATCH_REPLAY_STEPS") or 0),
                   help="a replay: run this many steps from GANGWATCH_RESUME_FROM, then exit 0 "
                   "(no checkpoint, no telemetry; default GANGWATCH_REPLAY_STEPS, 0: no replay)")
    p.add_argument("--one-step-digest", metavar="OUT", default=os.environ.get("GANGWATCH_DIGEST_OUT") or None,
                   help="a replay of one step (unless --replay-steps says more) after which rank 0 writes the "
                   "sha256 of every rank's parameters to OUT (default GANGWATCH_DIGEST_OUT)")
    args = p.parse_args()
    if args.one_step_digest and not args.replay_steps:
        args.replay_steps = 1
    return args


JOB_FAULTS = frozenset({"pause", "pause_announced"})  # every rank takes them
RANK_FAULTS = frozenset({"raise"})  # a code bug: the rank's, on whatever node it runs
ONE_OFF = frozenset({"sdc"})  # a node's fault that happens once: a replay does not see it again


class Fault:
    """The fault this process injects, read from the environment (none unless its node and local rank match, or
    its rank for a code bug; every process for a pause). In a `replay` a node's fault is there from the start."""

    def __init__(self, node: str, local_rank: int, rank: int, replay: bool = False) -> None:
        env = os.environ
        kind = env.get("FAULT", "")
        if kind in JOB_FAULTS:
            mine = True
        elif kind in RANK_FAULTS:
            mine = int(env.get("FAULT_RANK", "-1")) == rank
        else:
            mine = node in env.get("FAULT_NODE", "").split(",") and int(env.get("FAULT_LOCAL_RANK", "0")) == local_rank
        self.kind = kind if mine and not (replay and kind in JOB_FAULTS | ONE_OFF) else ""
        first = not env.get("GANGWATCH_RESUME_FROM")
        self.late_s = float(env.get("FAULT_LATE_S", "12")) if first and not replay and local_rank == 0 and \
            node == env.get("FAULT_LATE_NODE") else 0.0
        self.step = 0 if replay and kind not in RANK_FAULTS else int(env.get("FAULT_STEP", "0"))
        self.slow = float(env.get("FAULT_SLOW", "1.3"))
        self.pause_s = float(env.get("FAULT_PAUSE_S", "45"))

    def at(self, kind: str, step: int) -> bool:
        """Whether fault `kind` is active at `step` (from FAULT_STEP on)."""
        return self.kind == kind and step >= self.step


class LateSend:
    """A client's `send` that, once its first message went out, holds the next ones back for `late_s`: what the
    rank sends meanwhile is stamped on time and delivered late (a loaded host's sending thread, a slow network
    path at start-up). `released` is set when the hold is over."""

    def __init__(self, late_s: float) -> None:
        from gangwatch.producers.trainer.delivery import KafkaSend

        self.kafka = KafkaSend(os.environ["GANGWATCH_BOOTSTRAP"])
        self.late_s, self.until = late_s, None
        self.released = threading.Event()

    def __call__(self, topic: str, key: bytes, value: bytes) -> None:
        if self.until is not None:
            time.sleep(max(0.0, self.until - time.monotonic()))
            self.released.set()
        self.kafka(topic, key, value)
        if self.until is None:
            self.until = time.monotonic() + self.late_s

    def close(self) -> None:
        self.kafka.close()


class Batches(IterableDataset):
    """Synthetic regression batches, a pure function of (rank, step): a resumed run sees the same data."""

    def __init__(self, rank: int, first_step: int, batch: int, hang_at: int | None) -> None:
        self.rank, self.first_step, self.batch, self.hang_at = rank, first_step, batch, hang_at
        self.target = torch.Generator().manual_seed(1234)
        self.w = torch.randn(FEATURES, 1, generator=self.target)

    def __iter__(self):
        step = self.first_step
        while True:
            if self.hang_at is not None and step >= self.hang_at:
                threading.Event().wait()  # the worker blocks for good, as on a dead file system mount
            g = torch.Generator().manual_seed(self.rank * 1_000_003 + step)
            x = torch.randn(self.batch, FEATURES, generator=g)
            y = x @ self.w + 0.1 * torch.randn(self.batch, 1, generator=g)
            yield step, x, y
            step += 1


def mlp(hidden: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, 1))


class Checkpoints:
    """`step-NNNNNNNN.pt` files in one directory, written by rank 0, atomically."""

    def __init__(self, directory: str, keep: int) -> None:
        self.dir = Path(directory)
        self.keep = keep

    def save(self, step: int, model: nn.Module, opt: torch.optim.Optimizer) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        final = self.dir / f"step-{step:08d}.pt"
        tmp = final.with_suffix(".tmp")
        torch.save({"step": step, "model": model.state_dict(), "optimizer": opt.state_dict()}, tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, final)
        for old in sorted(self.dir.glob("step-*.pt"))[:-self.keep]:
            old.unlink(missing_ok=True)

    @staticmethod
    def load(path: str, model: nn.Module, opt: torch.optim.Optimizer) -> int:
        """Load a checkpoint; returns the step it was written after."""
        state = torch.load(path, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        return int(state["step"])


class Progress:
    """Rank 0's milestones as JSON lines in GANGWATCH_PROGRESS (the launcher reads them); other ranks write none."""

    def __init__(self, rank: int) -> None:
        path = os.environ.get("GANGWATCH_PROGRESS")
        self.path = Path(path) if path and rank == 0 else None

    def mark(self, event: str, **fields: object) -> None:
        if self.path is not None:
            with open(self.path, "a") as fh:
                fh.write(json.dumps({"ts": time.time(), "event": event, **fields}) + "\n")


def all_reduce_mean(params: list[torch.Tensor], world: int, group: dist.ProcessGroup | None = None) -> None:
    """Average the gradients over all ranks in one collective (one flat buffer); `group` other than the whole job
    only for the `hang_comm` fault."""
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat, group=group)
    flat /= world
    offset = 0
    for p in params:
        n = p.grad.numel()
        p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
        offset += n


def stuck_group(fault: Fault, rank: int, world: int) -> dist.ProcessGroup | None:
    """For `hang_comm`: a group of each faulty rank and one peer (a healthy one if any) that never calls a
    collective on it, so the faulty rank's all_reduce there never completes. Every rank must call this (making a
    group is collective); the faulty rank gets its group, the others None."""
    faulty: list[bool] = [False] * world
    dist.all_gather_object(faulty, fault.kind == "hang_comm")
    mine = None
    for bad in (r for r in range(world) if faulty[r]):
        peers = [r for r in range(world) if not faulty[r]] or [r for r in range(world) if r != bad]
        if peers:
            group = dist.new_group(sorted({bad, peers[0]}))
            mine = group if rank == bad else mine
    return mine


def params_digest(params: list[torch.Tensor]) -> str:
    """sha256 (hex) of the parameters' bytes, in order."""
    h = hashlib.sha256()
    for p in params:
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def write_digest(path: str, params: list[torch.Tensor], rank: int, world: int) -> None:
    """Rank 0 writes the sha256 (hex) of every rank's parameter digest in rank order (one corrupt replica changes
    it), atomically. Every rank must call this (a collective)."""
    each: list[str | None] = [None] * world
    dist.all_gather_object(each, params_digest(params))
    if rank == 0:
        out = Path(path)
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(hashlib.sha256("".join(map(str, each)).encode()).hexdigest() + "\n")
        os.replace(tmp, out)


def quiet_client(heartbeat_s: float) -> TrainerClient:
    """A replay's client: the loop's calls as in training, nothing sent (a replay is no run of the job)."""
    return TrainerClient(gpus=False, heartbeat_s=heartbeat_s, send=lambda topic, key, value: None, announce=False,
                         background=False, exit_hooks=False, metrics_port=0)


def main() -> None:
    args = parse_args()
    replay = args.replay_steps > 0
    if args.one_step_digest:
        torch.set_num_threads(1)  # the same reduction order on any machine: digests compare bit for bit
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    node, local_rank = os.environ.get("GANGWATCH_NODE", ""), int(os.environ.get("LOCAL_RANK", "0"))
    fault = Fault(node, local_rank, rank, replay=replay)
    progress = Progress(rank)
    send = LateSend(fault.late_s) if fault.late_s else None  # (a fault: this rank's telemetry comes late)
    # gangwatch: rank 0 announces the topology (`send`: Kafka, unless the fault holds it back)
    skew = float(os.environ.get("FAULT_CLOCK_S", "30")) if node == os.environ.get("FAULT_CLOCK_NODE") else 0.0
    skew_from = time.monotonic() + float(os.environ.get("FAULT_CLOCK_AFTER_S", "0"))
    client = quiet_client(args.heartbeat) if replay else TrainerClient(
        gpus=False, heartbeat_s=args.heartbeat, send=send,
        clock=(lambda: time.time() + (skew if time.monotonic() >= skew_from else 0.0)) if skew else time.time)

    model = mlp(args.hidden)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    ckpts = Checkpoints(os.environ.get("GANGWATCH_CKPT_DIR", "checkpoints"), args.keep)
    step = 0
    resume = os.environ.get("GANGWATCH_RESUME_FROM")
    if resume:
        step = Checkpoints.load(resume, model, opt) + 1
        progress.mark("ckpt_loaded", step=step - 1, ckpt=resume)
    if send is not None:  # (a fault: this rank starts up late, and the job's first step waits for it)
        send.released.wait(fault.late_s + 60.0)
        time.sleep(1.0)
    for p in model.parameters():  # every replica starts from rank 0's weights
        dist.broadcast(p.data, src=0)
    stuck = stuck_group(fault, rank, world) if os.environ.get("FAULT") == "hang_comm" else None
    progress.mark("comm_ready", world=world)

    params = list(model.parameters())
    data = Batches(rank, step, args.batch, hang_at=fault.step if fault.kind == "hang" else None)
    loader = DataLoader(data, batch_size=None, num_workers=1, prefetch_factor=2)
    first = True
    last = step + args.replay_steps - 1 if replay else args.steps or None  # None: until stopped
    for step, x, y in loader:
        if last is not None and step > last:
            break
        if fault.at("kill", step):
            os.kill(os.getpid(), signal.SIGKILL)
        if fault.at("exit0", step):
            sys.exit(0)  # a clean exit while the others train on
        if fault.at("raise", step):
            raise RuntimeError(f"shape mismatch in the loss at step {fault.step}: a bug in the training code")
        if fault.kind == "pause" and step == fault.step:
            time.sleep(fault.pause_s)  # the whole job stops stepping for a while and says nothing
        if fault.kind == "pause_announced" and step == fault.step:
            with client.pause("checkpoint"):  # gangwatch: a known pause (a long synchronous save)
                time.sleep(fault.pause_s)
        with client.step_context(step) as s:  # gangwatch: one step; the loader's wait counts as data_wait
            with client.section("compute"):  # gangwatch
                t0 = time.perf_counter()
                opt.zero_grad()
                loss = nn.functional.mse_loss(model(x), y)
                loss.backward()
                time.sleep(args.device_time)
                if fault.at("slow", step):
                    time.sleep((fault.slow - 1.0) * (time.perf_counter() - t0))
            with client.section("comm_wait"):  # gangwatch
                all_reduce_mean(params, world, stuck if fault.at("hang_comm", step) else None)
            s.grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params])  # gangwatch
            opt.step()
            if (fault.kind == "sdc" and step == fault.step) or fault.at("sdc_load", step):
                with torch.no_grad():
                    params[0][0, 0] += 1e-3
            s.loss = loss  # gangwatch
            if step % args.digest_every == 0:
                s.replica_digest = replica_digest(params)  # gangwatch: the replicas vote on it
        if first:
            progress.mark("step", step=step)
            first = False
        if rank == 0 and step % args.ckpt_every == 0 and not replay:
            with client.pause("checkpoint"):  # gangwatch: a synchronous save is a known pause, not a hang
                ckpts.save(step, model, opt)
    if args.one_step_digest:
        write_digest(args.one_step_digest, params, rank, world)
    client.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
