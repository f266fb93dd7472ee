"""A plain training loop, one line: `with client.step_context(step) as s:`.

    for step, batch in enumerate(loader):
        with client.step_context(step) as s:
            with client.section("compute"):
                loss = model(batch).sum()
                loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            s.loss = loss

On entry the time since the previous step ended is counted as `data_wait` (in
this loop, the loader's `next()`); on a normal exit the step is reported with
whatever was set on `s` (`loss`, `grad_norm`, `replica_digest`). A step whose
body raises is not reported: the exception goes on up to the training code.
"""

from __future__ import annotations

from typing import Any, Protocol


class StepReporter(Protocol):
    """What the loop and the optimizer hook call on the trainer client (`TrainerClient` is one)."""

    def begin_step(self) -> None: ...

    def step(self, step: int, *, loss: Any = None, grad_norm: Any = None, replica_digest: str | None = None,
             **extra: Any) -> None: ...


class StepContext:
    """One step of a plain loop; set `loss`, `grad_norm`, `replica_digest` inside to report them."""

    __slots__ = ("client", "step", "loss", "grad_norm", "replica_digest")

    def __init__(self, client: StepReporter, step: int) -> None:
        self.client, self.step = client, step
        self.loss: Any = None
        self.grad_norm: Any = None
        self.replica_digest: str | None = None

    def __enter__(self) -> StepContext:
        self.client.begin_step()
        return self

    def __exit__(self, etype: type[BaseException] | None, *exc: object) -> None:
        if etype is None:
            self.client.step(self.step, loss=self.loss, grad_norm=self.grad_norm, replica_digest=self.replica_digest)
