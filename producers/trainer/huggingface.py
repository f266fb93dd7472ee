"""Hugging Face `Trainer`, one line: `Trainer(..., callbacks=[GangwatchCallback(tp=..., pp=...)])`.

The callback makes its `TrainerClient` in `on_train_begin` (torch.distributed
is initialised by then), with the rank and world size of `TrainingArguments`;
keyword arguments go to the client. Pass `client=` to use one you made
yourself (it is then yours to close).

Per optimizer step (`state.global_step`, the number of steps done):
`data_wait` is the time between steps, `compute` the time from
`on_step_begin` to `on_step_end` (forward, backward, optimizer; with DDP it
includes the gradient all-reduce), and every `digest_every` steps the
`replica_digest` of the model's parameters.

Loss and grad-norm: the Trainer does not show callbacks its per-step values,
only what it logs every `logging_steps` (the loss averaged since the last log,
and the pre-clipping gradient norm). On a step that logs, the step record
waits for `on_log` and carries both; other steps carry neither.

Checkpoints: the Trainer has no callback before a save, only `on_save` after
it. Its own flow callback (which runs before this one) decides in `on_step_end`
whether the step saves (`control.should_save`); when it does, this callback
opens `client.pause("checkpoint")` there, and `on_save` closes it once the
checkpoint is written. What falls inside is what the Trainer does between the
two: the step's logging, its evaluation when one is due on the same step, and
the save. A pause left open because the save was called off afterwards
(`save_strategy="best"` without a new best) closes at the next step or at the
end of training.
"""

from __future__ import annotations

from typing import Any

from gangwatch.producers.trainer.client import TrainerClient
from gangwatch.producers.trainer.digest import replica_digest
from transformers import TrainerCallback


class GangwatchCallback(TrainerCallback):
    """Reports every optimizer step of `Trainer.train` to gangwatch."""

    def __init__(self, client: TrainerClient | None = None, *, digest_every: int = 0, **client_options: Any) -> None:
        self.client, self.digest_every, self.client_options = client, digest_every, client_options
        self._owns_client = client is None
        self._pending: tuple[int, str | None] | None = None  # (step, digest) waiting for this step's on_log
        self._saving: Any = None  # the open `client.pause("checkpoint")` while a save is under way

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.client is None:
            where = {"rank": args.process_index, "world_size": args.world_size, "local_rank": args.local_process_index}
            self.client = TrainerClient(**{**where, **self.client_options})

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._report()
        self._resume()
        self.client.begin_step()
        self.client.section("compute").__enter__()

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self.client.section("compute").__exit__(None, None, None)
        step = state.global_step
        digest = None
        if self.digest_every and step % self.digest_every == 0 and model is not None:
            digest = replica_digest(model.parameters())
        self._pending = (step, digest)
        if not control.should_log:  # (set by the Trainer's own flow callback, which runs first)
            self._report()
        if control.should_save and self._saving is None:  # the Trainer saves next (after logging, evaluating)
            self._saving = self.client.pause("checkpoint")
            self._saving.__enter__()

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._resume()

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        logs = logs or {}
        self._report(loss=logs.get("loss"), grad_norm=logs.get("grad_norm"))

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._report()
        self._resume()
        if self._owns_client and self.client is not None:
            self.client.close()
            self.client = None

    def _resume(self) -> None:
        """Close the checkpoint pause, if one is open."""
        if self._saving is not None:
            saving, self._saving = self._saving, None
            saving.__exit__(None, None, None)

    def _report(self, **values: Any) -> None:
        """Send the finished step that is waiting, if any."""
        if self._pending is not None:
            step, digest = self._pending
            self._pending = None
            self.client.step(step, replica_digest=digest, **values)
