"""PyTorch Lightning, one line: `Trainer(callbacks=[GangwatchCallback(tp=..., pp=...)])`.

The callback makes its `TrainerClient` in `setup` (Lightning has initialised
torch.distributed by then, so rank 0 learns every rank's node), with the rank
and world size Lightning knows; keyword arguments go to the client. Pass
`client=` to use one you made yourself (it is then yours to close).

Per optimizer step (`trainer.global_step`, the number of steps done):
`data_wait` is the time between steps, `compute` the time inside the training
batches (forward, backward and optimizer; with DDP it includes the gradient
all-reduce that overlaps the backward), `loss` what `training_step` returned
(the last micro-batch's with gradient accumulation), `grad_norm` the norm
before clipping (`on_before_optimizer_step`), and every `digest_every` steps
the `replica_digest` of the module's parameters.

Checkpoints: every save through `trainer.save_checkpoint` (what ModelCheckpoint
and a user's own call do; on every rank, since the save is a collective) runs
inside `client.pause("checkpoint")`, so the ranks' silence while a synchronous
save writes is a known pause, not a hang. Lightning's `on_save_checkpoint` hook
only sees the checkpoint dict being built, not the write, so the callback wraps
the trainer's `save_checkpoint` from `setup` to `teardown` instead.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

try:
    from lightning.pytorch import Callback
except ImportError:  # the older package name
    from pytorch_lightning import Callback

from gangwatch.producers.trainer.client import TrainerClient
from gangwatch.producers.trainer.digest import grad_norm, replica_digest


class GangwatchCallback(Callback):
    """Reports every optimizer step of `Trainer.fit` to gangwatch."""

    def __init__(self, client: TrainerClient | None = None, *, digest_every: int = 0, **client_options: Any) -> None:
        self.client, self.digest_every, self.client_options = client, digest_every, client_options
        self._owns_client = client is None
        self._steps_before: int | None = None  # trainer.global_step when the open step began
        self._grad_norm = None
        self._wrapped: Any = None  # the trainer whose save_checkpoint is bracketed

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self.client is None and stage == "fit":
            where = {"rank": trainer.global_rank, "world_size": trainer.world_size, "local_rank": trainer.local_rank,
                     "local_world_size": trainer.num_devices}
            self.client = TrainerClient(**{**where, **self.client_options})
        if self.client is not None and "save_checkpoint" not in vars(trainer):
            self._bracket_saves(trainer)

    def _bracket_saves(self, trainer: Any) -> None:
        """`trainer.save_checkpoint` inside `client.pause("checkpoint")` (an instance attribute over the method)."""
        save = trainer.save_checkpoint

        @functools.wraps(save)
        def paused_save(*args: Any, **kwargs: Any) -> Any:
            if self.client is None:
                return save(*args, **kwargs)
            with self.client.pause("checkpoint"):
                return save(*args, **kwargs)

        trainer.save_checkpoint = paused_save
        self._wrapped = trainer

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self._steps_before is None:  # the first micro-batch of an optimizer step
            self.client.begin_step()
            self._steps_before = trainer.global_step
        self.client.section("compute").__enter__()

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        self._grad_norm = grad_norm(pl_module.parameters())

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.client.section("compute").__exit__(None, None, None)
        step = trainer.global_step
        if step == self._steps_before:  # accumulating gradients: the optimizer has not stepped yet
            return
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if loss is not None and trainer.accumulate_grad_batches > 1:  # Lightning hands it over divided by that
            loss = loss * trainer.accumulate_grad_batches
        digest = None
        if self.digest_every and step % self.digest_every == 0:
            digest = replica_digest(pl_module.parameters())
        self.client.step(step, loss=loss, grad_norm=self._grad_norm, replica_digest=digest)
        self._steps_before, self._grad_norm = None, None

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self._wrapped is not None:
            vars(self._wrapped).pop("save_checkpoint", None)  # the method shows again
            self._wrapped = None
        if self._owns_client and self.client is not None:
            self.client.close()
            self.client = None
