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

Faults, injected for tests through the environment on the process whose node
(`GANGWATCH_NODE`) and local rank match `FAULT_NODE` (a name, or several
separated by commas) / `FAULT_LOCAL_RANK` (0), from step `FAULT_STEP` on. A
fault belongs to the node: once the controller has replaced the node, the job
runs clean. Two kinds are not the node's: a code bug (`raise`) follows the
rank, whatever node it runs on (the process whose global `RANK` is
`FAULT_RANK`), in every attempt; a pause (`pause`, `pause_announced`) is the
whole job's: every rank takes it.

| `FAULT`           | what happens                                                                 |
|-------------------|------------------------------------------------------------------------------|
| `hang`            | the rank's DataLoader worker blocks forever producing that step's batch      |
| `slow`            | the rank's compute takes `FAULT_SLOW` (1.3) times as long: it sleeps the difference |
| `kill`            | the rank sends itself SIGKILL at the start of that step                      |
| `sdc`             | one weight of the rank's replica is changed after that step's update (silently) |
| `exit0`           | the rank calls `sys.exit(0)` at the start of that step: a clean exit, alone  |
| `raise`           | rank `FAULT_RANK` raises the same RuntimeError at that step, in every attempt |
| `pause`           | every rank sleeps `FAULT_PAUSE_S` (45) s before step `FAULT_STEP`, unannounced |
| `pause_announced` | the same inside `client.pause("checkpoint")`: a loop that says its pauses    |

Besides it, and in the first attempt only, `FAULT_LATE_NODE` names a node whose
local rank 0 starts up late on a loaded host: its telemetry is held back
`FAULT_LATE_S` (12) s after its first message (stamped on time, delivered
late: the `send=` of its client waits) and it joins the first collective only
after that, so the job's first step waits for it.
"""

from __future__ import annotations

import argparse
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
    return p.parse_args()


JOB_FAULTS = frozenset({"pause", "pause_announced"})  # every rank takes them
RANK_FAULTS = frozenset({"raise"})  # a code bug: the rank's, on whatever node it runs


class Fault:
    """The fault this process injects, read from the environment (none unless its node and local rank match, or
    its rank for a code bug; every process for a pause)."""

    def __init__(self, node: str, local_rank: int, rank: int) -> None:
        env = os.environ
        kind = env.get("FAULT", "")
        if kind in JOB_FAULTS:
            mine = True
        elif kind in RANK_FAULTS:
            mine = int(env.get("FAULT_RANK", "-1")) == rank
        else:
            mine = node in env.get("FAULT_NODE", "").split(",") and int(env.get("FAULT_LOCAL_RANK", "0")) == local_rank
        self.kind = kind if mine else ""
        first = not env.get("GANGWATCH_RESUME_FROM")
        self.late_s = float(env.get("FAULT_LATE_S", "12")) if first and local_rank == 0 and \
            node == env.get("FAULT_LATE_NODE") else 0.0
        self.step = int(env.get("FAULT_STEP", "0"))
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


def all_reduce_mean(params: list[torch.Tensor], world: int) -> None:
    """Average the gradients over all ranks in one collective (one flat buffer)."""
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat)
    flat /= world
    offset = 0
    for p in params:
        n = p.grad.numel()
        p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
        offset += n


def main() -> None:
    args = parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    node, local_rank = os.environ.get("GANGWATCH_NODE", ""), int(os.environ.get("LOCAL_RANK", "0"))
    fault = Fault(node, local_rank, rank)
    progress = Progress(rank)
    send = LateSend(fault.late_s) if fault.late_s else None  # (a fault: this rank's telemetry comes late)
    # gangwatch: rank 0 announces the topology (`send`: Kafka, unless the fault holds it back)
    client = TrainerClient(gpus=False, heartbeat_s=args.heartbeat, send=send)

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
    progress.mark("comm_ready", world=world)

    params = list(model.parameters())
    data = Batches(rank, step, args.batch, hang_at=fault.step if fault.kind == "hang" else None)
    loader = DataLoader(data, batch_size=None, num_workers=1, prefetch_factor=2)
    first = True
    for step, x, y in loader:
        if args.steps and step > args.steps:
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
                all_reduce_mean(params, world)
            s.grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params])  # gangwatch
            opt.step()
            if fault.kind == "sdc" and step == fault.step:
                with torch.no_grad():
                    params[0][0, 0] += 1e-3
            s.loss = loss  # gangwatch
            if step % args.digest_every == 0:
                s.replica_digest = replica_digest(params)  # gangwatch: the replicas vote on it
        if first:
            progress.mark("step", step=step)
            first = False
        if rank == 0 and step % args.ckpt_every == 0:
            with client.pause("checkpoint"):  # gangwatch: a synchronous save is a known pause, not a hang
                ckpts.save(step, model, opt)
    client.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
